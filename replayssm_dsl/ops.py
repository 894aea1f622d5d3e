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
_log = _unary("LOG")
sqrt = _unary("SQRT")
rsqrt = _unary("RSQRT")
softplus = _unary("SOFTPLUS")
sigmoid = _unary("SIGMOID")
logsigmoid = _unary("LOGSIGMOID")
silu = _unary("SILU")


def log(x) -> Expr:
    """Elementwise log; ``log(sigmoid(x))`` is built as ``logsigmoid(x)``, its finite form (float32's
    sigmoid is 0 below x ≈ −88, where the log would be −inf)."""
    x = as_expr(x)
    return logsigmoid(x.src[0]) if x.op == "SIGMOID" else _log(x)


def l2norm(x, eps: float = 1e-6) -> Expr:
    """``x / sqrt(sum(x²) + eps)`` along the vector's axis (FLA's ``l2norm`` convention). The lowering
    renders it over K only (keys, queries, vector decays): over V it is refused by ``lower``."""
    x = as_expr(x)
    try:
        value = float(eps) if not isinstance(eps, (bool, str)) else None  # NumPy floats too
    except (TypeError, ValueError):
        value = None
    if value is None or not 0.0 < value < float("inf"):
        raise DeclarationError(f"l2norm eps must be a finite number > 0 (it keeps a zero vector's norm "
                               f"from 0 and the result in [-1, 1]), got {eps!r}")
    eps = value
    if x.axis not in ("K", "V"):
        raise DeclarationError(f"l2norm needs a vector over K or V, got an expression with axis "
                               f"{x.axis or 'scalar'!r}: {x!r}")
    return Expr.make("L2NORM", (x,), float(eps))


__all__ = ["exp", "log", "sqrt", "rsqrt", "softplus", "sigmoid", "logsigmoid", "silu", "l2norm"]
