"""DSL layer: the interval an expression's values lie in, for any finite inputs (interval arithmetic).

``value_range(expr)`` returns ``(lo, hi)`` with ``lo ≤ value ≤ hi`` for every element, ``±inf`` where
nothing bounds it. Inputs and parameters are unbounded except for their declared sign; the functions'
ranges follow from their monotone pieces (``sigmoid`` in [0, 1], ``l2norm`` in [−1, 1], ...). The
lowering asks it for the lowest log-decay one token can bring (``Declaration.decay_lower_bound``):
a gate such as FLA's safe gate, ``lower_bound · sigmoid(…)``, is bounded, Kimi's
``−exp(A_log) · softplus(…)`` is not. The bounds are sound, not tight. Imports ``expr`` only.
"""

from __future__ import annotations

import math

from .expr import Expr

INF = math.inf
SILU_MIN = -0.2784645427610738  # min over x of x·sigmoid(x), at x ≈ −1.2785


def _product(a: float, b: float) -> float:
    """An endpoint product where 0 · ±inf is 0 (the other factor's bound is reached only in the limit)."""
    return 0.0 if a == 0.0 or b == 0.0 else a * b


def _mul(a: tuple, b: tuple) -> tuple:
    ends = [_product(x, y) for x in a for y in b]
    return min(ends), max(ends)


def _div(a: tuple, b: tuple) -> tuple:
    if b[0] <= 0.0 <= b[1]:
        return -INF, INF  # a divisor that may be 0 (or reach it) bounds nothing
    return _mul(a, (1.0 / b[1], 1.0 / b[0]))


def _monotone(f, lo: float, hi: float) -> tuple:
    return f(lo), f(hi)


def _exp(x: float) -> float:
    return 0.0 if x == -INF else INF if x > 709.0 else math.exp(x)


def _softplus(x: float) -> float:
    return 0.0 if x == -INF else x if x > 30.0 else math.log1p(math.exp(x))


def _sigmoid(x: float) -> float:
    return 0.0 if x < -709.0 else 1.0 if x > 709.0 else 1.0 / (1.0 + math.exp(-x))


def _logsigmoid(x: float) -> float:
    return x if x < -30.0 else -_softplus(-x)


def _log(x: float) -> float:
    return -INF if x <= 0.0 else math.log(x)


def _silu(x: float) -> float:
    return 0.0 if x == -INF else x * _sigmoid(x)


def _sign_range(sign: str) -> tuple:
    return {"nonpositive": (-INF, 0.0), "nonnegative": (0.0, INF)}.get(sign, (-INF, INF))


def _node_range(n: Expr, r: dict) -> tuple:
    s = [r[id(x)] for x in n.src]
    if n.op == "CONST":
        return n.arg, n.arg
    if n.op in ("INPUT", "PARAM", "DIM"):
        return _sign_range(n.sign)
    if n.op == "NEG":
        return -s[0][1], -s[0][0]
    if n.op == "ADD":
        return s[0][0] + s[1][0], s[0][1] + s[1][1]
    if n.op == "SUB":
        return s[0][0] - s[1][1], s[0][1] - s[1][0]
    if n.op == "MUL":
        return _mul(s[0], s[1])
    if n.op == "DIV":
        return _div(s[0], s[1])
    if n.op == "EXP":
        return _monotone(_exp, *s[0])
    if n.op == "SOFTPLUS":
        return _monotone(_softplus, *s[0])
    if n.op == "SIGMOID":
        return _monotone(_sigmoid, *s[0])
    if n.op == "LOGSIGMOID":
        return _monotone(_logsigmoid, *s[0])
    if n.op == "LOG":
        return _monotone(_log, *s[0])
    if n.op == "SQRT":
        return _monotone(lambda x: math.sqrt(max(x, 0.0)), *s[0])
    if n.op == "SILU":
        lo, hi = s[0]
        return (SILU_MIN if lo <= -1.2785 <= hi else min(_silu(lo), _silu(hi)), max(_silu(lo), _silu(hi)))
    if n.op == "L2NORM":
        return -1.0, 1.0
    return _sign_range(n.sign)  # RSQRT, POW: only their sign


def value_range(expr: Expr) -> tuple[float, float]:
    """``(lo, hi)`` bounding every value of ``expr`` over all finite inputs (``±inf``: unbounded)."""
    ranges: dict[int, tuple] = {}
    for node in expr.walk():
        lo, hi = _node_range(node, ranges)
        sign_lo, sign_hi = _sign_range(node.sign)  # the sign facts hold too; keep the tighter of both
        ranges[id(node)] = (max(lo, sign_lo), min(hi, sign_hi))
    return ranges[id(expr)]
