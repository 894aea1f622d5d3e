"""Runtime layer tests: every misuse of SlotPool / PySlotPool raises the right error, naming the problem.

Each test runs on both classes (the compiled pool and its pure-Python twin), so the two also agree
on error types and messages. A refused call must leave the pool unchanged.

May import: NumPy, pytest, ``replayssm_dsl.errors``, ``replayssm_dsl.runtime.bookkeeping``.
"""

from __future__ import annotations

import importlib
import re
import sys

import numpy as np
import pytest

from replayssm_dsl.errors import CapacityError, ConfigError, InputError
from replayssm_dsl.runtime.bookkeeping import PySlotPool, SlotPool


@pytest.fixture(params=[SlotPool, PySlotPool], ids=["cython", "python"])
def Pool(request):
    return request.param


def i32(*values):
    return np.array(values, dtype=np.int32)


def live_pool(Pool, live=3, slots=512, pages=600, window=4, max_drafts=4):
    pool = Pool(slots, pages, window, max_drafts)
    for _ in range(live):
        pool.allocate()
    return pool


def snapshot(pool):
    live = pool.live_slots().tolist()
    return (live, [pool.page_of(s) for s in live], [pool.fill_of(s) for s in live],
            [pool.refcount_of(p) for p in range(pool.pages)], pool.free_slot_count(), pool.free_page_count())


# -- construction and slot lifetime ---------------------------------------------------------------
def test_pages_fewer_than_slots(Pool):
    with pytest.raises(ConfigError, match=r"pages = 3 must be >= slots = 4"):
        Pool(4, 3, 16, 8)
    with pytest.raises(ValueError, match="window"):
        Pool(4, 4, 0, 8)


def test_slot_pool_exhausted(Pool):
    pool = live_pool(Pool, live=2, slots=2, pages=4)
    with pytest.raises(CapacityError, match=r"no free slot: all 2 slots are in use"):
        pool.allocate()
    with pytest.raises(CapacityError, match=r"no free slot: all 2 slots are in use"):
        pool.fork(0)


def test_page_pool_exhausted_by_copy_on_write_flushes(Pool):
    # Three slots share one page; with window 1 every step flushes, and each sharer needs a fresh
    # page (a flush in place would clobber the page the others read). Only two are free.
    pool = Pool(3, 3, 1, 2)
    parent = pool.allocate()
    children = [pool.fork(parent), pool.fork(parent)]
    before = snapshot(pool)
    with pytest.raises(CapacityError, match=r"no free page .* needs 3 fresh pages, 2 are free"):
        pool.build_step(i32(parent, *children), 3)
    assert snapshot(pool) == before
    slot, src, dst = pool.build_step(i32(parent, children[0]), 2)  # two fit
    assert src.tolist() == [0, 0] and sorted(dst.tolist()) == [1, 2]
    pool.report_step()
    assert pool.refcount_of(0) == 1 and pool.page_of(children[1]) == 0


def test_free_twice(Pool):
    pool = live_pool(Pool, live=4)
    pool.free(3)
    with pytest.raises(InputError, match=r"slot 3 is not allocated"):
        pool.free(3)


def test_fork_free_slot(Pool):
    pool = live_pool(Pool, live=2)
    with pytest.raises(InputError, match=r"fork\(\): slot 5 is not allocated"):
        pool.fork(5)


def test_slot_out_of_range(Pool):
    pool = live_pool(Pool)
    with pytest.raises(InputError, match=r"slot 900 is out of range \[0, 512\)"):
        pool.free(900)
    with pytest.raises(InputError, match=r"slot -1 is out of range"):
        pool.page_of(-1)
    with pytest.raises(InputError, match=r"requests\[1\] = 900 is out of range \[0, 512\)"):
        pool.build_step(i32(0, 900), 4)
    with pytest.raises(InputError, match=r"page 600 is out of range \[0, 600\)"):
        pool.refcount_of(600)


@pytest.mark.parametrize("op", ["free", "fork", "page_of", "fill_of", "prepare_load"])
@pytest.mark.parametrize("bad, shown", [(True, "True"), (np.bool_(False), "np.False_"), (1.0, "float"),
                                        (None, "NoneType")])
