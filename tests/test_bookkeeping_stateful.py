"""Runtime layer tests: SlotPool (Cython) and PySlotPool (its pure-Python twin) driven side by side.

A Hypothesis state machine allocates, forks, frees, loads and runs decode / speculative steps on both
pools, including invalid calls, and checks that both return identical arrays, raise the same error
with the same message, and keep identical mirrors. A small simulated device executes each batch the
way the kernels would (checkpoint pages as token tuples, per-slot record lists) and checks that every
sequence still reads back exactly its own history: copy-on-write is never violated, a flush never
writes a page another row reads, fills follow ``lowering/buffer_rules.py`` and never exceed capacity.

May import: NumPy, Hypothesis, pytest, ``replayssm_dsl.runtime.bookkeeping``,
``replayssm_dsl.lowering.buffer_rules``.
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from replayssm_dsl.lowering import buffer_rules
from replayssm_dsl.runtime.bookkeeping import PySlotPool, SlotPool

INVALID_REQUESTS = ["out_of_range", "free_slot", "duplicate", "batch_too_small", "wrong_dtype", "two_d"]
# Mostly valid batches (None), so that fills advance far enough to flush; sometimes an invalid one.
STEP_KINDS = st.sampled_from([None] * 12 + INVALID_REQUESTS)
VERIFY_KINDS = st.sampled_from([None] * 12 + INVALID_REQUESTS + ["bad_drafts"])


def call_both(pools, method: str, *args):
    """Call ``method`` on both pools; both must return equal values or raise the same error."""
    outcomes = []
    for pool in pools:
        try:
            outcomes.append(("ok", getattr(pool, method)(*args)))
        except Exception as error:  # noqa: BLE001 - compared below
            outcomes.append(("error", error))
    (kind_c, value_c), (kind_p, value_p) = outcomes
    assert kind_c == kind_p, f"{method}: SlotPool -> {value_c!r}, PySlotPool -> {value_p!r}"
    if kind_c == "error":
        assert type(value_c) is type(value_p) and str(value_c) == str(value_p), (value_c, value_p)
        assert isinstance(value_c, ValueError), value_c
        return value_c
    if isinstance(value_c, tuple):
        assert len(value_c) == len(value_p)
        for array_c, array_p in zip(value_c, value_p):
            assert array_c.dtype == np.int32 and array_p.dtype == np.int32
            np.testing.assert_array_equal(array_c, array_p)
    else:
        assert value_c == value_p
    return value_c


class SlotPoolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tokens = itertools.count()

    @initialize(slots=st.integers(1, 6), extra_pages=st.integers(0, 3), window=st.integers(1, 5),
                max_drafts=st.integers(0, 4), data=st.data())
    def make_pools(self, slots, extra_pages, window, max_drafts, data):
        args = (slots, slots + extra_pages, window, max_drafts)
        self.pools = (SlotPool(*args), PySlotPool(*args))
        self.slots, self.window, self.max_drafts = slots, window, max_drafts
        self.capacity = buffer_rules.capacity(window, max_drafts)
        self.pages = slots + extra_pages
        # Simulated device and expectations: checkpoint contents per page, records and the full
        # token history per live slot, and the fill buffer_rules predicts.
        self.page_content: dict[int, tuple] = {}
        self.records: dict[int, list] = {}
        self.history: dict[int, tuple] = {}
        self.fill: dict[int, int] = {}
        # Start with some live and forked slots, so that steps meet shared pages early.
        for _ in range(data.draw(st.integers(0, slots))):
            self.allocate()
        for _ in range(data.draw(st.integers(0, slots))):
            self.fork(data)

    # -- helpers ----------------------------------------------------------------------------------
    def page(self, slot: int) -> int:
        return self.pools[1].page_of(slot)

    def sharers(self, page: int) -> int:
        return sum(1 for s in self.history if self.page(s) == page)

    def draw_requests(self, data, invalid: str | None):
        live = sorted(self.history)
        requests = data.draw(st.lists(st.sampled_from(live), unique=True) if live else st.just([]))
        requests = data.draw(st.permutations(requests))
        padding = data.draw(st.integers(0, 3))
        position = data.draw(st.integers(0, len(requests)))
        if invalid == "out_of_range":
            requests.insert(position, data.draw(st.sampled_from([-1, self.slots, self.slots + 100, -(2**31)])))
        elif invalid == "free_slot" and len(live) < self.slots:
            free = sorted(set(range(self.slots)) - set(live))
            requests.insert(position, data.draw(st.sampled_from(free)))
        elif invalid == "duplicate" and requests:
            requests.insert(position, data.draw(st.sampled_from(requests)))
        batch_size = len(requests) + padding
        if invalid == "batch_too_small" and requests:
            batch_size = len(requests) - 1
        array = np.array(requests, dtype=np.int64 if invalid == "wrong_dtype" else np.int32)
        if invalid == "two_d":
            array = array.reshape(1, -1)
        return array, batch_size

    def check_forbidden_while_pending(self, data):
        """A second build, or a slot-lifetime call, before report/commit is refused by both."""
        live = sorted(self.history)
        method, args = data.draw(st.sampled_from([
            ("build_step", (np.zeros(0, np.int32), 1)),
            ("build_verify", (np.zeros(0, np.int32), np.zeros(0, np.int32), 1)),
            ("allocate", ()), ("free", (live[0] if live else 0,)), ("fork", (live[0] if live else 0,)),
            ("prepare_load", (live[0] if live else 0,)),
        ]))
        error = call_both(self.pools, method, *args)
        assert isinstance(error, ValueError) and "was not finished" in str(error)

    def check_rows(self, slot, src, dst, batch_size, n, flushes_of):
        """Padding rows are null; a flush writes its own page only when no other slot shares it."""
        assert (slot[n:] == -1).all() and (src[n:] == -1).all() and (dst[n:] == -1).all()
        assert len(slot) == batch_size
        written = [int(d) for d, s in zip(dst[:n], src[:n]) if d != s]
        read = {int(p) for p in src[:n]}
        assert len(set(written)) == len(written) and not set(written) & read
        referenced = {self.page(s) for s in self.history}
        assert not set(written) & referenced, "a fresh page must not be referenced by any slot"
        for i in range(n):
            s, page = int(slot[i]), int(src[i])
            assert page == self.page(s)
            shared = self.sharers(page) > 1
            assert (dst[i] != src[i]) == (flushes_of(i) and shared)
            event("copy-on-write flush" if dst[i] != src[i] else "in-place flush" if flushes_of(i) else "append")

    # -- slot lifetime ----------------------------------------------------------------------------
    @rule()
    def allocate(self):
        result = call_both(self.pools, "allocate")
        if isinstance(result, Exception):
            assert len(self.history) == self.slots or self.pools[1].free_page_count() == 0
            return
        assert result not in self.history
        page = self.page(result)
        assert self.pools[1].refcount_of(page) == 1 and self.sharers(page) == 0
        self.page_content[page] = ()  # the caller zeroes (or loads) a fresh checkpoint
        self.records[result], self.history[result], self.fill[result] = [], (), 0

    @rule(data=st.data())
    def free(self, data):
        slot = data.draw(st.integers(-1, self.slots))
        error = call_both(self.pools, "free", slot)
        if slot in self.history:
            assert not isinstance(error, Exception)
            for table in (self.records, self.history, self.fill):
                del table[slot]
        else:
            assert "free(): slot" in str(error)

    @rule(data=st.data())
    def fork(self, data):
        live = sorted(self.history)
        parent = data.draw(st.sampled_from(live) if live and data.draw(st.booleans())
                           else st.integers(-1, self.slots))
        child = call_both(self.pools, "fork", parent)
        if isinstance(child, Exception):
            assert parent not in self.history or len(self.history) == self.slots
            return
        assert self.page(child) == self.page(parent) and self.sharers(self.page(parent)) >= 1
        self.records[child] = list(self.records[parent])  # the device copies the record rows
        self.history[child], self.fill[child] = self.history[parent], self.fill[parent]

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def prepare_load(self, data):
        slot = data.draw(st.sampled_from(sorted(self.history)))
        page = call_both(self.pools, "prepare_load", slot)
        if isinstance(page, Exception):
            assert self.pools[1].free_page_count() == 0
            return
        assert self.page(slot) == page and self.sharers(page) == 1
        self.page_content[page] = self.history[slot] = (("load", next(self.tokens)),)
        self.records[slot], self.fill[slot] = [], 0

    # -- steps ------------------------------------------------------------------------------------
    @rule(data=st.data(), invalid=STEP_KINDS)
    def decode_step(self, data, invalid):
        requests, batch_size = self.draw_requests(data, invalid)
        result = call_both(self.pools, "build_step", requests, batch_size)
        if isinstance(result, Exception):
            assert invalid is not None or "no free page" in str(result)
            event(f"build_step refused: {str(result).split(':')[0][:40]}")
            return
        slot, src, dst = (np.array(a) for a in result)
        n = len(requests)
        flushes = [buffer_rules.step_flushes(self.fill[int(s)], self.window) for s in slot[:n]]
        self.check_rows(slot, src, dst, batch_size, n, flushes.__getitem__)
        if data.draw(st.booleans()):
            self.check_forbidden_while_pending(data)
        if self.cancelled(data):
            return
        # The device runs the batch: every row reads before any row writes.
        new_content = {}
        for i in range(n):
            s, token = int(slot[i]), next(self.tokens)
            if flushes[i]:
                new_content[int(dst[i])] = self.page_content[int(src[i])] + tuple(self.records[s]) + (token,)
                self.records[s] = []
            else:
                self.records[s].append(token)
            self.history[s] += (token,)
            self.fill[s] = buffer_rules.fill_after_step(self.fill[s], self.window)
        self.page_content.update(new_content)
        call_both(self.pools, "report_step")

    @rule(data=st.data(), invalid=VERIFY_KINDS)
    def speculative_step(self, data, invalid):
        requests, batch_size = self.draw_requests(data, invalid)
        n = len(requests)
        drafts = data.draw(st.lists(st.integers(1, max(self.max_drafts, 1)), min_size=n, max_size=n))
        if invalid == "bad_drafts" and n:
            drafts[data.draw(st.integers(0, n - 1))] = data.draw(st.sampled_from([0, -1, self.max_drafts + 1]))
        result = call_both(self.pools, "build_verify", requests, np.array(drafts, np.int32), batch_size)
        if isinstance(result, Exception):
            assert invalid is not None or self.max_drafts == 0 and n or "no free page" in str(result)
            event(f"build_verify refused: {str(result).split(':')[0][:40]}")
            return
        slot, src, dst, drafts_out = (np.array(a) for a in result)
        assert (drafts_out[:n] == drafts).all() and (drafts_out[n:] == 0).all()
        flushes = [buffer_rules.verify_flushes(self.fill[int(s)], drafts[i], self.window, self.max_drafts)
                   for i, s in enumerate(slot[:n])]
        self.check_rows(slot, src, dst, batch_size, n, flushes.__getitem__)
        if data.draw(st.booleans()):
            self.check_forbidden_while_pending(data)
        if self.cancelled(data):
            return
        # The device: flush-before-verify, then the draft records after the committed ones.
        new_content, draft_tokens = {}, []
        for i in range(n):
            s = int(slot[i])
            if flushes[i]:
                new_content[int(dst[i])] = self.page_content[int(src[i])] + tuple(self.records[s])
                self.records[s], self.fill[s] = [], 0
            tokens = [next(self.tokens) for _ in range(drafts[i])]
            assert len(self.records[s]) + len(tokens) <= self.capacity, "record buffer overflow"
            draft_tokens.append(tokens)
        self.page_content.update(new_content)
        accepted = [data.draw(st.integers(0, t)) for t in drafts]
        if data.draw(st.integers(0, 3)) == 0:  # a bad commit first: refused, nothing changes
            bad = np.array(accepted + [0], np.int32)
            if n and data.draw(st.booleans()):
                bad = np.array(accepted, np.int32)
                bad[data.draw(st.integers(0, n - 1))] = data.draw(st.sampled_from([-1, self.max_drafts + 1]))
            assert isinstance(call_both(self.pools, "commit", bad), ValueError)
        call_both(self.pools, "commit", np.array(accepted, np.int32))
        for i in range(n):
            s = int(slot[i])
            kept = draft_tokens[i][:accepted[i]]
            self.records[s] += kept
            self.history[s] += tuple(kept)
            self.fill[s] += accepted[i]

    def cancelled(self, data) -> bool:
        """Now and then the cache refuses the built batch: ``cancel_batch`` drops it, its kernels never
        ran, and the model does not change (the invariants then check that its fresh pages came back)."""
        if data.draw(st.integers(0, 7)) != 0:
            return False
        call_both(self.pools, "cancel_batch")
        assert "no batch is pending" in str(call_both(self.pools, "cancel_batch"))
        return True

    @rule(method=st.sampled_from(["report_step", "commit", "cancel_batch"]))
    def finish_without_batch(self, method):
        args = (np.zeros(0, np.int32),) if method == "commit" else ()
        message = str(call_both(self.pools, method, *args))
        assert ("no batch is pending" if method == "cancel_batch" else "no build_") in message

    # -- invariants -------------------------------------------------------------------------------
    @invariant()
    def mirrors_agree(self):
        cy, py = self.pools
        np.testing.assert_array_equal(cy.live_slots(), py.live_slots())
        assert sorted(self.history) == py.live_slots().tolist()
        assert cy.free_slot_count() == py.free_slot_count() == self.slots - len(self.history)
        assert cy.free_page_count() == py.free_page_count()
        for s in self.history:
            assert cy.page_of(s) == py.page_of(s) and cy.fill_of(s) == py.fill_of(s)
        for p in range(self.pages):
            assert cy.refcount_of(p) == py.refcount_of(p)

    @invariant()
    def pages_accounted(self):
        py = self.pools[1]
        referenced = [self.page(s) for s in self.history]
        for p in range(self.pages):
            assert py.refcount_of(p) == referenced.count(p), "refcount must match the sharers"
        assert py.free_page_count() + len(set(referenced)) == self.pages, "a page leaked"

    @invariant()
    def fills_follow_buffer_rules(self):
        py = self.pools[1]
        for s in self.history:
            assert 0 <= py.fill_of(s) <= self.capacity
            assert py.fill_of(s) == self.fill[s] == len(self.records[s])
            # What the device would read back: checkpoint plus records is exactly the history.
            assert self.page_content[self.page(s)] + tuple(self.records[s]) == self.history[s]


SlotPoolMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestSlotPoolStateful = SlotPoolMachine.TestCase


def test_commit_of_no_drafts_after_a_copy_on_write_flush_moves_the_slot():
    """A verify that folds a shared page writes the fold to a fresh page; committing 0 of its drafts
    must still move the slot there (the fold happened) and release its hold on the shared page. The
    state machine reaches this only in rare runs, so it is pinned here for both pools."""
    window, max_drafts = 4, 4
    for Pool in (SlotPool, PySlotPool):
        pool = Pool(4, 8, window, max_drafts)
        parent = pool.allocate()
        for _ in range(window - 1):  # fills 1, 2, 3: no flush
            pool.build_step(np.array([parent], np.int32), 1)
            pool.report_step()
        pool.build_verify(np.array([parent], np.int32), np.array([2], np.int32), 1)
        pool.commit(np.array([2], np.int32))  # fill 5: a verify of 4 drafts must fold first
        child = pool.fork(parent)
        shared, free_before = pool.page_of(parent), pool.free_page_count()
        assert pool.refcount_of(shared) == 2 and pool.fill_of(child) == 5
        slot, src, dst, _ = pool.build_verify(np.array([parent], np.int32), np.array([4], np.int32), 1)
        assert buffer_rules.verify_flushes(5, 4, window, max_drafts)
        assert int(src[0]) == shared and int(dst[0]) != shared, f"{Pool.__name__}: folded in place"
        pool.commit(np.array([0], np.int32))
        name = Pool.__name__
        assert pool.page_of(parent) == int(dst[0]), f"{name}: the slot stayed on the shared page"
        assert pool.fill_of(parent) == 0, f"{name}: the fold left fill {pool.fill_of(parent)}"
        assert pool.refcount_of(shared) == 1 and pool.refcount_of(int(dst[0])) == 1, name
        assert pool.page_of(child) == shared and pool.fill_of(child) == 5, f"{name}: the fork moved"
        assert pool.free_page_count() == free_before - 1, f"{name}: a page leaked"
