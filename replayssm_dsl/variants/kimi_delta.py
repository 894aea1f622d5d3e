"""DSL layer: Kimi Delta Attention (Kimi Linear): a delta rule with a per-channel decay over K.

``g = −exp(A_log)·softplus(g_raw + dt_bias)`` per key channel (Kimi's ``fused_kda_gate``: ``A_log``
per head, ``dt_bias`` per head and channel), ``β = sigmoid(b)``, L2-normalised ``q``, ``k``,
``q`` scaled by ``K^-½``.

``kda_safe_gate`` is the same layer with FLA's safe gate (fla-core's ``chunk_kda`` and
``fused_recurrent_kda`` with ``lower_bound``): ``g = lower_bound·sigmoid(exp(A_log)·(g_raw +
dt_bias))``, in ``[lower_bound, 0]``. Its bound lets the records keep decay-scaled keys
(lowering/record_keys.py); Kimi's own gate is unbounded below.
"""

from __future__ import annotations

import math

from .. import ops
from ..declaration import Declaration, Recurrence, delta
from ..errors import DeclarationError

SAFE_GATE_LOWER_BOUND = -5.0  # FLA's recommended bound, the lowest its chunk kernels accept


def _kda(name: str, doc: str, gate) -> Declaration:
    r = Recurrence(name, doc=doc)
    q = r.token("q", per="group", size="K")
    k = r.token("k", per="group", size="K")
    v = r.token("v", size="V")
    g_raw = r.token("g_raw", size="K", doc="[B, HV, K] decay input per channel")
    b = r.token("b", doc="[B, HV] write-strength logit")
    A_log = r.param("A_log", doc="[HV]")
    dt_bias = r.param("dt_bias", size="K", doc="[HV, K]")
    return r.build(
        decay=gate(A_log, g_raw + dt_bias),
        key=ops.l2norm(k),
        query=ops.l2norm(q) * r.K ** -0.5,
        write=delta(value=v, beta=ops.sigmoid(b)),
    )


def kimi_delta_attention() -> Declaration:
    return _kda("kda", "Kimi Delta Attention (per-channel decay, delta rule)",
                lambda A_log, x: -ops.exp(A_log) * ops.softplus(x))


def kda_safe_gate(lower_bound: float = SAFE_GATE_LOWER_BOUND) -> Declaration:
    """Kimi Delta Attention with FLA's safe gate, each token's log-decay in ``[lower_bound, 0]``."""
    if isinstance(lower_bound, bool) or not isinstance(lower_bound, (int, float)) or not (
            math.isfinite(lower_bound) and lower_bound < 0):
        raise DeclarationError(f"lower_bound: must be a finite number < 0, got {lower_bound!r}")
    return _kda("kda_safe_gate", f"Kimi Delta Attention with the safe gate (log-decay in [{lower_bound:g}, 0])",
                lambda A_log, x: float(lower_bound) * ops.sigmoid(ops.exp(A_log) * x))
