"""DSL layer: the plain recurrence of any declaration, token by token, in float64 (docs/design.md, "The recurrence").

This is the oracle: written from the math, it shares nothing with the lowering or its executor but
the NumPy meaning of expressions (``evaluate.py``), which the hand-written per-variant oracles check.
"""

from __future__ import annotations

import numpy as np

from ..config import ModelShape
from ..declaration import Declaration
from ..evaluate import evaluate_fields


def plain_recurrence(decl: Declaration, shape: ModelShape, tokens: dict[str, np.ndarray],
                     params: dict[str, np.ndarray], state: np.ndarray | None = None):
    """Decode one sequence token by token.

    ``tokens[name]``: ``[T, heads(, size)]``; ``params[name]``: ``[heads(, size)]``;
    ``state``: ``[HV, V, K]`` initial state (zeros if None).
    Returns ``(outputs [T, HV, V], final state [HV, V, K])`` in float64.
    """
    f = evaluate_fields(decl, {**tokens, **params}, shape)
    steps = next(iter(tokens.values())).shape[0]
    S = np.zeros((shape.heads, shape.v_dim, shape.k_dim)) if state is None else np.array(state, np.float64)
    outputs = np.empty((steps, shape.heads, shape.v_dim))
    for t in range(steps):
        k, q, v = f["key"][t], f["query"][t], f["value"][t]  # [HV, K], [HV, K], [HV, V]
        P = S * np.exp(f["decay"][t])[:, None, :] if "decay" in f else S  # decay [HV, 1] or [HV, K]
        if "beta" in f:
            w = f["beta"][t] * (v - np.einsum("hvk,hk->hv", P, k))
        else:
            w = v * f["strength"][t] if "strength" in f else v
        S = P + w[:, :, None] * k[:, None, :]
        o = np.einsum("hvk,hk->hv", S, q)
        if "skip" in f:
            o = o + f["skip"][t]
        if "gate" in f:
            gate = f["gate"][t]
            o = o * gate / (1.0 + np.exp(-gate))
        outputs[t] = o
    return outputs, S
