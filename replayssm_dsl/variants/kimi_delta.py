"""DSL layer: Kimi Delta Attention (Kimi Linear): a delta rule with a per-channel decay over K.

``g = −exp(A_log)·softplus(g_raw + dt_bias)`` per key channel (Kimi's ``fused_kda_gate``: ``A_log``
per head, ``dt_bias`` per head and channel), ``β = sigmoid(b)``, L2-normalised ``q``, ``k``,
``q`` scaled by ``K^-½``.
"""

from __future__ import annotations

from .. import ops
from ..declaration import Declaration, Recurrence, delta


def kimi_delta_attention() -> Declaration:
    r = Recurrence("kda", doc="Kimi Delta Attention (per-channel decay, delta rule)")
    q = r.token("q", per="group", size="K")
    k = r.token("k", per="group", size="K")
    v = r.token("v", size="V")
    g_raw = r.token("g_raw", size="K", doc="[B, HV, K] decay input per channel")
    b = r.token("b", doc="[B, HV] write-strength logit")
    A_log = r.param("A_log", doc="[HV]")
    dt_bias = r.param("dt_bias", size="K", doc="[HV, K]")
    return r.build(
        decay=-ops.exp(A_log) * ops.softplus(g_raw + dt_bias),
        key=ops.l2norm(k),
        query=ops.l2norm(q) * r.K ** -0.5,
        write=delta(value=v, beta=ops.sigmoid(b)),
    )
