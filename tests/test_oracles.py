"""DSL layer tests: the hand-written per-variant oracles agree with the generic plain recurrence.

``reference.HANDWRITTEN`` follows the engines' own code (vLLM's ``selective_state_update``, FLA's
``naive_recurrent_*``, ``[K, V]`` state layout) and uses no declaration; ``plain_recurrence`` runs a
built-in declaration through ``evaluate``. Equal outputs and final states (float64, relative error
≤ 1e-10) check the declarations of the built-ins and the meaning of expressions. The CPU backend's
baselines (``conventional_step``, ``snapshot_verify``) are checked against the same oracles.

May import: NumPy, pytest, Hypothesis, ``replayssm_dsl``, ``replayssm_dsl.runtime.cpu_cache``, tests helpers.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.evaluate import evaluate_fields
from replayssm_dsl.random_inputs import random_params, random_state, random_tokens
from replayssm_dsl.reference import HANDWRITTEN, plain_recurrence
from replayssm_dsl.runtime.cpu_cache import CpuReplayCache
from strategies import seeds, shapes
from twin import assert_close

TOL = 1e-10
ORACLE = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAMES = sorted(variants.BUILTINS)


def test_every_builtin_has_a_handwritten_oracle():
    assert sorted(HANDWRITTEN) == NAMES


def _inputs(decl, shape, rng, steps):
    params = random_params(decl, shape, rng)
    tokens = random_tokens(decl, shape, rng, (steps,))
    state = random_state(shape, rng)
    return params, tokens, state


def _check(name, shape, tokens, params, state):
    decl = variants.get(name)
    want_o, want_s = HANDWRITTEN[name](tokens, params, shape, state)
    got_o, got_s = plain_recurrence(decl, shape, tokens, params, state)
    assert want_o.shape == (next(iter(tokens.values())).shape[0], shape.heads, shape.v_dim)
    assert want_s.shape == (shape.heads, shape.v_dim, shape.k_dim)
    assert np.isfinite(want_o).all() and np.isfinite(want_s).all(), "oracle produced non-finite values"
    assert_close(got_o, want_o, TOL, f"{name} outputs")
    assert_close(got_s, want_s, TOL, f"{name} final state")
    return want_o, want_s


@ORACLE
@given(name=st.sampled_from(NAMES), shape=shapes(), seed=seeds, steps=st.integers(1, 12))
def test_handwritten_oracle_equals_plain_recurrence(name, shape, seed, steps):
    rng = np.random.default_rng(seed)
    decl = variants.get(name)
    params, tokens, state = _inputs(decl, shape, rng, steps)
    _, final = _check(name, shape, tokens, params, state)
    assert not np.allclose(final, state), "the tokens did not move the state: the check is vacuous"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [ModelShape(6, 2, 80, 64), ModelShape(3, 1, 100, 96), ModelShape(4, 4, 60, 128)],
                         ids=["grouped-80x64", "grouped-100x96", "ungrouped-60x128"])
def test_handwritten_oracle_equals_plain_recurrence_odd_shapes(name, shape):
    rng = np.random.default_rng(zlib.crc32(f"{name}-{shape}".encode()))
    decl = variants.get(name)
    params, tokens, state = _inputs(decl, shape, rng, 5)
    _check(name, shape, tokens, params, state)


@pytest.mark.parametrize("name", NAMES)
def test_oracles_split_at_any_token(name):
    """Running T tokens at once == running the first j then the rest from the returned state."""
    shape = ModelShape(4, 2, 5, 3)
    rng = np.random.default_rng(7)
    decl = variants.get(name)
    params, tokens, state = _inputs(decl, shape, rng, 6)
    o_all, s_all = HANDWRITTEN[name](tokens, params, shape, state)
    for j in (1, 3, 5):
        o1, s1 = HANDWRITTEN[name]({k: v[:j] for k, v in tokens.items()}, params, shape, state)
        o2, s2 = HANDWRITTEN[name]({k: v[j:] for k, v in tokens.items()}, params, shape, s1)
        assert_close(np.concatenate([o1, o2]), o_all, TOL, f"{name} split at {j}")
        assert_close(s2, s_all, TOL, f"{name} split state at {j}")


def test_mamba2_without_gate_matches_oracle_without_z():
    shape = ModelShape(4, 2, 6, 4)
    decl = variants.mamba2(gate=False)
    rng = np.random.default_rng(3)
    params, tokens, state = _inputs(decl, shape, rng, 4)
    assert "z" not in tokens
    want_o, want_s = HANDWRITTEN["mamba2"](tokens, params, shape, state)
    got_o, got_s = plain_recurrence(decl, shape, tokens, params, state)
    assert_close(got_o, want_o, TOL, "mamba2 no gate outputs")
    assert_close(got_s, want_s, TOL, "mamba2 no gate state")


def test_oracles_see_the_difference_between_variants():
    """The comparison can fail: feeding one variant's declaration to another's oracle disagrees."""
    shape = ModelShape(2, 1, 4, 4)
    rng = np.random.default_rng(11)
    gdn, dn = variants.get("gdn"), variants.get("deltanet")
    params, tokens, state = _inputs(gdn, shape, rng, 4)
    want_o, _ = HANDWRITTEN["gdn"](tokens, params, shape, state)
    got_o, _ = plain_recurrence(dn, shape, {k: tokens[k] for k in ("q", "k", "v", "b")}, {}, state)
    with pytest.raises(AssertionError, match="relative error"):
        assert_close(got_o, want_o, TOL, "gdn vs deltanet")


@pytest.mark.parametrize("name", [n for n in NAMES if variants.get(n).decay is not None])
def test_random_inputs_decay_the_state_visibly_but_not_away(name):
    """The tests' random inputs keep each decaying built-in where its checkpoint matters: over one
    window of 16 tokens the median channel's log-decay lies in [-60, -0.1] (neither forgotten nor
    left undecayed, either of which would let a wrong fold or a wrong decay pass), and every channel
    decays."""
    shape = ModelShape(8, 4, 16, 32)
    decl = variants.get(name)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    values = {**random_params(decl, shape, rng), **random_tokens(decl, shape, rng, (16,))}
    window_log_decay = evaluate_fields(decl, values, shape)["decay"].sum(axis=0)  # [HV, 1 or K]
    median = float(np.median(window_log_decay))
    assert -60.0 <= median <= -0.1, f"{name}: median log-decay over 16 tokens {median:.4g}"
    assert (window_log_decay < 0).all(), f"{name}: a channel that never decays"


# -- CPU backend baselines against the oracles ------------------------------------------------------
@ORACLE
@given(name=st.sampled_from(NAMES), shape=shapes(), seed=seeds, steps=st.integers(1, 8), data=st.data())
def test_conventional_step_matches_oracle(name, shape, seed, steps, data):
    decl = variants.get(name)
    rng = np.random.default_rng(seed)
    params = random_params(decl, shape, rng)
    cache = CpuReplayCache(decl, shape, ReplayConfig(window=4, max_drafts=4), slots=3, params=params)
    slots = data.draw(st.permutations([0, 1, 2]), label="slot order")[:2]
    states = random_state(shape, rng, (2,))
    cache.load_conventional(slots, states)
    untouched = cache.buffers["state"][[s for s in range(3) if s not in slots][0]].copy()
    tokens = random_tokens(decl, shape, rng, (2, steps))
    for t in range(steps):
        out = cache.conventional_step(slots, {k: v[:, t] for k, v in tokens.items()})
        for b in range(2):
            want_o, _ = HANDWRITTEN[name]({k: v[b, :t + 1] for k, v in tokens.items()}, params, shape, states[b])
            assert_close(out[b], want_o[t], TOL, f"{name} conventional step {t} row {b}")
    for b, s in enumerate(slots):
        _, want_s = HANDWRITTEN[name]({k: v[b] for k, v in tokens.items()}, params, shape, states[b])
        assert_close(cache.buffers["state"][s], want_s, TOL, f"{name} conventional state slot {s}")
    other = [s for s in range(3) if s not in slots][0]
    assert np.array_equal(cache.buffers["state"][other], untouched)


def test_the_baseline_state_is_allocated_by_the_first_baseline_call_only():
    """A cache that only replays holds no baseline ``state`` (as much memory as its checkpoint pages);
    the first baseline call allocates it as zeros, and a conventional step from there is the
    recurrence from the zero state."""
    decl, shape = variants.get("gdn"), ModelShape(4, 2, 6, 5)
    rng = np.random.default_rng(8)
    params = random_params(decl, shape, rng)
    cache = CpuReplayCache(decl, shape, ReplayConfig(window=4, max_drafts=3), slots=2, params=params, pages=3)
    cache.load([0, 1], random_state(shape, rng, (2,)))
    for _ in range(5):
        cache.step([1, 0], random_tokens(decl, shape, rng, (2,)))
    cache.verify([0, 1], random_tokens(decl, shape, rng, (2, 3)), [3, 2])
    cache.commit([1, 2])
    cache.flush([1])
    cache.materialize([0, 1])
    assert "state" not in cache.buffers, "a replay-only cache allocated the baselines' state"
    toks = random_tokens(decl, shape, rng, (1,))
    out = cache.conventional_step([1], toks)
    assert cache.buffers["state"].shape == (3, shape.heads, shape.v_dim, shape.k_dim)
    want_o, want_s = plain_recurrence(decl, shape, toks, params, np.zeros((shape.heads, shape.v_dim, shape.k_dim)))
    assert_close(out[0], want_o[0], TOL, "conventional step from the zero state")
    assert_close(cache.buffers["state"][1], want_s, TOL, "its state")
    assert not cache.buffers["state"][[0, 2]].any(), "pages no row wrote"


@ORACLE
@given(name=st.sampled_from(NAMES), shape=shapes(), seed=seeds, max_drafts=st.integers(1, 8), data=st.data())
def test_snapshot_verify_matches_oracle(name, shape, seed, max_drafts, data):
    """Snapshot ``k`` == the oracle state after drafts ``1..k+1``; outputs == the oracle's outputs;
    the baseline state itself is not moved by a verify."""
    decl = variants.get(name)
    rng = np.random.default_rng(seed)
    params = random_params(decl, shape, rng)
    cache = CpuReplayCache(decl, shape, ReplayConfig(window=4, max_drafts=max_drafts), slots=2, params=params)
    drafts = data.draw(st.lists(st.integers(1, max_drafts), min_size=2, max_size=2), label="drafts")
    t = max(drafts)
    states = random_state(shape, rng, (2,))
    cache.load_conventional([1, 0], states)
    before = cache.buffers["state"].copy()
    tokens = random_tokens(decl, shape, rng, (2, t))
    out, snaps = cache.snapshot_verify([1, 0], tokens, drafts)
    assert snaps.shape == (2, t, shape.heads, shape.v_dim, shape.k_dim)
    for b in range(2):
        d = drafts[b]
        want_o, _ = HANDWRITTEN[name]({k: v[b, :d] for k, v in tokens.items()}, params, shape, states[b])
        assert_close(out[b, :d], want_o, TOL, f"{name} snapshot-verify outputs row {b}")
        for k in range(d):
            _, want_s = HANDWRITTEN[name]({n: v[b, :k + 1] for n, v in tokens.items()}, params, shape, states[b])
            assert_close(snaps[b, k], want_s, TOL, f"{name} snapshot {k} row {b}")
        assert np.isnan(out[b, d:]).all() and np.isnan(snaps[b, d:]).all(), f"row {b}: written past drafts[{b}] = {d}"
    assert np.array_equal(cache.buffers["state"], before), "snapshot_verify moved the baseline state"
