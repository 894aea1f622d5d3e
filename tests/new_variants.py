"""Test helpers: declarations that combine features no built-in combines (a user's variant).

The built-ins cover the delta rule with a vector decay and scaled keys (the safe gate) and plain
writes without a bounded decay; ``declare_combination`` mixes a decay, a write and, with ``extras``,
a D skip on the value and an output gate, as a user may. ``NEW_COMBINATIONS`` names the mixes the
NVRTC and GPU tests run.
"""

from __future__ import annotations

from replayssm_dsl import Recurrence, delta, ops, plain

NEW_COMBINATIONS = {  # id: (decay, write, extras)
    "gla-bounded": ("bounded_vector", "plain", False),
    "gla-bounded-skip-gate": ("bounded_vector", "plain", True),
    "kda-skip-gate": ("bounded_vector", "delta", True),
    "scalar-bounded-plain": ("bounded_scalar", "plain", False),
    "scalar-bounded-delta": ("bounded_scalar", "delta", False),
    "plain-skip-gate": ("unbounded_scalar", "plain", True),
}


def declare_combination(decay: str, write: str, extras: bool):
    """A declaration of ``decay`` (``bounded_vector``: -3 sigmoid(g) per key column; ``bounded_scalar``:
    -2 sigmoid(g); ``unbounded_scalar``: -softplus(g)) and ``write`` (``plain`` or ``delta``), with
    l2-normed keys and queries; ``extras``: ``skip = D * v`` and ``gate = z`` too."""
    r = Recurrence(f"{decay}_{write}{'_skip_gate' if extras else ''}")
    q, k, v = r.token("q", per="group", size="K"), r.token("k", per="group", size="K"), r.token("v", size="V")
    g, b = r.token("g", per="head", size="K" if decay == "bounded_vector" else None), r.token("b")
    decays = {"bounded_vector": -3.0 * ops.sigmoid(g), "bounded_scalar": -2.0 * ops.sigmoid(g),
              "unbounded_scalar": -ops.softplus(g)}
    writes = {"plain": plain(v, ops.sigmoid(b)), "delta": delta(value=v, beta=ops.sigmoid(b))}
    more = {}
    if extras:
        more = {"skip": r.param("D", size="V") * v, "gate": r.token("z", size="V")}
    return r.build(decay=decays[decay], key=ops.l2norm(k), query=ops.l2norm(q) * r.K ** -0.5, write=writes[write],
                   **more)
