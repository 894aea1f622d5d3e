"""Hypothesis strategies shared by the tests: shapes, replay settings, declarations of the family.

Shapes mix small powers of two with the awkward sizes engines meet (V = 60, 80, 100; K = 64, 96,
128) and grouped heads; seeds are drawn and the arrays filled with NumPy, so every example gets
fresh random inputs.
"""

from __future__ import annotations

from hypothesis import strategies as st

from replayssm_dsl import ModelShape, ReplayConfig, Recurrence, delta, ops, plain

SMALL_DIMS = (2, 3, 4, 8, 16)
ODD_V = (60, 80, 100)
ODD_K = (64, 96, 128)

seeds = st.integers(0, 2**32 - 1)


@st.composite
def shapes(draw, odd: bool = True) -> ModelShape:
    key_heads = draw(st.sampled_from((1, 2)))
    heads = key_heads * draw(st.sampled_from((1, 2, 3)))
    if odd and draw(st.booleans()):
        return ModelShape(heads, key_heads, draw(st.sampled_from(ODD_V)), draw(st.sampled_from(ODD_K)))
    return ModelShape(heads, key_heads, draw(st.sampled_from(SMALL_DIMS)), draw(st.sampled_from(SMALL_DIMS)))


@st.composite
def configs(draw) -> ReplayConfig:
    return ReplayConfig(window=draw(st.sampled_from((1, 2, 3, 4, 5, 16))), max_drafts=draw(st.integers(1, 8)))


@st.composite
def declarations(draw):
    """A random member of the family: decay none/scalar/vector (unbounded, or bounded below like FLA's
    safe gate), plain or delta write, with or without normalised keys, scaled queries, per-head or
    per-group keys, skip and gate epilogues."""
    r = Recurrence("random")
    key_level = draw(st.sampled_from(("group", "head")))
    q = r.token("q", per=key_level, size="K")
    k = r.token("k", per=key_level, size="K")
    v = r.token("v", size="V")
    key = ops.l2norm(k) if draw(st.booleans()) else k
    query = ops.l2norm(q) * r.K ** -0.5 if draw(st.booleans()) else q * 0.5
    form = draw(st.sampled_from(("none", "scalar", "vector")))
    decay = None
    if form != "none":
        gx = r.token("gx", size="K" if form == "vector" else None)
        bound = draw(st.sampled_from(("unbounded", "logsigmoid", "bounded")))
        if bound == "unbounded":
            A_log = r.param("A_log")
            decay = -ops.exp(A_log) * ops.softplus(gx)
        elif bound == "logsigmoid":
            decay = ops.logsigmoid(gx) / draw(st.sampled_from((1.0, 4.0, 16.0)))
        else:  # FLA's safe-gate form, log-decay in [lower_bound, 0]: records of decay-scaled keys
            decay = draw(st.sampled_from((-5.0, -1.0, -0.25))) * ops.sigmoid(gx)
    if draw(st.booleans()):
        write = delta(value=v, beta=ops.sigmoid(r.token("b")))
    elif draw(st.booleans()):
        write = plain(value=v, strength=ops.softplus(r.token("s")))
    else:
        write = plain(value=v)
    skip = r.param("D") * v if draw(st.booleans()) else None
    gate = r.token("z", size="V") if draw(st.booleans()) else None
    return r.build(decay=decay, key=key, query=query, write=write, skip=skip, gate=gate)
