"""DSL layer tests: a declaration's numbers stay numbers. A decay may not take sqrt, rsqrt, log or a
fractional power of an argument that can leave the function's domain (the g ≤ 0 proof holds only
where the decay is defined); ``log(sigmoid(x))`` is built as its finite form; ``l2norm``'s eps is a
finite positive number; and expressions cannot be compared, as conditions are not part of the DSL.

May import: NumPy, pytest, ``replayssm_dsl``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from replayssm_dsl import DeclarationError, Recurrence, ops, plain
from replayssm_dsl.bounds import value_range


def _qkv(r: Recurrence):
    return r.token("q", per="group", size="K"), r.token("k", per="group", size="K"), r.token("v", size="V")


def raises(*fragments):
    """A ``DeclarationError`` whose message holds every fragment, literally."""
    return pytest.raises(DeclarationError, match="(?s)" + "".join(f"(?=.*{re.escape(f)})" for f in fragments))


@pytest.mark.parametrize("make, text, why", [
    (lambda r: -ops.sqrt(r.token("g")), "sqrt(g)", "g can be negative"),
    (lambda r: -ops.rsqrt(r.token("g")), "rsqrt(g)", "g can be 0 or negative"),
    (lambda r: -ops.rsqrt(ops.softplus(r.token("g"))), "rsqrt(softplus(g))", "softplus(g) can be 0 or negative"),
    (lambda r: ops.log(ops.sigmoid(r.token("g")) - 0.5), "log((sigmoid(g) - 0.5))", "can be 0 or negative"),
    (lambda r: ops.log(ops.softplus(r.token("g"))), "log(softplus(g))", "softplus(g) can be 0 or negative"),
    (lambda r: -(r.token("g") ** 1.5), "g**1.5", "g can be negative"),
    (lambda r: -ops.sqrt(r.param("p")) * ops.softplus(r.token("g")), "sqrt(p)", "p can be negative; bound the "
     "argument, e.g. softplus(...), exp(...) or a param declared sign='nonnegative'"),
    (lambda r: ops.log(r.param("p", sign="nonnegative")) * ops.softplus(r.token("g")), "log(p)",
     "p can be 0 or negative; bound the argument, e.g. softplus(...) + a positive constant"),
], ids=["sqrt", "rsqrt", "rsqrt-at-0", "log-shifted", "log-at-0", "fractional-power", "sqrt-param", "log-nonneg-param"])
def test_a_decay_outside_a_function_domain_is_refused(make, text, why):
    """-sqrt(g) is ≤ 0 wherever it is defined, and NaN where g < 0: the sign proof cannot see that, so
    each function's argument must stay in its domain (NaN records would reach every later output)."""
    r = Recurrence("domains")
    q, k, v = _qkv(r)
    with raises(f"decay: {text} is not a number where", why):
        r.build(decay=make(r), key=k, query=q, write=plain(v))


@pytest.mark.parametrize("make", [
    lambda r: -ops.sqrt(ops.softplus(r.token("g"))),
    lambda r: -ops.rsqrt(ops.softplus(r.token("g")) + 1.0),
    lambda r: -ops.sqrt(r.param("p", sign="nonnegative")) * ops.softplus(r.token("g")),
    lambda r: -(ops.softplus(r.token("g")) ** 1.5),
    lambda r: ops.log(ops.sigmoid(r.token("g"))),
], ids=["sqrt-softplus", "rsqrt-shifted", "sqrt-nonneg-param", "fractional-power", "log-sigmoid"])
def test_a_decay_inside_every_domain_builds(make):
    r = Recurrence("domains")
    q, k, v = _qkv(r)
    decl = r.build(decay=make(r), key=k, query=q, write=plain(v))
    assert value_range(decl.decay)[1] <= 0.0


def test_log_of_a_sigmoid_is_built_as_logsigmoid():
    """float32's sigmoid is 0 below x ≈ −88, where log(sigmoid(x)) would be −inf: it is logsigmoid."""
    g = Recurrence("log").token("g")
    assert ops.log(ops.sigmoid(g)) is ops.logsigmoid(g)
    assert ops.log(ops.softplus(g)).op == "LOG"


def test_l2norm_takes_numpy_floats_as_eps():
    k = Recurrence("norm").token("k", size="K")
    assert ops.l2norm(k, eps=np.finfo(np.float32).eps).arg == float(np.finfo(np.float32).eps)


@pytest.mark.parametrize("eps", [-0.5, 0, 0.0, float("nan"), float("inf"), True, "1e-6", None])
def test_l2norm_eps_must_be_a_finite_positive_number(eps):
    """A negative eps lifts l2norm past [-1, 1], where the decay's bound and the scaled keys' overflow
    proof assume it stays: ``l2norm(gk, eps=-0.5) - 1`` reached +1.14."""
    k = Recurrence("norm").token("k", size="K")
    with raises("l2norm eps must be a finite number > 0", f"got {eps!r}"):
        ops.l2norm(k, eps=eps)


@pytest.mark.parametrize("compare", [lambda a: a > 0, lambda a: a <= 1.0, lambda a: 0 < a, lambda a: a >= a])
def test_comparing_expressions_is_refused_as_a_condition(compare):
    a = Recurrence("cmp").token("a")
    with raises("cannot be compared", "conditions are not part of the DSL"):
        compare(a)
