"""Runtime layer tests: a batch's pages, indices and output arrays, and values the kernels' dtypes
cannot hold, are refused by ``CpuReplayCache`` naming the argument, before any kernel runs, and leave
every buffer as it was.

May import: NumPy, pytest, ``replayssm_dsl``, ``replayssm_dsl.runtime.cpu_cache``, tests helpers.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from busy_cache import CONFIG, PAGES, SHAPE, SLOTS, Busy, slot_ops, refused
from replayssm_dsl import variants
from replayssm_dsl.bfloat16 import bfloat16_bits
from replayssm_dsl.errors import ConfigError, InputError
from replayssm_dsl.random_inputs import random_params, random_state, random_tokens
from replayssm_dsl.reference import plain_recurrence
from replayssm_dsl.runtime.cpu_cache import CpuReplayCache
from twin import assert_close, buffers_snapshot


@pytest.fixture
def busy():
    return Busy()


# -- pages ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["step", "verify", "flush", "materialize"])
@pytest.mark.parametrize("page", [PAGES, -1, 1000])
def test_src_pages_out_of_range(busy, op, page):
    with refused(busy.cache, InputError, f"src_pages[1] = {page} is out of range [0, {PAGES})"):
        slot_ops(busy, [0, 1], src_pages=[4, page])[op]()


@pytest.mark.parametrize("op", ["step", "verify", "flush", "load"])
def test_dst_pages_out_of_range(busy, op):
    with refused(busy.cache, InputError, f"dst_pages[0] = {PAGES} is out of range [0, {PAGES})"):
        slot_ops(busy, [2, 3], src_pages=[2, 3], dst_pages=[PAGES, 5])[op]()


def test_pages_of_wrong_length(busy):
    with refused(busy.cache, InputError, "src_pages: length 1 != batch rows 2"):
        busy.cache.step([0, 1], busy.tokens(2), src_pages=[0])


def test_padded_rows_ignore_pages_and_touch_nothing(busy):
    """A null slot's page and tokens are not read; the live rows still match the oracle."""
    toks = busy.tokens(3)
    before = buffers_snapshot(busy.cache)
    out = busy.cache.step([-1, 0, -1], toks, src_pages=[-7, 0, 99])
    busy_o, busy.state[0] = plain_recurrence(busy.decl, SHAPE, {k: v[1:2] for k, v in toks.items()},
                                             busy.params, busy.state[0])
    assert_close(out[1], busy_o[0], 1e-9, "live row beside padding")
    for name in ("checkpoint", "rec_write", "rec_key", "rec_decay"):
        assert np.array_equal(busy.cache.buffers[name][1:], before[name][1:]), name
    busy.check_all()


@pytest.mark.parametrize("op", ["step", "materialize"])
def test_out_of_wrong_shape(busy, op):
    bad = np.zeros((2, 1, SHAPE.heads, SHAPE.v_dim + 1))
    call = {"step": lambda: busy.cache.step([0, 1], busy.tokens(2), out=bad),
            "materialize": lambda: busy.cache.materialize([0, 1], out=bad)}[op]
    with refused(busy.cache, InputError, "out: expected shape"):
        call()




@pytest.mark.parametrize("op", ["step", "verify", "flush"])
def test_two_rows_moving_to_one_page(busy, op):
    """Two copy-on-write rows given one fresh page: the second would overwrite the first's fold."""
    with refused(busy.cache, InputError, "dst_pages[1] = 4 is also dst_pages[0]", "two rows would write"):
        slot_ops(busy, [0, 1], src_pages=[0, 1], dst_pages=[4, 4])[op]()


@pytest.mark.parametrize("op", ["step", "verify", "flush"])
def test_a_row_moving_onto_the_page_another_row_reads(busy, op):
    with refused(busy.cache, InputError, "dst_pages[0] = 1 is src_pages[1]", "row 0 would overwrite"):
        slot_ops(busy, [0, 1], src_pages=[0, 1], dst_pages=[1, 5])[op]()


def test_loads_into_one_page(busy):
    with refused(busy.cache, InputError, "dst_pages[1] = 5 is also dst_pages[0]"):
        slot_ops(busy, [0, 1], dst_pages=[5, 5])["load"]()


def test_flushes_in_place_of_two_rows_sharing_a_page(busy):
    """A flush writes every row's page: two slots folding their own records into one shared page."""
    with refused(busy.cache, InputError, "dst_pages[1] = 2 is also dst_pages[0]"):
        busy.cache.flush([1, 2], src_pages=[2, 2])


