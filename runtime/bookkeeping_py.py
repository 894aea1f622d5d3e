"""Runtime layer: the host-side bookkeeping of replay buffers, in plain Python (the spec).

``PySlotPool`` is the readable twin of the Cython ``SlotPool`` (``runtime/_bookkeeping.pyx``): the same
API, the same results, the same exceptions with the same messages. Loops here are plain Python on
purpose; the Cython class does the same work in C and is tested against this one.

May import: NumPy, ``replayssm_dsl.errors``, ``replayssm_dsl.lowering.buffer_rules``,
``validation.as_index`` and ``refused_index``.

Model
-----
- A *slot* is a sequence's index into the per-slot record buffers and the device fill counts.
- A *page* is an index into the checkpoint array ``[pages, HV, V, K]``. Forked slots share a page
  copy-on-write; ``refcount_of(page)`` counts the slots pointing at it.
- The pool keeps a *mirror* of every slot's fill (records in its buffer), updated by the host from
  the rules of ``lowering/buffer_rules.py``, so the scheduler never reads the device counts.

Step protocol
-------------
``build_step`` / ``build_verify`` validate a batch and fill per-row int32 arrays for the kernels:
``slot``, ``src_page`` (checkpoint to read), ``dst_page`` (checkpoint a flush writes: the same page when
unshared, else a fresh page reserved now) and, for verify, ``drafts``. Padding rows hold the null slot
``-1``, pages ``-1`` and drafts ``0``. Each build must be followed by its ``report_step()`` (after
``build_step``) or ``commit(accepted)`` (after ``build_verify``) before the next build or any
allocate / free / fork / prepare_load: until then an InputError says which call is missing.
``cancel_batch()`` drops a pending batch whose kernels never ran (the cache refused the call).

The returned arrays are views of buffers the pool owns and reuses: the same objects are returned for
the same ``batch_size``, and they are overwritten by the next build. ``set_step_buffers(slot, src_page,
dst_page, drafts)`` makes the pool write into the caller's arrays instead (e.g. pinned host memory);
``set_step_buffers()`` with no arguments goes back to buffers the pool owns.

Validation happens in full before any state changes: a call that raises leaves the pool as it was.
A pool is not thread-safe: one scheduler thread owns it.
"""

from __future__ import annotations

import operator

import numpy as np

from replayssm_dsl.errors import CapacityError, ConfigError, InputError
from replayssm_dsl.lowering import buffer_rules

from .validation import as_index, refused_index

NULL_SLOT = -1
_NO_BATCH, _STEP_BATCH, _VERIFY_BATCH = 0, 1, 2
_BATCH_NAMES = {_STEP_BATCH: ("build_step", "report_step()"), _VERIFY_BATCH: ("build_verify", "commit(accepted)")}


def _check_int32_vector(array, name: str) -> None:
    """Raise InputError unless ``array`` is a 1-D NumPy int32 array."""
    if not isinstance(array, np.ndarray):
        raise InputError(f"{name} must be a 1-D numpy int32 array, got {type(array).__name__}")
    if array.dtype != np.int32:
        raise InputError(f"{name} must be a 1-D numpy int32 array, got dtype {array.dtype}")
    if array.ndim != 1:
        raise InputError(f"{name} must be a 1-D numpy int32 array, got shape {array.shape}")


def slot_number(slot, op: str) -> int:
    """``slot`` as an int: a bool (an int to Python, never a slot) or a non-integer is refused."""
    index = as_index(slot)
    if index is None:
        raise InputError(f"{op}(): expected a slot number (int), got {refused_index(slot)}")
    return index


def _check_output_buffer(array, name: str) -> None:
    _check_int32_vector(array, name)
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise InputError(f"{name} must be C-contiguous and writeable to serve as a step buffer")


