"""Property tests of the CPU backend (the lowered plans, interpreted) against the plain recurrence.

Every built-in variant and random declarations of the family; odd sizes and grouped heads; fills
0, 1, L−1, L and full capacity; drafts 1..8. Float64 throughout: tolerances are rounding only.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replayssm_dsl import ReplayConfig, variants
from replayssm_dsl.bfloat16 import round_to_bfloat16
from replayssm_dsl.runtime.cpu_cache import CpuReplayCache
from replayssm_dsl.runtime.selfcheck import STATE_DTYPE_TOLERANCE
from strategies import configs, declarations, seeds, shapes
from twin import ReplayTwin, assert_close

PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
decls = st.one_of(st.sampled_from(sorted(variants.BUILTINS)).map(variants.get), declarations())


@PROPERTY
@given(decl=decls, shape=shapes(), config=configs(), seed=seeds, steps=st.integers(1, 40),
       flush_every=st.sampled_from((0, 1, 3, 7)))
def test_replay_steps_match_plain_recurrence_and_materialize(decl, shape, config, seed, steps, flush_every):
    """Replay outputs == plain recurrence; materialize == plain state; an explicit flush at any
    point changes nothing."""
    twin = ReplayTwin(CpuReplayCache, decl, shape, config, np.random.default_rng(seed), slots=2)
    twin.load([1])
    for i in range(steps):
        twin.step([1])
        if flush_every and i % flush_every == 0:
            twin.cache.flush([1])
            assert twin.cache.fills()[1] == 0
        if i % 5 == 0:
            twin.check_materialize([1])
    twin.check_materialize([1])


@PROPERTY
@given(decl=decls, shape=shapes(), config=configs(), seed=seeds, paged=st.booleans(), data=st.data())
def test_verify_outputs_and_commit_equal_decoding_only_accepted(decl, shape, config, seed, paged, data):
    """verify output j == output after committing drafts 1..j; commit(a) then steps == having
    decoded only the accepted tokens (the oracle advances by accepted tokens only). ``paged``: 7
    checkpoint pages for the 3 slots, each fold written to a free page, no slot on its own index."""
    twin = ReplayTwin(CpuReplayCache, decl, shape, config, np.random.default_rng(seed), slots=3,
                      pages=7 if paged else None)
    twin.load([0, 2])
    for _ in range(data.draw(st.integers(1, 6), label="rounds")):
        for _ in range(data.draw(st.integers(0, config.window + 1), label="plain steps")):
            twin.step([2, 0])
        for _ in range(data.draw(st.integers(1, 3), label="back-to-back verifies")):
            drafts = data.draw(st.lists(st.integers(1, config.max_drafts), min_size=2, max_size=2), label="drafts")
            toks = twin.verify([0, 2], drafts)
            accepted = [data.draw(st.integers(0, d), label="accepted") for d in drafts]
            twin.commit([0, 2], toks, accepted)
            assert (twin.cache.fills() <= config.capacity).all()
        twin.check_materialize([0, 2])
    twin.step([0, 2])


def _drive_to_fill(twin, slot, target):
    """Bring ``slot`` to fill ``target`` (0..capacity) with steps, then verify/commit of drafts."""
    cfg = twin.config
    for _ in range(min(target, cfg.window - 1)):
        twin.step([slot])
    for _ in range(cfg.capacity):  # each verify adds at least one token: a fill that stalls fails here
        if twin.cache.fills()[slot] >= target:
            break
        need = int(target - twin.cache.fills()[slot])
        t = min(need, cfg.max_drafts)
        toks = twin.verify([slot], [t])
        twin.commit([slot], toks, [t])
    assert twin.cache.fills()[slot] == target, f"slot {slot}: fill {twin.cache.fills()[slot]}, wanted {target}"


@PROPERTY
@given(decl=decls, shape=shapes(), window=st.sampled_from((2, 3, 4, 16)), max_drafts=st.integers(1, 8),
       seed=seeds, pad=st.booleans(), data=st.data())
def test_mixed_batch_equals_each_slot_alone(decl, shape, window, max_drafts, seed, pad, data):
    """Slots at fills 0, 1, L−1, L and full capacity, decoded in one batch (with padded rows),
    give each slot's own plain recurrence; then one batched verify, with drafts and accepted counts
    of each row's own, does too."""
    config = ReplayConfig(window=window, max_drafts=max_drafts)
    fills = sorted({0, 1, window - 1, window, config.capacity})
    twin = ReplayTwin(CpuReplayCache, decl, shape, config, np.random.default_rng(seed), slots=len(fills) + 1)
    slots = list(range(len(fills)))
    twin.load(slots)
    for slot, fill in zip(slots, fills):
        _drive_to_fill(twin, slot, fill)
    before_null = twin.cache.checkpoint(len(fills)).copy()
    batch = slots[::-1] + ([-1] if pad else [])
    d = data.draw(st.lists(st.integers(1, max_drafts), min_size=len(batch), max_size=len(batch)), label="drafts")
    toks = twin.verify(batch, d)  # the slot at full capacity folds its buffer first
    twin.commit(batch, toks, [data.draw(st.integers(0, x), label="accepted") for x in d])
    twin.check_materialize(slots)
    fills_now = twin.cache.fills()[batch[:len(fills)]]
    twin.step(batch)
    expected = [0 if f + 1 >= window else f + 1 for f in fills_now]
    assert list(twin.cache.fills()[batch[:len(fills)]]) == expected
    twin.check_materialize(slots)
    assert np.array_equal(twin.cache.checkpoint(len(fills)), before_null), "an unused slot's checkpoint changed"