def test_rows_sharing_a_page_they_only_read_are_served(busy):
    """Slots 0 and 1 both read page 0 (as forked slots do) and neither buffer fills: nothing writes a
    checkpoint, so the batch is served, each row from page 0 and its own records."""
    busy.cache.flush([1])
    checkpoint0 = busy.cache.checkpoint(0)
    toks = busy.tokens(2)
    out = busy.cache.step([0, 1], toks, src_pages=[0, 0])
    # row 1: page 0's checkpoint and slot 1's empty buffer, so exactly page 0's state stepped
    want, _ = plain_recurrence(busy.decl, SHAPE, {k: v[1:2] for k, v in toks.items()}, busy.params, checkpoint0)
    assert_close(out[1], want[0], 1e-9, "row 1 read from page 0")
    assert np.array_equal(busy.cache.checkpoint(0), checkpoint0)


# -- indices that do not fit the kernels' int32 -------------------------------------------------------
@pytest.mark.parametrize("slots,index", [([2**32], 0), ([1, 2**32 + 1], 1), (np.array([2**32 - 1], np.uint32), 0),
                                         ([-(2**32) + 1], 0)])
def test_slots_beyond_int32_do_not_wrap_round(busy, slots, index):
    with refused(busy.cache, InputError, f"slots[{index}] = {int(np.asarray(slots)[index])} does not fit in int32"):
        busy.cache.flush(slots)


def test_a_bool_among_the_indices_is_no_index(busy):
    """NumPy reads ``[True, 2]`` as the int64 array ``[1, 2]``: a bool in a list of slots, pages,
    drafts or accepted counts would be served as row 1 or 0. It is refused, naming its place."""
    with refused(busy.cache, InputError, "slots[0] = True: expected an int, got a bool"):
        busy.cache.step([True, 2], busy.tokens(2))
    with refused(busy.cache, InputError, "src_pages[1] = False: expected an int, got a bool"):
        busy.cache.materialize((0, 1), src_pages=(0, np.bool_(False)))
    with refused(busy.cache, InputError, "drafts[0] = True: expected an int, got a bool"):
        busy.cache.verify([0, 1], busy.tokens(2, 2), [True, 2])
    busy.cache.verify([0, 1], busy.tokens(2, 2), [2, 2])
    with refused(busy.cache, InputError, "accepted[1] = True: expected an int, got a bool"):
        busy.cache.commit([0, True])
    busy.cache.commit([0, 1])

def test_pages_drafts_and_accepted_beyond_int32_do_not_wrap_round(busy):
    with refused(busy.cache, InputError, f"src_pages[0] = {2**32 + 5} does not fit in int32"):
        busy.cache.materialize([0], src_pages=[2**32 + 5])
    with refused(busy.cache, InputError, f"drafts[0] = {2**32 + 2} does not fit in int32"):
        busy.cache.verify([0], busy.tokens(1, 2), [2**32 + 2])
    busy.cache.verify([0], busy.tokens(1, 2), [2])
    with refused(busy.cache, InputError, f"accepted[0] = {2**32 + 1} does not fit in int32"):
        busy.cache.commit([2**32 + 1])
    busy.cache.commit([0])


@pytest.mark.parametrize("parent,child,fragment", [(0, -1, "child = -1 is out of range"),
                                                   (-1, 0, "parent = -1 is out of range"),
                                                   (0, SLOTS, f"child = {SLOTS} is out of range [0, {SLOTS})"),
                                                   (True, 1, "parent: expected a slot index (int), got True"),
                                                   (0, 1.0, "child: expected a slot index (int), got float")])
def test_copy_records_takes_two_slots_in_range(busy, parent, child, fragment):
    with refused(busy.cache, InputError, fragment):
        busy.cache.copy_records(parent, child)


def test_copy_records_takes_numpy_ints(busy):
    busy.cache.copy_records(np.int64(3), np.int32(0))
    assert list(busy.cache.fills()) == [3, 2, 3, 3]


# -- output arrays ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float16, np.complex128])
def test_out_of_a_dtype_that_would_truncate(busy, dtype):
    bad = np.zeros((2, 1, SHAPE.heads, SHAPE.v_dim), dtype)
    with refused(busy.cache, InputError, f"out: dtype {np.dtype(dtype).name} not accepted", "float32 or float64"):
        busy.cache.step([0, 1], busy.tokens(2), out=bad)


def test_out_that_is_not_an_array(busy):
    with refused(busy.cache, InputError, "out: expected a NumPy array", "got list"):
        busy.cache.materialize([0], out=[[0.0]])