def test_a_slot_that_is_no_integer_is_refused(Pool, op, bad, shown):
    """A bool is an int to Python (``operator.index(True) == 1``): taken as a slot, ``free(True)`` would
    free slot 1 and ``fork(True)`` fork it. Bools and non-integers are refused, and nothing changes."""
    pool = live_pool(Pool)
    before = snapshot(pool)
    with pytest.raises(InputError, match=re.escape(f"{op}(): expected a slot number (int), got {shown}")):
        getattr(pool, op)(bad)
    assert snapshot(pool) == before

# -- batches -----------------------------------------------------------------------------------------
def test_unknown_slot_in_batch(Pool):
    pool = live_pool(Pool)
    with pytest.raises(InputError, match=r"requests\[2\] = 7 is not an allocated slot"):
        pool.build_step(i32(0, 1, 7), 4)
    with pytest.raises(InputError, match=r"requests\[0\] = 7 is not an allocated slot"):
        pool.build_verify(i32(7), i32(1), 4)


def test_duplicate_slot_in_batch(Pool):
    pool = live_pool(Pool, live=8)
    with pytest.raises(InputError, match=r"slot 7 appears twice in requests \(requests\[1\] and requests\[3\]\)"):
        pool.build_step(i32(0, 7, 2, 7), 8)
    with pytest.raises(InputError, match=r"slot 7 appears twice in requests"):
        pool.build_verify(i32(7, 7), i32(1, 1), 8)


def test_more_requests_than_batch_size(Pool):
    pool = live_pool(Pool)
    with pytest.raises(InputError, match=r"batch_size = 2 is smaller than the number of requests \(3\)"):
        pool.build_step(i32(0, 1, 2), 2)
    with pytest.raises(InputError, match=r"batch_size"):
        pool.build_verify(i32(0, 1, 2), i32(1, 1, 1), 1)


@pytest.mark.parametrize("bad", [0, -3, 5])
def test_drafts_out_of_range(Pool, bad):
    pool = live_pool(Pool)
    with pytest.raises(InputError, match=rf"drafts\[1\] = {bad} is out of range \[1, 4\]"):
        pool.build_verify(i32(0, 1), i32(2, bad), 2)


def test_drafts_length_mismatch(Pool):
    pool = live_pool(Pool)
    with pytest.raises(InputError, match=r"drafts has length 1, expected 2"):
        pool.build_verify(i32(0, 1), i32(2), 2)


def test_accepted_exceeds_drafted(Pool):
    pool = live_pool(Pool)
    pool.build_verify(i32(0, 1), i32(3, 2), 4)
    with pytest.raises(InputError, match=r"accepted\[1\] = 3 exceeds drafts\[1\] = 2 \(slot 1\)"):
        pool.commit(i32(3, 3))
    with pytest.raises(InputError, match=r"accepted\[0\] = -1 is negative"):
        pool.commit(i32(-1, 0))
    pool.commit(i32(3, 2))  # the refused commits changed nothing; the batch is still pending
    assert (pool.fill_of(0), pool.fill_of(1)) == (3, 2)


def test_accepted_length_mismatch(Pool):
    pool = live_pool(Pool)
    pool.build_verify(i32(0, 1), i32(3, 2), 4)
    with pytest.raises(InputError, match=r"accepted has length 4, expected 2 \(one per request"):
        pool.commit(i32(1, 1, 0, 0))  # the padded length is wrong: one entry per request


@pytest.mark.parametrize("requests, what", [
    (np.array([0, 1], np.int64), "dtype int64"),
    (np.array([0.0, 1.0]), "dtype float64"),
    (np.array([0, 1], ">i4"), "dtype >i4"),
    (np.zeros((2, 1), np.int32), r"shape \(2, 1\)"),
    ([0, 1], "list"),
])
def test_wrong_request_arrays(Pool, requests, what):
    pool = live_pool(Pool)
    with pytest.raises(InputError, match=rf"requests must be a 1-D numpy int32 array, got {what}"):
        pool.build_step(requests, 4)
    with pytest.raises(InputError, match=rf"requests must be a 1-D numpy int32 array, got {what}"):
        pool.build_verify(requests, i32(1, 1), 4)
    with pytest.raises(InputError, match=r"drafts must be a 1-D numpy int32 array, got dtype int64"):
        pool.build_verify(i32(0, 1), np.array([1, 1], np.int64), 4)
    pool.build_verify(i32(0, 1), i32(1, 1), 4)
    with pytest.raises(InputError, match=r"accepted must be a 1-D numpy int32 array, got dtype int64"):
        pool.commit(np.array([1, 1], np.int64))


