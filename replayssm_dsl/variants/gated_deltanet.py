"""DSL layer: Gated DeltaNet (Qwen3.5 / Qwen3-Next), with FLA's and vLLM's conventions.

``g = −exp(A_log)·softplus(a + dt_bias)``, ``β = sigmoid(b)``, L2-normalised ``q`` and ``k``
(``use_qk_l2norm_in_kernel``), ``q`` scaled by ``K^-½``; ``HV`` value heads share ``H`` key heads
(value head ``hv`` reads key head ``hv // (HV / H)``). Gating and norm of the output live outside.
"""

from __future__ import annotations

from .. import ops
from ..declaration import Declaration, Recurrence, delta


def gated_deltanet() -> Declaration:
    r = Recurrence("gdn", doc="Gated DeltaNet (FLA fused_recurrent_gated_delta_rule conventions)")
    q = r.token("q", per="group", size="K")
    k = r.token("k", per="group", size="K")
    v = r.token("v", size="V")
    a = r.token("a", doc="[B, HV] decay input")
    b = r.token("b", doc="[B, HV] write-strength logit")
    A_log = r.param("A_log")
    dt_bias = r.param("dt_bias")
    return r.build(
        decay=-ops.exp(A_log) * ops.softplus(a + dt_bias),
        key=ops.l2norm(k),
        query=ops.l2norm(q) * r.K ** -0.5,
        write=delta(value=v, beta=ops.sigmoid(b)),
    )
