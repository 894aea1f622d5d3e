"""Runtime layer tests: every misuse of ``CpuReplayCache`` is refused, naming the problem, and changes nothing.

Each bad call must raise ``InputError`` / ``CapacityError`` / ``ConfigError`` with a message that
names the argument and the rule, and must leave every buffer of the cache (checkpoints, records,
fills, baseline states, params) bit-for-bit as it was: a refused call never corrupts another
sequence's state. A good call afterwards still works and matches the float64 oracle.

May import: NumPy, pytest, Hypothesis, ``replayssm_dsl``, ``replayssm_dsl.runtime.cpu_cache``, tests helpers.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from busy_cache import CONFIG, OPS, SHAPE, SLOTS, Busy, slot_ops, assert_same, refused
from replayssm_dsl import variants
from replayssm_dsl.errors import CapacityError, ConfigError, InputError
from replayssm_dsl.random_inputs import random_params, random_state
from replayssm_dsl.reference import plain_recurrence
from replayssm_dsl.runtime.cpu_cache import CpuReplayCache
from twin import assert_close, buffers_snapshot


@pytest.fixture
def busy():
    return Busy()


# -- tokens -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["step", "conventional_step"])
def test_wrong_token_shape(busy, op):
    c = busy.cache
    toks = busy.tokens(2)
    toks["q"] = np.zeros((2, SHAPE.key_heads, SHAPE.k_dim + 1))
    with refused(c, InputError, "tokens['q']", "expected shape [2, 2, 5]", "got [2, 2, 6]", exact=True):
        getattr(c, op)([0, 1], toks)
    toks = busy.tokens(2)
    toks["v"] = toks["v"][:1]  # one row for a batch of two
    with refused(c, InputError, "tokens['v']", "expected shape [2, 4, 6]", "got [1, 4, 6]"):
        getattr(c, op)([0, 1], toks)
    toks = busy.tokens(2)
    toks["b"] = toks["b"][..., None]  # a scalar input given a trailing axis
    with refused(c, InputError, "tokens['b']", "expected shape [2, 4]"):
        getattr(c, op)([0, 1], toks)


def test_token_given_per_value_head_where_declared_per_group(busy):
    toks = busy.tokens(1)
    toks["k"] = np.ones((1, SHAPE.heads, SHAPE.k_dim))
    with refused(busy.cache, InputError, "tokens['k']", "expected shape [1, 2, 5]"):
        busy.cache.step([0], toks)


@pytest.mark.parametrize("name", ["q", "k", "v", "a", "b"])
def test_missing_token(busy, name):
    toks = busy.tokens(1)
    del toks[name]
    with refused(busy.cache, InputError, f"missing {name!r}", "gdn declares it as token"):
        busy.cache.step([3], toks)
    toks = busy.tokens(1, 2)
    del toks[name]
    with refused(busy.cache, InputError, f"missing {name!r}", "[B, T,"):
        busy.cache.verify([3], toks, [2])


def test_unknown_token_name(busy):
    toks = busy.tokens(1)
    toks["beta"] = np.zeros((1, SHAPE.heads))
    with refused(busy.cache, InputError, "['beta']", "not declared by 'gdn'"):
        busy.cache.step([0], toks)
    toks = busy.tokens(1, 2)
    toks["gk"] = np.zeros((1, 2, SHAPE.heads))
    with refused(busy.cache, InputError, "['gk']", "not declared"):
        busy.cache.verify([0], toks, [2])


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_, np.uint8, np.complex128])
def test_non_float_token(busy, dtype):
    toks = busy.tokens(1)
    toks["a"] = np.ones((1, SHAPE.heads), dtype)
    with refused(busy.cache, InputError, "tokens['a']", f"dtype {np.dtype(dtype).name} not accepted", "float32"):
        busy.cache.step([0], toks)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["q", "v", "a"])
def test_non_finite_token(busy, bad, name):
    toks = busy.tokens(2)
    toks[name] = toks[name].copy()
    toks[name][1, 0] = bad
    with refused(busy.cache, InputError, f"tokens[{name!r}]", "non-finite value", "[1, 0"):
        busy.cache.step([2, 3], toks)
    toks = busy.tokens(2, 3)
    toks[name] = toks[name].copy()
    toks[name][0, 2, 1] = bad
    with refused(busy.cache, InputError, f"tokens[{name!r}]", "non-finite value", "[0, 2, 1"):
        busy.cache.verify([2, 3], toks, [3, 3])
    with refused(busy.cache, InputError, "non-finite"):
        busy.cache.snapshot_verify([2, 3], toks, [3, 3])


def test_token_sign_violated():
    """mamba2 with a raw time step declares ``dt`` (and ``dt_bias``) ``sign='nonnegative'``."""
    decl = variants.mamba2(dt_softplus=False)
    b = Busy(1, decl=decl)
    toks = b.tokens(2)
    toks["dt"] = np.abs(toks["dt"])
    toks["dt"][1, 2] = -0.25
    with refused(b.cache, InputError, "tokens['dt']", "sign='nonnegative'", "-0.25"):
        b.cache.step([0, 1], toks)
    toks["dt"][1, 2] = 0.0  # zero is allowed
    b.step([0, 1], toks)
    b.check_all()


# -- params -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_param(bad):
    decl = variants.get("gdn")
    params = random_params(decl, SHAPE, np.random.default_rng(0))
    params["dt_bias"][1] = bad
    with pytest.raises(InputError, match=r"params\['dt_bias'\]: non-finite value .* at index \[1\]"):
        CpuReplayCache(decl, SHAPE, CONFIG, slots=2, params=params)


@pytest.mark.parametrize("variant", sorted(variants.BUILTINS))
def test_missing_param(variant):
    decl = variants.get(variant)
    params = random_params(decl, SHAPE, np.random.default_rng(0))
    for name in list(params):
        partial = {k: v for k, v in params.items() if k != name}
        with pytest.raises(InputError, match=rf"params: missing '{name}' \({decl.name} declares it as param"):
            CpuReplayCache(decl, SHAPE, CONFIG, slots=2, params=partial)


def test_unknown_and_misshaped_params():
    decl = variants.get("gdn")
    params = random_params(decl, SHAPE, np.random.default_rng(0))
    with pytest.raises(InputError, match=r"params: \['D'\] not declared by 'gdn'"):
        CpuReplayCache(decl, SHAPE, CONFIG, slots=2, params={**params, "D": np.ones(SHAPE.heads)})
    with pytest.raises(InputError, match=r"params\['A_log'\]: expected shape \[4\], got \[2\]"):
        CpuReplayCache(decl, SHAPE, CONFIG, slots=2, params={**params, "A_log": np.zeros(2)})
    with pytest.raises(InputError, match=r"params\['A_log'\]"):
        CpuReplayCache(decl, SHAPE, CONFIG, slots=2, params={**params, "A_log": np.zeros((SHAPE.heads, 1))})


def test_param_sign_violated():
    decl = variants.get("retnet")
    params = {"log_gamma": -np.linspace(0.0, 0.5, SHAPE.heads)}
    CpuReplayCache(decl, SHAPE, CONFIG, slots=1, params=params)  # zero and negative are fine
    params["log_gamma"][2] = 0.125
    with pytest.raises(InputError, match=r"params\['log_gamma'\]: declared sign='nonpositive' but holds 0.125 > 0"):
        CpuReplayCache(decl, SHAPE, CONFIG, slots=1, params=params)


# -- slots, pages, batch arrays ---------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("slots,index,value", [([0, SLOTS], 1, SLOTS), ([99], 0, 99), ([1, -2], 1, -2)])
def test_slot_out_of_range(busy, op, slots, index, value):
    with refused(busy.cache, InputError, f"slots[{index}] = {value} is out of range [0, {SLOTS})"):
        slot_ops(busy, slots)[op]()
    busy.step([0, 1, 2, 3])
    busy.check_all()


@pytest.mark.parametrize("op", OPS)
def test_duplicate_slot_in_one_batch(busy, op):
    with refused(busy.cache, InputError, "slot 2 appears twice in one batch"):
        slot_ops(busy, [2, 0, 2])[op]()
    with refused(busy.cache, InputError, "slot 1 appears twice"):
        slot_ops(busy, [-1, 1, -1, 1])[op]()


@pytest.mark.parametrize("slots,fragment", [([], "empty batch"), ([[0, 1]], "1-D array"),
                                            ([0.0, 1.0], "expected integers"), (["0", "1"], "expected integers")])
def test_malformed_slot_arrays(busy, slots, fragment):
    with refused(busy.cache, InputError, "slots", fragment):
        busy.cache.flush(slots)
    with refused(busy.cache, InputError, "slots", fragment):
        busy.cache.materialize(slots)


# -- drafts, verify, commit -------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["verify", "snapshot_verify"])
def test_zero_drafts(busy, op):
    with refused(busy.cache, InputError, "drafts[1] = 0", "at least one draft"):
        getattr(busy.cache, op)([0, 1], busy.tokens(2, 2), [2, 0])
    with refused(busy.cache, InputError, "drafts[0] = -1"):
        getattr(busy.cache, op)([0, 1], busy.tokens(2, 2), [-1, 2])


@pytest.mark.parametrize("op", ["verify", "snapshot_verify"])
@pytest.mark.parametrize("drafts", [CONFIG.max_drafts + 1, 8, 50])
def test_drafts_beyond_max_drafts(busy, op, drafts):
    with refused(busy.cache, CapacityError, f"drafts[1] = {drafts}", f"max_drafts={CONFIG.max_drafts}",
                 "capacity is 7", exact=True):
        getattr(busy.cache, op)([3, 2], busy.tokens(2, drafts), [1, drafts])


def test_drafts_of_wrong_length(busy):
    with refused(busy.cache, InputError, "drafts: length 3 != batch rows 2"):
        busy.cache.verify([0, 1], busy.tokens(2, 2), [1, 1, 1])


def test_verify_tokens_shorter_than_drafts(busy):
    with refused(busy.cache, InputError, "drafts[1] = 3 but tokens hold only T = 2 drafts"):
        busy.cache.verify([0, 1], busy.tokens(2, 2), [1, 3])
    with refused(busy.cache, InputError, "drafts[0] = 3 but tokens hold only T = 2 drafts"):
        busy.cache.snapshot_verify([0, 1], busy.tokens(2, 2), [3, 1])
    with refused(busy.cache, InputError, "tokens['q']: verify tokens are [B, T, ...]"):
        busy.cache.verify([0, 1], {"q": np.zeros(3)}, [1, 1])
    # a step's tokens ([B, H, K]: H = 2 read as T) given to verify: the message shows the shape it read
    with refused(busy.cache, InputError, "drafts[0] = 3 but tokens hold only T = 2 drafts",
                 "(tokens['q'] has shape [2, 2, 5]; verify tokens are [B, T, ...])"):
        busy.cache.verify([0, 1], busy.tokens(2), [3, 1])
    with refused(busy.cache, InputError, "no declared token input"):
        busy.cache.verify([0, 1], {}, [1, 1])


def test_verify_tokens_with_mismatched_t(busy):
    toks = busy.tokens(2, 3)
    toks["v"] = toks["v"][:, :2]
    with refused(busy.cache, InputError, "tokens['v']", "expected shape [2, 3, 4, 6]"):
        busy.cache.verify([0, 1], toks, [2, 2])


def test_commit_without_verify(busy):
    with refused(busy.cache, InputError, "commit: no verify to commit"):
        busy.cache.commit([0, 0, 0, 0])
    busy.step([0])
    with refused(busy.cache, InputError, "no verify to commit"):
        busy.cache.commit([0])


def test_commit_twice_and_after_an_intervening_op(busy):
    c = busy.cache
    toks = busy.tokens(2, 2)
    assert c.pending_verify is None
    c.verify([1, 2], toks, [2, 1])
    pending = c.pending_verify
    assert pending["slot"].tolist() == [1, 2] and pending["drafts"].tolist() == [2, 1]
    pending["slot"][0] = 3  # a copy: the cache's own rows stay
    assert c.pending_verify["slot"].tolist() == [1, 2]
    c.commit([1, 0])
    assert c.pending_verify is None
    with refused(c, InputError, "no verify to commit"):
        c.commit([1, 0])
    c.verify([1, 2], busy.tokens(2, 2), [2, 1])
    with refused(c, InputError, "flush: the last verify is not committed yet"):
        c.flush([0])
    c.commit([0, 0])
    with refused(c, InputError, "no verify to commit"):
        c.commit([0, 0])


@pytest.mark.parametrize("accepted,index,value,drafted", [([3, 0], 0, 3, 2), ([0, 2], 1, 2, 1), ([-1, 0], 0, -1, 2)])
def test_accepted_beyond_drafted(busy, accepted, index, value, drafted):
    c = busy.cache
    toks = busy.tokens(2, 2)
    out = c.verify([1, 3], toks, [2, 1])
    with refused(c, InputError, f"accepted[{index}] = {value} but {drafted} drafted", "0 <= accepted <= drafted"):
        c.commit(accepted)
    with refused(c, InputError, "accepted: length 1 != batch rows 2"):
        c.commit([0])
    # The pending verify survives the refused commits; a good commit still equals the oracle.
    c.commit([2, 1])
    for b, (s, a) in enumerate(((1, 2), (3, 1))):
        o, busy.state[s] = plain_recurrence(busy.decl, SHAPE, {k: v[b, :a] for k, v in toks.items()},
                                            busy.params, busy.state[s])
        assert_close(out[b, :a], o, 1e-9, f"verify slot {s}")
    busy.check_all()


# -- load -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["load", "load_conventional"])
def test_load_states_of_wrong_shape(busy, op):
    good = (2, SHAPE.heads, SHAPE.v_dim, SHAPE.k_dim)
    for shape in [(1,) + good[1:], good[:3] + (SHAPE.k_dim + 1,), (2, SHAPE.heads, SHAPE.k_dim, SHAPE.v_dim),
                  good[1:]]:
        with refused(busy.cache, InputError, "states: expected shape [2, 4, 6, 5]", f"got {list(shape)}"):
            getattr(busy.cache, op)([0, 1], np.zeros(shape))


def test_load_non_finite_or_integer_states(busy):
    states = random_state(SHAPE, busy.rng, (2,))
    states[1, 3, 5, 4] = np.nan
    with refused(busy.cache, InputError, "states: non-finite value", "[1, 3, 5, 4]"):
        busy.cache.load([0, 1], states)
    with refused(busy.cache, InputError, "states: dtype int64 not accepted"):
        busy.cache.load([0, 1], np.zeros((2, SHAPE.heads, SHAPE.v_dim, SHAPE.k_dim), np.int64))


# -- construction -----------------------------------------------------------------------------------
@pytest.mark.parametrize("slots", [0, -1, 2.0, None, "4"])
def test_slots_not_positive(slots):
    decl = variants.get("deltanet")
    with pytest.raises(ConfigError, match=r"slots: must be a positive int"):
        CpuReplayCache(decl, SHAPE, CONFIG, slots=slots, params={})


@pytest.mark.parametrize("pages", [0, 3, -1, 4.0])
def test_pages_fewer_than_slots(pages):
    decl = variants.get("deltanet")
    with pytest.raises(ConfigError, match=r"pages: must be an int >= slots=4"):
        CpuReplayCache(decl, SHAPE, CONFIG, slots=4, params={}, pages=pages)


def test_unknown_precision():
    with pytest.raises(ConfigError, match=r"precision: 'float16'"):
        CpuReplayCache(variants.get("deltanet"), SHAPE, CONFIG, slots=1, params={}, precision="float16")


# -- a long random sequence of good and bad calls ---------------------------------------------------
BAD_CALLS = ["dup", "range", "nan", "drafts", "commit", "accepted", "shape", "load"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), plan=st.lists(st.tuples(st.sampled_from(BAD_CALLS), st.booleans()),
                                                    min_size=1, max_size=10))
def test_refused_calls_interleaved_with_good_ones_never_change_any_state(seed, plan):
    """Good steps between refused calls keep matching the oracle: nothing leaked from a bad call."""
    b = Busy(seed)
    c = b.cache
    for bad, good_after in plan:
        toks = b.tokens(2)
        if bad == "dup":
            with refused(c, InputError, "appears twice"):
                c.step([3, 3], toks)
        elif bad == "range":
            with refused(c, InputError, "out of range"):
                c.step([0, SLOTS + 1], toks)
        elif bad == "nan":
            toks["b"][0, 0] = np.nan
            with refused(c, InputError, "non-finite"):
                c.step([0, 1], toks)
        elif bad == "drafts":
            with refused(c, CapacityError, "capacity"):
                c.verify([0, 1], b.tokens(2, 4), [4, 1])
        elif bad == "commit":
            with refused(c, InputError, "no verify to commit"):
                c.commit([0, 0])
        elif bad == "accepted":
            vt = b.tokens(2, 2)
            c.verify([2, 0], vt, [1, 2])
            with refused(c, InputError, "drafted"):
                c.commit([2, 2])
            c.commit([0, 0])
        elif bad == "shape":
            toks["k"] = toks["k"][:, :1]
            with refused(c, InputError, "expected shape"):
                c.step([1, 2], toks)
        elif bad == "load":
            with refused(c, InputError, "states"):
                c.load([1], np.zeros((1, SHAPE.heads, SHAPE.v_dim, SHAPE.k_dim + 1)))
        if good_after:
            b.step([3, 1, 0, 2])
    b.check_all()


# -- a pending verify that folded the buffer ------------------------------------------------------------
@pytest.mark.parametrize("then", ["step", "materialize", "verify", "flush"])
def test_operation_while_a_folding_verify_is_pending_is_refused_or_harmless(then):
    """Drive slot 2 to fill 6 (capacity 7), verify 3 drafts (6 + 3 > 7: the buffer is folded first)
    and, without committing, call another operation. It must either be refused (and change
    nothing) or behave as if the verify had been rejected (commit of 0 drafts)."""
    b = Busy(5)
    c = b.cache
    vt = b.tokens(1, 3)
    c.verify([2], vt, [3])
    c.commit([3])  # 3 + 3 = 6
    _, b.state[2] = plain_recurrence(b.decl, SHAPE, {k: v[0] for k, v in vt.items()}, b.params, b.state[2])
    assert c.fills()[2] == 6
    c.verify([2], b.tokens(1, 3), [3])  # folds the 6 records before writing the drafts; fill stays 6
    before = buffers_snapshot(c)
    try:
        if then == "step":
            b.step([2])
        elif then == "materialize":
            got = c.materialize([2])[0]
            assert_close(got, b.state[2], 1e-9, "materialize with a verify pending")
        elif then == "verify":
            vt = b.tokens(1, 1)
            out = c.verify([2], vt, [1])
            c.commit([1])
            o, b.state[2] = plain_recurrence(b.decl, SHAPE, {k: v[0] for k, v in vt.items()}, b.params, b.state[2])
            assert_close(out[0], o, 1e-9, "second verify")
        else:
            c.flush([2])
    except InputError as exc:
        assert "not committed yet" in str(exc)
        assert_same(before, c, "refused while a verify is pending")
        return
    pytest.fail(f"{then} ran while a verify was pending")
