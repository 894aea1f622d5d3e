"""DSL layer: Mamba-2, declared with vLLM's ``selective_state_update`` conventions.

vLLM: ``dt = softplus(dt + dt_bias)`` (``dt_softplus=True``), ``A = −exp(A_log)``,
``state = state·exp(A·dt) + (dt·x) Bᵀ``, ``out = state C + D·x``, ``out *= silu(z)``; ``B`` and ``C``
are shared by the heads of a group (``ngroups`` key heads). Here ``V`` is ``headdim`` and ``K`` is
``d_state``.
"""

from __future__ import annotations

from .. import ops
from ..declaration import Declaration, Recurrence, plain


def mamba2(gate: bool = True, dt_softplus: bool = True) -> Declaration:
    r = Recurrence("mamba2" if gate and dt_softplus else
                   "mamba2" + ("" if gate else "_nogate") + ("" if dt_softplus else "_rawdt"),
                   doc="Mamba-2 (vLLM selective_state_update conventions)")
    x = r.token("x", size="V", doc="[B, HV, V] input (headdim rows)")
    dt = r.token("dt", sign="any" if dt_softplus else "nonnegative", doc="[B, HV] time step before bias")
    B = r.token("B", per="group", size="K", doc="[B, H, K] input projection, shared by a group")
    C = r.token("C", per="group", size="K", doc="[B, H, K] output projection, shared by a group")
    A_log = r.param("A_log", doc="[HV] A = -exp(A_log)")
    dt_bias = r.param("dt_bias", sign="any" if dt_softplus else "nonnegative", doc="[HV]")
    D = r.param("D", doc="[HV] skip")
    step = ops.softplus(dt + dt_bias) if dt_softplus else dt + dt_bias
    z = r.token("z", size="V", doc="[B, HV, V] gate") if gate else None
    return r.build(
        decay=-ops.exp(A_log) * step,
        key=B,
        query=C,
        write=plain(value=x, strength=step),
        skip=D * x,
        gate=z,
    )