def test_read_only_out_of_a_folding_verify_changes_no_checkpoint(busy):
    """Slot 3 at fill 6 (three drafts accepted) drafts three more, past the capacity of 7, so its
    verify folds before it writes outputs: a read-only ``out`` is refused before that fold."""
    toks = busy.tokens(1, 3)
    busy.cache.verify([3], toks, [3])
    busy.cache.commit([3])
    _, busy.state[3] = plain_recurrence(busy.decl, SHAPE, {k: v[0] for k, v in toks.items()}, busy.params, busy.state[3])
    assert busy.cache.fills()[3] == 6
    out = np.zeros((1, 3, SHAPE.heads, SHAPE.v_dim))
    out.flags.writeable = False
    with refused(busy.cache, InputError, "out: is read-only"):
        busy.cache.verify([3], busy.tokens(1, 3), [3], out=out)
    busy.check_all()


@pytest.mark.parametrize("lead", [(2, 1), (2,)], ids=["kernel-layout", "as-returned"])
def test_float32_out_of_a_float64_cache_is_filled(busy, lead):
    """A step's ``out`` may have the kernels' shape ``[B, 1, HV, V]`` or the returned ``[B, HV, V]``."""
    out = np.full(lead + (SHAPE.heads, SHAPE.v_dim), np.nan, np.float32)
    toks = busy.tokens(2)
    got = busy.cache.step([0, 1], toks, out=out)
    assert got.dtype == np.float32 and np.isfinite(out).all() and np.shares_memory(got, out)
    for b in range(2):
        want, busy.state[b] = plain_recurrence(busy.decl, SHAPE, {k: v[b:b + 1] for k, v in toks.items()},
                                               busy.params, busy.state[b])
        assert_close(got[b], want[0], 1e-5, f"row {b}")


def test_conventional_step_takes_an_out_of_the_shape_it_returns():
    one, other = Busy(seed=6), Busy(seed=6)  # the same caches and the same random stream
    toks = one.tokens(2)
    out = np.full((2, SHAPE.heads, SHAPE.v_dim), np.nan)
    got = one.cache.conventional_step([0, 1], toks, out=out)
    assert np.shares_memory(got, out) and np.isfinite(out).all()
    np.testing.assert_array_equal(out, other.cache.conventional_step([0, 1], other.tokens(2)))

# -- values the kernels' dtypes cannot hold --------------------------------------------------------
def test_token_beyond_float32_is_refused_not_made_inf(busy):
    toks = busy.tokens(2)
    toks["v"][1, 2, 3] = 1e39
    with refused(busy.cache, InputError, "tokens['v']: value 1e+39 at index [1, 2, 3] overflows float32"):
        busy.cache.step([0, 1], toks)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_token_declared_bf16_beyond_bf16_is_refused_as_overflowing_it(dtype):
    """3.4e38 is a finite float32 that rounds to bf16's inf: refused as overflowing bfloat16 (it was
    called a non-finite value, which the caller never passed); an inf is still called non-finite."""
    decl = variants.get("gdn").with_token_dtype("bfloat16")
    rng = np.random.default_rng(4)
    cache = CpuReplayCache(decl, SHAPE, CONFIG, slots=2, params=random_params(decl, SHAPE, rng))
    toks = {k: v.astype(dtype) for k, v in random_tokens(decl, SHAPE, rng, (2,)).items()}
    toks["a"][1, 2] = 3.4e38
    with refused(cache, InputError, "tokens['a']: value ", " at index [1, 2] overflows bfloat16"):
        cache.step([0, 1], toks)
    toks["a"][1, 2] = -np.inf
    with refused(cache, InputError, "tokens['a']: non-finite value -inf at index [1, 2]"):
        cache.step([0, 1], toks)
    bits = {k: bfloat16_bits(np.where(np.isfinite(v), v, 0.0)) for k, v in toks.items()}
    bits["a"][1, 2] = 0x7F80  # +inf's bits: raw bits are no float that overflowed
    with refused(cache, InputError, "tokens['a']: non-finite value inf at index [1, 2]"):
        cache.step([0, 1], bits)

def test_param_beyond_float32_is_refused():
    decl = variants.get("gdn")
    params = random_params(decl, SHAPE, np.random.default_rng(1))
    params["dt_bias"][2] = -1e39
    with pytest.raises(InputError, match=r"params\['dt_bias'\]: value -1e\+39 at index \[2\] overflows float32"):
        CpuReplayCache(decl, SHAPE, CONFIG, slots=2, params=params, precision="float32")


