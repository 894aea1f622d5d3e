"""DSL layer tests: expressions built with Python's operators mean what they say.

The interval analysis and the evaluator read the same nodes, so an operator that built its node
with the operands swapped would pass every range property; these tests compare with NumPy directly.
"""

from __future__ import annotations

import numpy as np
import pytest

from replayssm_dsl import ModelShape, Recurrence, ops
from replayssm_dsl.bounds import value_range
from replayssm_dsl.evaluate import evaluate
from replayssm_dsl.expr import render_text

_r = Recurrence("operators")
X = _r.token("x", size="K")
XS = np.array([-3.0, -0.5, 0.25, 2.0, 7.0])

CASES = [  # (expression, what NumPy computes, its text)
    (2.0 - X, lambda x: 2.0 - x, "(2.0 - x)"),
    (X - 2.0, lambda x: x - 2.0, "(x - 2.0)"),
    (2.0 / X, lambda x: 2.0 / x, "(2.0 / x)"),
    (X / 2.0, lambda x: x / 2.0, "(x / 2.0)"),
    (3.0 + X, lambda x: 3.0 + x, "(3.0 + x)"),
    (3.0 * X, lambda x: 3.0 * x, "(3.0 * x)"),
    (-X, lambda x: -x, "-x"),
    (X ** 3, lambda x: x ** 3, "x**3"),
    (X ** -1, lambda x: 1.0 / x, "x**-1"),
]


@pytest.mark.parametrize("expr,want,text", CASES, ids=[c[2] for c in CASES])
def test_operators_evaluate_as_numpy_does(expr, want, text):
    shape = ModelShape(1, 1, 1, len(XS))
    got = np.asarray(evaluate(expr, {"x": XS.reshape(1, 1, -1)}, shape, "head")).ravel()
    np.testing.assert_allclose(got, want(XS), rtol=1e-15, atol=0)
    assert render_text(expr).replace(" ", "") == text.replace(" ", "")


def test_reflected_operators_have_the_ranges_of_their_order():
    s = ops.sigmoid(X)  # [0, 1]
    assert value_range(2.0 - s) == (1.0, 2.0)
    assert value_range(s - 2.0) == (-2.0, -1.0)
    assert value_range(1.0 / (1.0 + s)) == (0.5, 1.0)
    assert value_range((1.0 + s) / 4.0) == (0.25, 0.5)