# -- protocol: build, then report / commit -----------------------------------------------------------
def test_build_without_report(Pool):
    pool = live_pool(Pool)
    pool.build_step(i32(0), 1)
    with pytest.raises(InputError, match=r"build_verify\(\): the last build_step batch was not finished; call report_step\(\)"):
        pool.build_verify(i32(0), i32(1), 1)
    with pytest.raises(InputError, match=r"free\(\): the last build_step batch was not finished"):
        pool.free(0)
    with pytest.raises(InputError, match=r"commit\(\): the pending batch came from build_step; call report_step\(\)"):
        pool.commit(i32(0))
    pool.report_step()
    pool.build_verify(i32(0), i32(1), 1)
    with pytest.raises(InputError, match=r"build_step\(\): the last build_verify batch was not finished; call commit"):
        pool.build_step(i32(0), 1)


def test_finish_without_build(Pool):
    pool = live_pool(Pool)
    with pytest.raises(InputError, match=r"report_step\(\): no build_step batch is pending"):
        pool.report_step()
    with pytest.raises(InputError, match=r"commit\(\): no build_verify batch is pending"):
        pool.commit(i32())


def test_refused_build_leaves_state_unchanged(Pool):
    pool = live_pool(Pool, live=6, slots=8, pages=8, window=2)
    pool.fork(0)  # slot 6 shares slot 0's page
    for _ in range(1):
        pool.build_step(i32(0, 1, 6), 3)
        pool.report_step()
    before = snapshot(pool)
    with pytest.raises(InputError, match="appears twice"):
        pool.build_step(i32(0, 6, 1, 2, 1), 8)  # rows 0 and 6 would reserve fresh pages
    with pytest.raises(InputError, match="drafts"):
        pool.build_verify(i32(0, 6, 1), i32(8, 1, 0), 8)
    assert snapshot(pool) == before
    pool.build_step(i32(0, 6), 2)
    pool.report_step()
    assert pool.page_of(0) != pool.page_of(6) and pool.fill_of(0) == pool.fill_of(6) == 0


# -- output buffers ------------------------------------------------------------------------------------
def test_output_buffers_are_reused(Pool):
    pool = live_pool(Pool)
    first = pool.build_step(i32(0, 1), 4)
    pool.report_step()
    second = pool.build_step(i32(2), 4)
    pool.report_step()
    assert all(a is b for a, b in zip(first, second))
    assert first[0].tolist() == [2, -1, -1, -1]


def test_caller_owned_step_buffers(Pool):
    pool = live_pool(Pool)
    buffers = [np.full(6, 99, np.int32) for _ in range(4)]
    pool.set_step_buffers(*buffers)
    slot, src, dst, drafts = pool.build_verify(i32(1, 0), i32(2, 3), 4)
    assert np.shares_memory(slot, buffers[0]) and np.shares_memory(drafts, buffers[3])
    assert buffers[0].tolist() == [1, 0, -1, -1, 99, 99] and buffers[3].tolist() == [2, 3, 0, 0, 99, 99]
    pool.commit(i32(0, 0))
    with pytest.raises(InputError, match=r"batch_size = 7 exceeds the length 6 of the step buffers"):
        pool.build_step(i32(0), 7)
    with pytest.raises(InputError, match=r"src_page must be C-contiguous and writeable"):
        pool.set_step_buffers(buffers[0], np.zeros(12, np.int32)[::2], buffers[2], buffers[3])
    with pytest.raises(InputError, match=r"must have the same length, got 6, 6, 6, 5"):
        pool.set_step_buffers(*buffers[:3], np.zeros(5, np.int32))
    pool.set_step_buffers()
    assert pool.build_step(i32(0), 7)[0].shape == (7,)


def test_missing_extension_is_reported(monkeypatch):
    monkeypatch.setitem(sys.modules, "replayssm_dsl.runtime._bookkeeping", None)
    monkeypatch.delitem(sys.modules, "replayssm_dsl.runtime.bookkeeping")
    with pytest.raises(ImportError, match=r"not built.*pip install -e \."):
        importlib.import_module("replayssm_dsl.runtime.bookkeeping")