@pytest.mark.parametrize("state_dtype,value", [("float32", 1e39), ("float16", 7e4), ("bfloat16", 3.4e38)])
def test_state_beyond_the_checkpoints_dtype_is_refused(state_dtype, value):
    decl = variants.get("gdn")
    rng = np.random.default_rng(2)
    config = dataclasses.replace(CONFIG, state_dtype=state_dtype)
    cache = CpuReplayCache(decl, SHAPE, config, slots=2, params=random_params(decl, SHAPE, rng))
    states = random_state(SHAPE, rng, (2,))
    states[0, 1, 2, 3] = value
    before = buffers_snapshot(cache)
    for load in (cache.load, cache.load_conventional):
        with pytest.raises(InputError, match=rf"states: value .* at index \[0, 1, 2, 3\] overflows {state_dtype}"):
            load([0, 1], states)
    assert all(np.array_equal(before[k], cache.buffers[k], equal_nan=True) for k in before)
    states[0, 1, 2, 3] = 1.0
    cache.load([0, 1], states)  # in range: taken


@pytest.mark.parametrize("value,dtype", [(np.array([1 + 2j] * 4), "complex128"), (np.array([True] * 4), "bool"),
                                         (np.array(["1"] * 4), "<U1")])
def test_params_that_are_not_real_numbers(value, dtype):
    decl = variants.get("gdn")
    params = random_params(decl, SHAPE, np.random.default_rng(3))
    params["A_log"] = value
    with pytest.raises(InputError, match=rf"params\['A_log'\]: dtype {dtype} not accepted; use real numbers"):
        CpuReplayCache(decl, SHAPE, CONFIG, slots=2, params=params)


# -- containers and counts --------------------------------------------------------------------------
@pytest.mark.parametrize("tokens", [None, [1, 2], "q"])
def test_tokens_that_are_not_a_dict(busy, tokens):
    with refused(busy.cache, InputError, "tokens: expected a dict of arrays by input name", "'q', 'k'"):
        busy.cache.step([0], tokens)


def test_a_token_that_is_not_an_array(busy):
    toks = busy.tokens(1)
    toks["a"] = toks["a"].tolist()
    with refused(busy.cache, InputError, "tokens['a']: expected an array", "got list"):
        busy.cache.step([0], toks)


@pytest.mark.parametrize("op", ["conventional_step", "snapshot_verify", "load_conventional"])
def test_baselines_name_themselves_while_a_verify_is_pending(busy, op):
    busy.cache.verify([0], busy.tokens(1, 2), [2])
    with refused(busy.cache, InputError, f"{op}: the last verify is not committed yet"):
        slot_ops(busy, [1])[op]()


def test_numpy_counts_are_taken_and_bools_are_not():
    decl = variants.get("deltanet")
    cache = CpuReplayCache(decl, SHAPE, CONFIG, slots=np.int64(4), params={}, pages=np.int32(6))
    assert (cache.num_slots, cache.num_pages) == (4, 6) and type(cache.num_slots) is int
    with pytest.raises(ConfigError, match=r"pages: must be an int >= slots=4, got True"):
        CpuReplayCache(decl, SHAPE, CONFIG, slots=4, params={}, pages=True)


def test_a_load_onto_swapped_pages_is_no_clash():
    """A load reads no page, so two rows writing each other's default pages clash with nothing."""
    decl, rng = variants.get("gdn"), np.random.default_rng(8)
    cache = CpuReplayCache(decl, SHAPE, CONFIG, slots=2, pages=4, params=random_params(decl, SHAPE, rng))
    states = random_state(SHAPE, rng, (2,))
    cache.load([0, 1], states, dst_pages=[1, 0])
    assert_close(cache.materialize([0, 1], src_pages=[1, 0]), states, 1e-12, "the loaded states, by their pages")


def test_padding_rows_of_a_verify_take_no_drafts():
    """A padding row (slot -1) of a verify may carry any draft count: it is zeroed, not checked."""
    decl, rng = variants.get("gdn"), np.random.default_rng(9)
    cache = CpuReplayCache(decl, SHAPE, CONFIG, slots=2, params=random_params(decl, SHAPE, rng))
    cache.load([0, 1], random_state(SHAPE, rng, (2,)))
    out = cache.verify([0, -1], random_tokens(decl, SHAPE, rng, (2, 2)), [2, 7])
    assert np.isfinite(out[0]).all() and np.isnan(out[1]).all()
    assert cache.pending_verify["drafts"].tolist() == [2, 0]
    cache.commit([1, 0])
