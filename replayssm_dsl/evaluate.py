"""DSL layer: the executable meaning of an expression, in NumPy (the living definition of ``Expr``).

Values are carried in a canonical form ``[..., heads, n]``: ``n = 1`` for a scalar per head, ``K`` or
``V`` for a vector; the leading ``...`` are batch/time axes. Group-level values are repeated to the
value heads of their group when combined with head-level ones (value head ``hv`` uses key head
``hv // (HV / H)``, the GVA convention of FLA and vLLM).
"""

from __future__ import annotations

import numpy as np

from .config import ModelShape
from .declaration import Declaration
from .expr import Expr


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


UNARY = {
    "NEG": np.negative,
    "EXP": np.exp,
    "LOG": np.log,
    "SQRT": np.sqrt,
    "RSQRT": lambda x: 1.0 / np.sqrt(x),
    "SOFTPLUS": lambda x: np.logaddexp(0.0, x),
    "SIGMOID": _sigmoid,
    "LOGSIGMOID": lambda x: -np.logaddexp(0.0, -x),
    "SILU": lambda x: x * _sigmoid(x),
}
BINARY = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide}


def canonical(value: np.ndarray, axis: str) -> np.ndarray:
    """Add the trailing length-1 axis that scalars-per-head carry in the canonical form."""
    return value[..., None] if axis == "" else value


def _to_level(value: np.ndarray, from_level: str, to_level: str, shape: ModelShape) -> np.ndarray:
    if from_level == to_level or from_level == "shared":
        return value
    if from_level == "group" and to_level == "head":
        return np.repeat(value, shape.group_size, axis=-2)
    raise ValueError(f"cannot evaluate a {from_level}-level value at {to_level} level")


def evaluate(node: Expr, values: dict[str, np.ndarray], shape: ModelShape, level: str | None = None,
             dtype=np.float64) -> np.ndarray:
    """Evaluate ``node`` on ``values`` (inputs by name, user layout); result ``[..., heads, n]``.

    ``level`` picks the heads axis of the result: ``"head"`` (HV) or ``"group"`` (H); by default the
    node's own level (``"shared"`` results broadcast to one head).
    """
    memo: dict[int, tuple[np.ndarray, str]] = {}
    for n in node.walk():
        if n.op in ("INPUT", "PARAM"):
            out, lvl = canonical(np.asarray(values[n.arg], dtype=dtype), n.axis), n.level
        elif n.op == "CONST":
            out, lvl = np.full((1, 1), n.arg, dtype=dtype), "shared"
        elif n.op == "DIM":
            out, lvl = np.full((1, 1), {"K": shape.k_dim, "V": shape.v_dim}[n.arg], dtype=dtype), "shared"
        elif n.op in UNARY:
            (x, lvl), = [memo[id(s)] for s in n.src]
            out = UNARY[n.op](x)
        elif n.op == "POW":
            x, lvl = memo[id(n.src[0])]
            out = np.power(x, n.arg)
        elif n.op == "L2NORM":
            x, lvl = memo[id(n.src[0])]
            out = x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + n.arg)
        elif n.op in BINARY:
            (a, la), (b, lb) = [memo[id(s)] for s in n.src]
            lvl = max(la, lb, key=("shared", "group", "head").index)
            out = BINARY[n.op](_to_level(a, la, lvl, shape), _to_level(b, lb, lvl, shape))
        else:  # pragma: no cover - the builder creates no other op
            raise ValueError(f"unknown op {n.op}")
        memo[id(n)] = (out, lvl)
    out, lvl = memo[id(node)]
    target = level or lvl
    out = _to_level(out, lvl, target, shape)
    if lvl == "shared" and target != "shared":
        heads = shape.heads if target == "head" else shape.key_heads
        out = np.broadcast_to(out, out.shape[:-2] + (heads, out.shape[-1]))
    return out


def evaluate_fields(decl: Declaration, values: dict[str, np.ndarray], shape: ModelShape,
                    dtype=np.float64) -> dict[str, np.ndarray]:
    """Every field of ``decl`` in canonical form at value-head level, plus ``key_stored`` at the level
    the records keep keys (per key head when the key is shared by a group)."""
    token = next(s for s in decl.inputs if s.kind == "token")
    lead = np.shape(values[token.name])[:np.ndim(values[token.name]) - 1 - bool(token.size)]

    def full(node: Expr, level: str) -> np.ndarray:  # parameters-only fields get the token axes too
        value = evaluate(node, values, shape, level, dtype)
        return np.broadcast_to(value, lead + value.shape[-2:])

    out = {role: full(node, "head") for role, node in decl.expressions().items()}
    out["key_stored"] = full(decl.key, decl.key_level)
    return out