class PySlotPool:
    """Slots, copy-on-write checkpoint pages and a host mirror of buffer fills (pure Python)."""

    def __init__(self, slots: int, pages: int, window: int, max_drafts: int):
        slots, pages = operator.index(slots), operator.index(pages)
        window, max_drafts = operator.index(window), operator.index(max_drafts)
        if slots < 1:
            raise ConfigError(f"slots must be >= 1, got {slots}")
        if pages < slots:
            raise ConfigError(f"pages = {pages} must be >= slots = {slots} (every slot needs a page)")
        if window < 1:
            raise ConfigError(f"window must be >= 1, got {window}")
        if max_drafts < 0:
            raise ConfigError(f"max_drafts must be >= 0, got {max_drafts}")
        if pages > 2**30 or window + max_drafts > 2**30:
            raise ConfigError("pages, window and max_drafts must stay below 2**30")
        self._slots, self._pages = slots, pages
        self._window, self._max_drafts = window, max_drafts
        self._allocated = [False] * slots
        self._page = [NULL_SLOT] * slots
        self._fill = [0] * slots
        self._refcount = [0] * pages
        # Free lists are stacks; the lowest index is on top, so a fresh pool hands out 0, 1, 2, ...
        self._free_slots = list(range(slots - 1, -1, -1))
        self._free_pages = list(range(pages - 1, -1, -1))
        # The pending batch: kind, and one tuple (slot, src, dst, flushes, drafts) per request.
        self._pending_kind = _NO_BATCH
        self._pending_rows: list[tuple[int, int, int, bool, int]] = []
        self._user_buffers = None
        self._owned_buffers = [np.empty(0, np.int32) for _ in range(4)]
        self._views: dict[int, tuple] = {}

    # -- properties and queries -------------------------------------------------------------------
    slots = property(lambda self: self._slots)
    pages = property(lambda self: self._pages)
    window = property(lambda self: self._window)
    max_drafts = property(lambda self: self._max_drafts)
    capacity = property(lambda self: buffer_rules.capacity(self._window, self._max_drafts))
    null_slot = property(lambda self: NULL_SLOT)

    def page_of(self, slot: int) -> int:
        return self._page[self._check_live_slot(slot, "page_of")]

    def fill_of(self, slot: int) -> int:
        return self._fill[self._check_live_slot(slot, "fill_of")]

    def refcount_of(self, page: int) -> int:
        page = operator.index(page)
        if not 0 <= page < self._pages:
            raise InputError(f"page {page} is out of range [0, {self._pages})")
        return self._refcount[page]

    def free_page_count(self) -> int:
        return len(self._free_pages)

    def free_slot_count(self) -> int:
        return len(self._free_slots)

    def live_slots(self) -> np.ndarray:
        return np.array([s for s in range(self._slots) if self._allocated[s]], dtype=np.int32)

    # -- slot lifetime ----------------------------------------------------------------------------
    def allocate(self) -> int:
        self._check_no_batch("allocate")
        if not self._free_slots:
            raise CapacityError(f"no free slot: all {self._slots} slots are in use")
        if not self._free_pages:
            raise CapacityError(f"no free page: all {self._pages} pages are in use")
        slot, page = self._free_slots.pop(), self._free_pages.pop()
        self._allocated[slot], self._page[slot], self._fill[slot] = True, page, 0
        self._refcount[page] = 1
        return slot

    def free(self, slot: int) -> None:
        self._check_no_batch("free")
        slot = self._check_live_slot(slot, "free")
        self._release_page(self._page[slot])
        self._allocated[slot], self._page[slot], self._fill[slot] = False, NULL_SLOT, 0
        self._free_slots.append(slot)

    def fork(self, parent: int) -> int:
        """A new slot sharing ``parent``'s page (copy-on-write) and fill; the caller copies the
        parent's record rows to the child on the device."""
        self._check_no_batch("fork")
        parent = self._check_live_slot(parent, "fork")
        if not self._free_slots:
            raise CapacityError(f"no free slot: all {self._slots} slots are in use")
        child = self._free_slots.pop()
        page = self._page[parent]
        self._allocated[child], self._page[child], self._fill[child] = True, page, self._fill[parent]
        self._refcount[page] += 1
        return child

    def prepare_load(self, slot: int) -> int:
        """The page a load (overwrite of the whole checkpoint) must write: the slot's page when
        unshared, else a fresh page the slot moves to. A load leaves the buffer empty: fill 0."""
        self._check_no_batch("prepare_load")
        slot = self._check_live_slot(slot, "prepare_load")
        page = self._page[slot]
        if self._refcount[page] > 1:
            if not self._free_pages:
                raise CapacityError(
                    f"no free page for prepare_load(slot {slot}): all {self._pages} pages are in use")
            self._release_page(page)
            page = self._free_pages.pop()
            self._refcount[page] = 1
            self._page[slot] = page
        self._fill[slot] = 0
        return page

    # -- output buffers ---------------------------------------------------------------------------
    def set_step_buffers(self, slot=None, src_page=None, dst_page=None, drafts=None) -> None:
        """Write the build_* outputs into the caller's arrays (all four, same length, int32,
        C-contiguous); with no arguments, go back to buffers the pool owns."""
        self._check_no_batch("set_step_buffers")
        arrays = (slot, src_page, dst_page, drafts)
        if all(a is None for a in arrays):
            self._user_buffers = None
        else:
            names = ("slot", "src_page", "dst_page", "drafts")
            for array, name in zip(arrays, names):
                _check_output_buffer(array, name)
            if len({a.shape[0] for a in arrays}) != 1:
                raise InputError("slot, src_page, dst_page and drafts must have the same length, got "
                                 + ", ".join(str(a.shape[0]) for a in arrays))
            self._user_buffers = arrays
        self._views = {}

    def _outputs(self, batch_size: int) -> tuple:
        views = self._views.get(batch_size)
        if views is None:
            if self._user_buffers is not None:
                buffers = self._user_buffers
                if batch_size > buffers[0].shape[0]:
                    raise InputError(f"batch_size = {batch_size} exceeds the length {buffers[0].shape[0]}"
                                     " of the step buffers set with set_step_buffers()")
            else:
                if batch_size > self._owned_buffers[0].shape[0]:
                    self._owned_buffers = [np.empty(batch_size, np.int32) for _ in range(4)]
                    self._views = {}
                buffers = self._owned_buffers
            views = tuple(b[:batch_size] for b in buffers)
            self._views[batch_size] = views = (views[:3], views)
        return views

    # -- steps ------------------------------------------------------------------------------------
    def build_step(self, requests: np.ndarray, batch_size: int):
        """Validate a decode batch and return ``(slot, src_page, dst_page)``, each ``[batch_size]``."""
        self._check_no_batch("build_step")
        _check_int32_vector(requests, "requests")
        batch_size = self._check_batch_size(batch_size, requests.shape[0])
        outputs = self._outputs(batch_size)
        rows = self._plan_rows(requests, None)
        self._write_outputs(rows, batch_size, outputs[1])
        self._pending_kind, self._pending_rows = _STEP_BATCH, rows
        return outputs[0]

    def report_step(self) -> None:
        """Apply the last build_step to the mirror: fills advance, copy-on-write pages switch."""
        self._check_batch("report_step", _STEP_BATCH)
        for slot, src, dst, flushes, _ in self._pending_rows:
            self._fill[slot] = buffer_rules.fill_after_step(self._fill[slot], self._window)
            self._move_slot(slot, src, dst)
        self._pending_kind, self._pending_rows = _NO_BATCH, []

    def build_verify(self, requests: np.ndarray, drafts: np.ndarray, batch_size: int):
        """Validate a speculative batch; return ``(slot, src_page, dst_page, drafts)``."""
        self._check_no_batch("build_verify")
        _check_int32_vector(requests, "requests")
        _check_int32_vector(drafts, "drafts")
        if drafts.shape[0] != requests.shape[0]:
            raise InputError(f"drafts has length {drafts.shape[0]}, expected {requests.shape[0]}"
                             " (one per request)")
        batch_size = self._check_batch_size(batch_size, requests.shape[0])
        outputs = self._outputs(batch_size)
        rows = self._plan_rows(requests, drafts)
        self._write_outputs(rows, batch_size, outputs[1])
        self._pending_kind, self._pending_rows = _VERIFY_BATCH, rows
        return outputs[1]

    def commit(self, accepted: np.ndarray) -> None:
        """Accept ``accepted[i] <= drafts[i]`` drafts of each request of the last build_verify."""
        self._check_batch("commit", _VERIFY_BATCH)
        _check_int32_vector(accepted, "accepted")
        rows = self._pending_rows
        if accepted.shape[0] != len(rows):
            raise InputError(f"accepted has length {accepted.shape[0]}, expected {len(rows)}"
                             " (one per request of the last build_verify)")
        for i, (slot, _, _, _, drafted) in enumerate(rows):
            count = int(accepted[i])
            if count < 0:
                raise InputError(f"accepted[{i}] = {count} is negative")
            if count > drafted:
                raise InputError(f"accepted[{i}] = {count} exceeds drafts[{i}] = {drafted} (slot {slot})")
        for i, (slot, src, dst, flushes, _) in enumerate(rows):
            self._fill[slot] = (0 if flushes else self._fill[slot]) + int(accepted[i])
            self._move_slot(slot, src, dst)
        self._pending_kind, self._pending_rows = _NO_BATCH, []

    def cancel_batch(self) -> None:
        """Drop the pending build_step or build_verify batch, whose kernels did not run (the cache
        refused the call): the fresh pages it reserved go back, no fill moves, no slot switches page."""
        if self._pending_kind == _NO_BATCH:
            raise InputError("cancel_batch(): no batch is pending")
        for slot, src, dst, _, _ in reversed(self._pending_rows):
            if dst != src:
                self._release_page(dst)
        self._pending_kind, self._pending_rows = _NO_BATCH, []

    # -- internals --------------------------------------------------------------------------------
    def _plan_rows(self, requests: np.ndarray, drafts) -> list:
        """Validate every row, then reserve the fresh pages of shared flushing rows."""
        seen_at: dict[int, int] = {}
        plans = []
        fresh_pages_needed = 0
        for i in range(requests.shape[0]):
            slot = int(requests[i])
            if not 0 <= slot < self._slots:
                raise InputError(f"requests[{i}] = {slot} is out of range [0, {self._slots})")
            if not self._allocated[slot]:
                raise InputError(f"requests[{i}] = {slot} is not an allocated slot")
            if slot in seen_at:
                raise InputError(f"slot {slot} appears twice in requests"
                                 f" (requests[{seen_at[slot]}] and requests[{i}])")
            seen_at[slot] = i
            fill, page = self._fill[slot], self._page[slot]
            if drafts is None:
                count, flushes = 0, buffer_rules.step_flushes(fill, self._window)
            else:
                count = int(drafts[i])
                if not 1 <= count <= self._max_drafts:
                    raise InputError(f"drafts[{i}] = {count} is out of range [1, {self._max_drafts}]")
                flushes = buffer_rules.verify_flushes(fill, count, self._window, self._max_drafts)
            # A flush into a shared page would clobber the other sharers: it writes a fresh page.
            needs_fresh_page = flushes and self._refcount[page] > 1
            fresh_pages_needed += needs_fresh_page
            plans.append((slot, page, needs_fresh_page, flushes, count))
        if fresh_pages_needed > len(self._free_pages):
            raise CapacityError(f"no free page for copy-on-write flushes: the batch needs {fresh_pages_needed}"
                                f" fresh pages, {len(self._free_pages)} are free (pages = {self._pages})")
        rows = []
        for slot, page, needs_fresh_page, flushes, count in plans:
            dst = page
            if needs_fresh_page:
                dst = self._free_pages.pop()
                self._refcount[dst] = 1  # held by the pending batch until the slot moves onto it
            rows.append((slot, page, dst, flushes, count))
        return rows

    @staticmethod
    def _write_outputs(rows: list, batch_size: int, outputs: tuple) -> None:
        slot_out, src_out, dst_out, drafts_out = outputs
        for i, (slot, src, dst, _, drafted) in enumerate(rows):
            slot_out[i], src_out[i], dst_out[i], drafts_out[i] = slot, src, dst, drafted
        for i in range(len(rows), batch_size):
            slot_out[i], src_out[i], dst_out[i], drafts_out[i] = NULL_SLOT, -1, -1, 0

    def _move_slot(self, slot: int, src: int, dst: int) -> None:
        if dst != src:
            self._release_page(src)
            self._page[slot] = dst

    def _release_page(self, page: int) -> None:
        self._refcount[page] -= 1
        if self._refcount[page] == 0:
            self._free_pages.append(page)

    def _check_live_slot(self, slot, op: str) -> int:
        slot = slot_number(slot, op)
        if not 0 <= slot < self._slots:
            raise InputError(f"{op}(): slot {slot} is out of range [0, {self._slots})")
        if not self._allocated[slot]:
            raise InputError(f"{op}(): slot {slot} is not allocated")
        return slot

    def _check_batch_size(self, batch_size, n_requests: int) -> int:
        batch_size = operator.index(batch_size)
        if batch_size < n_requests:
            raise InputError(f"batch_size = {batch_size} is smaller than the number of requests ({n_requests})")
        return batch_size

    def _check_no_batch(self, op: str) -> None:
        if self._pending_kind != _NO_BATCH:
            built, finish = _BATCH_NAMES[self._pending_kind]
            raise InputError(f"{op}(): the last {built} batch was not finished; call {finish} first"
                             " (the pool must know what the device did)")

    def _check_batch(self, op: str, kind: int) -> None:
        if self._pending_kind == kind:
            return
        built, _ = _BATCH_NAMES[kind]
        if self._pending_kind == _NO_BATCH:
            raise InputError(f"{op}(): no {built} batch is pending")
        other_built, other_finish = _BATCH_NAMES[self._pending_kind]
        raise InputError(f"{op}(): the pending batch came from {other_built}; call {other_finish} instead")
