"""DSL layer: the functions a declaration may apply to inputs (``ops.softplus(dt + dt_bias)``, ...).

Each returns an interned ``Expr``; see ``expr.py`` for the node and its static facts.
"""

from __future__ import annotations

from .errors import DeclarationError
from .expr import Expr, as_expr


def _unary(op: str):
    def apply(x) -> Expr:
        return Expr.make(op, (as_expr(x),))

    apply.__name__ = op.lower()
    apply.__doc__ = f"Elementwise {op.lower()}."
    return apply


exp = _unary("EXP")
log = _unary("LOG")
sqrt = _unary("SQRT")
rsqrt = _unary("RSQRT")
softplus = _unary("SOFTPLUS")
sigmoid = _unary("SIGMOID")
logsigmoid = _unary("LOGSIGMOID")
silu = _unary("SILU")


def l2norm(x, eps: float = 1e-6) -> Expr:
    """``x / sqrt(sum(x²) + eps)`` along the vector's axis (FLA's ``l2norm`` convention)."""
    x = as_expr(x)
    if x.axis not in ("K", "V"):
        raise DeclarationError(f"l2norm needs a vector over K or V, got an expression with axis "
                               f"{x.axis or 'scalar'!r}: {x!r}")
    return Expr.make("L2NORM", (x,), float(eps))


__all__ = ["exp", "log", "sqrt", "rsqrt", "softplus", "sigmoid", "logsigmoid", "silu", "l2norm"]
