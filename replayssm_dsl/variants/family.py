"""DSL layer: more of the family, to show the DSL is general: GLA, RetNet and DeltaNet.

- GLA (gated linear attention): per-channel decay ``g = logsigmoid(gk) / 16`` (FLA's
  ``gate_logit_normalizer``), plain write ``w = v``, ``q`` scaled by ``K^-½``.
- RetNet: a fixed decay per head (``log_gamma``, a parameter ≤ 0), plain write, scaled ``q``.
- DeltaNet: no decay, delta rule with ``β = sigmoid(b)``, L2-normalised ``q`` and ``k``.
"""

from __future__ import annotations

from .. import ops
from ..declaration import Declaration, Recurrence, delta, plain


def gated_linear_attention() -> Declaration:
    r = Recurrence("gla", doc="Gated linear attention (per-channel decay, plain write)")
    q = r.token("q", per="group", size="K")
    k = r.token("k", per="group", size="K")
    v = r.token("v", size="V")
    gk = r.token("gk", size="K", doc="[B, HV, K] gate logits")
    return r.build(decay=ops.logsigmoid(gk) / 16.0, key=k, query=q * r.K ** -0.5, write=plain(value=v))


def retnet() -> Declaration:
    r = Recurrence("retnet", doc="RetNet retention (fixed decay per head)")
    q = r.token("q", per="group", size="K")
    k = r.token("k", per="group", size="K")
    v = r.token("v", size="V")
    log_gamma = r.param("log_gamma", sign="nonpositive", doc="[HV] log of the per-head decay, <= 0")
    return r.build(decay=log_gamma, key=k, query=q * r.K ** -0.5, write=plain(value=v))


def deltanet() -> Declaration:
    r = Recurrence("deltanet", doc="DeltaNet (delta rule, no decay)")
    q = r.token("q", per="group", size="K")
    k = r.token("k", per="group", size="K")
    v = r.token("v", size="V")
    b = r.token("b")
    return r.build(key=ops.l2norm(k), query=ops.l2norm(q) * r.K ** -0.5,
                   write=delta(value=v, beta=ops.sigmoid(b)))