@PROPERTY
@given(shape=shapes(), config=configs(), seed=seeds, steps=st.integers(1, 30))
def test_no_decay_unit_write_is_linear_attention(shape, config, seed, steps):
    """g = 0 with a plain unit write reduces to causal linear attention:
    o_t = S_0 q_t + Σ_{i≤t} v_i (k_i · q_t), computed here as matrix products."""
    from replayssm_dsl import Recurrence, plain
    r = Recurrence("linear_attention")
    q, k, v = r.token("q", size="K"), r.token("k", size="K"), r.token("v", size="V")
    decl = r.build(key=k, query=q, write=plain(value=v))
    rng = np.random.default_rng(seed)
    twin = ReplayTwin(CpuReplayCache, decl, shape, config, rng, slots=1)
    twin.load([0])
    S0 = twin.state[0]
    toks = twin.tokens((steps,))
    outs = np.stack([twin.cache.step([0], {n: a[t:t + 1] for n, a in toks.items()})[0] for t in range(steps)])
    scores = np.einsum("ihk,thk->hti", toks["k"], toks["q"])  # [HV, t, i]
    causal = np.tril(np.ones((steps, steps)))
    want = np.einsum("hvk,thk->thv", S0, toks["q"]) + np.einsum("hti,ihv->thv", scores * causal, toks["v"])
    assert_close(outs, want, 1e-9, "linear attention")


@PROPERTY
@given(variant=st.sampled_from(("gdn", "kda", "deltanet")), shape=shapes(), config=configs(), seed=seeds,
       steps=st.integers(1, 30))
def test_zero_beta_keeps_the_state(variant, shape, config, seed, steps):
    """β = 0 (b → −∞) makes the delta rule write nothing: o_t = (S_0 · e^{G_t}) q_t."""
    decl = variants.get(variant)
    twin = ReplayTwin(CpuReplayCache, decl, shape, config, np.random.default_rng(seed), slots=1)
    twin.load([0])
    S0 = twin.state[0]
    toks = twin.tokens((steps,))
    toks["b"] = np.full_like(toks["b"], -800.0)  # sigmoid(-800) == 0 in float64
    outs = np.stack([twin.cache.step([0], {n: a[t:t + 1] for n, a in toks.items()})[0] for t in range(steps)])
    from replayssm_dsl.evaluate import evaluate_fields
    f = evaluate_fields(decl, {**toks, **twin.params}, shape)
    G = np.cumsum(f["decay"], axis=0) if "decay" in f else np.zeros((steps, shape.heads, 1))
    want = np.einsum("hvk,thk->thv", S0, np.exp(G) * f["query"])
    assert_close(outs, want, 1e-9, "beta = 0")


@settings(max_examples=15, deadline=None)
@given(decl=decls, shape=shapes(odd=False), config=configs(), seed=seeds, steps=st.integers(1, 40))
def test_float32_executor_stays_close_to_float64(decl, shape, config, seed, steps):
    """The FP32 executor (the GPU's arithmetic) tracks the float64 oracle within 1e-4 relative."""
    twin = ReplayTwin(CpuReplayCache, decl, shape, config, np.random.default_rng(seed), slots=1, tol=1e-4,
                      precision="float32")
    twin.load([0])
    for _ in range(steps):
        twin.step([0])


HALF_TOLERANCE = {dtype: tol for dtype, tol in STATE_DTYPE_TOLERANCE.items() if dtype != "float32"}


@settings(max_examples=15, deadline=None)
@given(name=st.sampled_from(sorted(variants.BUILTINS)), shape=shapes(odd=False), window=st.sampled_from((1, 2, 4, 16)),
       state_dtype=st.sampled_from(sorted(HALF_TOLERANCE)), seed=seeds, steps=st.integers(1, 48))
def test_half_precision_checkpoints_stay_close_to_float64(name, shape, window, state_dtype, seed, steps):
    """Checkpoints stored in float16 / bfloat16 (rounded on every flush) keep outputs and states
    within the dtype's tolerance of the float64 oracle, and hold only values of that dtype. The
    built-in variants, whose decay or delta rule keeps the state bounded (a random declaration with
    neither grows its state past float16's range, which the dtype cannot hold)."""
    decl = variants.get(name)
    config = ReplayConfig(window=window, max_drafts=4, state_dtype=state_dtype)
    twin = ReplayTwin(CpuReplayCache, decl, shape, config, np.random.default_rng(seed), slots=2,
                      tol=HALF_TOLERANCE[state_dtype])
    twin.load([1])
    for _ in range(steps):
        twin.step([1])
    twin.check_materialize([1])
    checkpoint = twin.cache.checkpoint(1)  # slot 1's page: no step names pages, so each slot keeps its own
    stored = checkpoint.astype(np.float16) if state_dtype == "float16" else round_to_bfloat16(checkpoint)
    assert np.array_equal(stored.astype(np.float64), checkpoint.astype(np.float64)), \
        f"the checkpoint holds values that are not {state_dtype}"
