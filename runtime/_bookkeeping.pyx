# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Runtime layer: the host-side bookkeeping of replay buffers, compiled (``SlotPool``).

The C twin of ``runtime/bookkeeping_py.py`` (``PySlotPool``, the readable spec: read its docstring
for the model and the step protocol). Same API, same results, same exceptions and messages; the
per-row work of ``build_step`` / ``report_step`` / ``build_verify`` / ``commit`` runs in C loops over
typed memoryviews, so a step of 512 requests costs a few microseconds of host time.

May import: NumPy (Python level only, no NumPy C headers), ``replayssm_dsl.errors``, and
``bookkeeping_py.slot_number`` (the check of a slot given alone, shared with the twin).
The flush rules are those of ``lowering/buffer_rules.py``, restated inline in ``_plan_rows`` and
tested against it.
"""

from libc.stdint cimport int32_t, uint8_t
import operator

import numpy as np

from replayssm_dsl.errors import CapacityError, ConfigError, InputError
from replayssm_dsl.runtime.bookkeeping_py import slot_number  # one rule for a slot given alone, off the hot path

cdef enum:
    NO_BATCH = 0
    STEP_BATCH = 1
    VERIFY_BATCH = 2

cdef object _INT32 = np.dtype(np.int32)
_BATCH_NAMES = {STEP_BATCH: ("build_step", "report_step()"), VERIFY_BATCH: ("build_verify", "commit(accepted)")}


cdef inline int _check_int32_vector(object array, str name) except -1:
    if not isinstance(array, np.ndarray):
        raise InputError(f"{name} must be a 1-D numpy int32 array, got {type(array).__name__}")
    if array.dtype is not _INT32 and array.dtype != _INT32:
        raise InputError(f"{name} must be a 1-D numpy int32 array, got dtype {array.dtype}")
    if array.ndim != 1:
        raise InputError(f"{name} must be a 1-D numpy int32 array, got shape {array.shape}")
    return 0


cdef int _check_output_buffer(object array, str name) except -1:
    _check_int32_vector(array, name)
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise InputError(f"{name} must be C-contiguous and writeable to serve as a step buffer")
    return 0


cdef class SlotPool:
    """Slots, copy-on-write checkpoint pages and a host mirror of buffer fills (compiled)."""

    cdef readonly int slots, pages, window, max_drafts, capacity
    # per slot / per page state
    cdef uint8_t[::1] _allocated
    cdef int32_t[::1] _page, _fill, _refcount
    cdef int32_t[::1] _free_slots, _free_pages   # stacks; top at [count - 1]
    cdef int _free_slot_count, _free_page_count
    # duplicate detection: _seen_epoch[slot] == _epoch means seen in this batch, at _seen_at[slot]
    cdef int32_t[::1] _seen_epoch, _seen_at
    cdef int32_t _epoch
    # the pending batch, one row per request
    cdef int _pending_kind, _pending_count
    cdef int32_t[::1] _pend_slot, _pend_src, _pend_dst, _pend_drafts
    cdef uint8_t[::1] _pend_flush
    # output buffers (whole arrays) and cached per-batch-size views
    cdef object _user_buffers, _owned_buffers
    cdef int32_t[::1] _out_slot, _out_src, _out_dst, _out_drafts
    cdef dict _views

    def __init__(self, slots, pages, window, max_drafts):
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
        self.slots, self.pages, self.window, self.max_drafts = slots, pages, window, max_drafts
        self.capacity = window + max_drafts
        self._allocated = np.zeros(slots, np.uint8)
        self._page = np.full(slots, -1, np.int32)
        self._fill = np.zeros(slots, np.int32)
        self._refcount = np.zeros(pages, np.int32)
        # The lowest index on top, so a fresh pool hands out 0, 1, 2, ... (as PySlotPool does).
        self._free_slots = np.arange(slots - 1, -1, -1, dtype=np.int32)
        self._free_pages = np.arange(pages - 1, -1, -1, dtype=np.int32)
        self._free_slot_count, self._free_page_count = slots, pages
        self._seen_epoch = np.zeros(slots, np.int32)
        self._seen_at = np.zeros(slots, np.int32)
        self._epoch = 0
        self._pending_kind, self._pending_count = NO_BATCH, 0
        self._pend_slot = np.zeros(slots, np.int32)
        self._pend_src = np.zeros(slots, np.int32)
        self._pend_dst = np.zeros(slots, np.int32)
        self._pend_drafts = np.zeros(slots, np.int32)
        self._pend_flush = np.zeros(slots, np.uint8)
        self._user_buffers = None
        self._owned_buffers = tuple(np.empty(0, np.int32) for _ in range(4))
        self._set_buffers(self._owned_buffers)

    # -- properties and queries -------------------------------------------------------------------
    @property
    def null_slot(self):
        return -1

    def page_of(self, slot):
        return self._page[self._check_live_slot(slot, "page_of")]

    def fill_of(self, slot):
        return self._fill[self._check_live_slot(slot, "fill_of")]

    def refcount_of(self, page):
        page = operator.index(page)
        if not 0 <= page < self.pages:
            raise InputError(f"page {page} is out of range [0, {self.pages})")
        return self._refcount[<Py_ssize_t>page]

    def free_page_count(self):
        return self._free_page_count

    def free_slot_count(self):
        return self._free_slot_count

    def live_slots(self):
        return np.flatnonzero(np.asarray(self._allocated)).astype(np.int32)

    # -- slot lifetime ----------------------------------------------------------------------------
    def allocate(self):
        self._check_no_batch("allocate")
        if self._free_slot_count == 0:
            raise CapacityError(f"no free slot: all {self.slots} slots are in use")
        if self._free_page_count == 0:
            raise CapacityError(f"no free page: all {self.pages} pages are in use")
        cdef int32_t slot = self._pop_slot()
        cdef int32_t page = self._pop_page()
        self._allocated[slot] = 1
        self._page[slot] = page
        self._fill[slot] = 0
        self._refcount[page] = 1
        return slot

    def free(self, slot):
        self._check_no_batch("free")
        cdef Py_ssize_t s = self._check_live_slot(slot, "free")
        self._release_page(self._page[s])
        self._allocated[s] = 0
        self._page[s] = -1
        self._fill[s] = 0
        self._free_slots[self._free_slot_count] = <int32_t>s
        self._free_slot_count += 1

    def fork(self, parent):
        """A new slot sharing ``parent``'s page (copy-on-write) and fill; the caller copies the
        parent's record rows to the child on the device."""
        self._check_no_batch("fork")
        cdef Py_ssize_t p = self._check_live_slot(parent, "fork")
        if self._free_slot_count == 0:
            raise CapacityError(f"no free slot: all {self.slots} slots are in use")
        cdef int32_t child = self._pop_slot()
        cdef int32_t page = self._page[p]
        self._allocated[child] = 1
        self._page[child] = page
        self._fill[child] = self._fill[p]
        self._refcount[page] += 1
        return child

    def prepare_load(self, slot):
        """The page a load (overwrite of the whole checkpoint) must write: the slot's page when
        unshared, else a fresh page the slot moves to. A load leaves the buffer empty: fill 0."""
        self._check_no_batch("prepare_load")
        cdef Py_ssize_t s = self._check_live_slot(slot, "prepare_load")
        cdef int32_t page = self._page[s]
        if self._refcount[page] > 1:
            if self._free_page_count == 0:
                raise CapacityError(
                    f"no free page for prepare_load(slot {s}): all {self.pages} pages are in use")
            self._release_page(page)
            page = self._pop_page()
            self._refcount[page] = 1
            self._page[s] = page
        self._fill[s] = 0
        return page

    # -- output buffers ---------------------------------------------------------------------------
    def set_step_buffers(self, slot=None, src_page=None, dst_page=None, drafts=None):
        """Write the build_* outputs into the caller's arrays (all four, same length, int32,
        C-contiguous); with no arguments, go back to buffers the pool owns."""
        self._check_no_batch("set_step_buffers")
        arrays = (slot, src_page, dst_page, drafts)
        if all(a is None for a in arrays):
            self._set_buffers(self._owned_buffers)
            self._user_buffers = None
            return
        for array, name in zip(arrays, ("slot", "src_page", "dst_page", "drafts")):
            _check_output_buffer(array, name)
        if len({a.shape[0] for a in arrays}) != 1:
            raise InputError("slot, src_page, dst_page and drafts must have the same length, got "
                             + ", ".join(str(a.shape[0]) for a in arrays))
        self._set_buffers(arrays)
        self._user_buffers = arrays

    cdef _set_buffers(self, tuple arrays):
        self._out_slot, self._out_src, self._out_dst, self._out_drafts = arrays
        self._views = {}

    cdef tuple _outputs(self, Py_ssize_t batch_size):
        views = self._views.get(batch_size)
        if views is not None:
            return <tuple>views
        cdef Py_ssize_t length = self._out_slot.shape[0]
        if batch_size > length:
            if self._user_buffers is not None:
                raise InputError(f"batch_size = {batch_size} exceeds the length {length}"
                                 " of the step buffers set with set_step_buffers()")
            self._owned_buffers = tuple(np.empty(batch_size, np.int32) for _ in range(4))
            self._set_buffers(self._owned_buffers)
        arrays = self._user_buffers if self._user_buffers is not None else self._owned_buffers
        full = tuple(a[:batch_size] for a in arrays)
        views = (full[:3], full)
        self._views[batch_size] = views
        return views

    # -- steps ------------------------------------------------------------------------------------
    def build_step(self, requests, batch_size):
        """Validate a decode batch and return ``(slot, src_page, dst_page)``, each ``[batch_size]``."""
        self._check_no_batch("build_step")
        _check_int32_vector(requests, "requests")
        cdef Py_ssize_t n = requests.shape[0]
        cdef Py_ssize_t b = self._check_batch_size(batch_size, n)
        outputs = self._outputs(b)
        self._plan_rows(requests, None, STEP_BATCH)
        self._write_outputs(b)
        self._pending_kind = STEP_BATCH
        return outputs[0]

    def report_step(self):
        """Apply the last build_step to the mirror: fills advance, copy-on-write pages switch."""
        self._check_batch("report_step", STEP_BATCH)
        cdef Py_ssize_t i
        cdef int32_t slot
        for i in range(self._pending_count):
            slot = self._pend_slot[i]
            self._fill[slot] = 0 if self._pend_flush[i] else self._fill[slot] + 1
            self._move_slot(slot, self._pend_src[i], self._pend_dst[i])
        self._pending_kind, self._pending_count = NO_BATCH, 0

    def build_verify(self, requests, drafts, batch_size):
        """Validate a speculative batch; return ``(slot, src_page, dst_page, drafts)``."""
        self._check_no_batch("build_verify")
        _check_int32_vector(requests, "requests")
        _check_int32_vector(drafts, "drafts")
        cdef Py_ssize_t n = requests.shape[0]
        if drafts.shape[0] != n:
            raise InputError(f"drafts has length {drafts.shape[0]}, expected {n} (one per request)")
        cdef Py_ssize_t b = self._check_batch_size(batch_size, n)
        outputs = self._outputs(b)
        self._plan_rows(requests, drafts, VERIFY_BATCH)
        self._write_outputs(b)
        self._pending_kind = VERIFY_BATCH
        return outputs[1]

    def commit(self, accepted):
        """Accept ``accepted[i] <= drafts[i]`` drafts of each request of the last build_verify."""
        self._check_batch("commit", VERIFY_BATCH)
        _check_int32_vector(accepted, "accepted")
        cdef Py_ssize_t n = self._pending_count
        if accepted.shape[0] != n:
            raise InputError(f"accepted has length {accepted.shape[0]}, expected {n}"
                             " (one per request of the last build_verify)")
        cdef const int32_t[:] acc = accepted
        cdef Py_ssize_t i
        cdef int32_t slot, count
        for i in range(n):
            count = acc[i]
            if count < 0 or count > self._pend_drafts[i]:
                if count < 0:
                    raise InputError(f"accepted[{i}] = {count} is negative")
                raise InputError(f"accepted[{i}] = {count} exceeds drafts[{i}] = {self._pend_drafts[i]}"
                                 f" (slot {self._pend_slot[i]})")
        for i in range(n):
            slot = self._pend_slot[i]
            self._fill[slot] = (0 if self._pend_flush[i] else self._fill[slot]) + acc[i]
            self._move_slot(slot, self._pend_src[i], self._pend_dst[i])
        self._pending_kind, self._pending_count = NO_BATCH, 0

    def cancel_batch(self):
        """Drop the pending build_step or build_verify batch, whose kernels did not run (the cache
        refused the call): the fresh pages it reserved go back, no fill moves, no slot switches page."""
        if self._pending_kind == NO_BATCH:
            raise InputError("cancel_batch(): no batch is pending")
        cdef Py_ssize_t i
        for i in range(self._pending_count - 1, -1, -1):
            if self._pend_dst[i] != self._pend_src[i]:
                self._release_page(self._pend_dst[i])
        self._pending_kind, self._pending_count = NO_BATCH, 0

    # -- internals --------------------------------------------------------------------------------
    cdef int _plan_rows(self, requests, drafts, int kind) except -1:
        """Validate every row, then reserve the fresh pages of shared flushing rows (as PySlotPool)."""
        cdef const int32_t[:] req = requests
        cdef const int32_t[:] dr
        cdef Py_ssize_t n = req.shape[0], i
        cdef int32_t slot, fill, page, count = 0, epoch
        cdef int fresh_pages_needed = 0
        cdef bint flushes
        if kind == VERIFY_BATCH:
            dr = drafts
        self._epoch += 1
        if self._epoch == 2**31 - 1:
            self._seen_epoch[:] = 0
            self._epoch = 1
        epoch = self._epoch
        for i in range(n):
            slot = req[i]
            if slot < 0 or slot >= self.slots:
                raise InputError(f"requests[{i}] = {slot} is out of range [0, {self.slots})")
            if not self._allocated[slot]:
                raise InputError(f"requests[{i}] = {slot} is not an allocated slot")
            if self._seen_epoch[slot] == epoch:
                raise InputError(f"slot {slot} appears twice in requests"
                                 f" (requests[{self._seen_at[slot]}] and requests[{i}])")
            self._seen_epoch[slot] = epoch
            self._seen_at[slot] = <int32_t>i
            fill = self._fill[slot]
            if kind == VERIFY_BATCH:
                count = dr[i]
                if count < 1 or count > self.max_drafts:
                    raise InputError(f"drafts[{i}] = {count} is out of range [1, {self.max_drafts}]")
                flushes = fill + count > self.capacity       # buffer_rules.verify_flushes
            else:
                flushes = fill + 1 >= self.window            # buffer_rules.step_flushes
            page = self._page[slot]
            self._pend_slot[i] = slot
            self._pend_src[i] = page
            self._pend_drafts[i] = count
            self._pend_flush[i] = flushes
            # A flush into a shared page would clobber the other sharers: it writes a fresh page.
            if flushes and self._refcount[page] > 1:
                self._pend_dst[i] = -2  # marker: fresh page to reserve below
                fresh_pages_needed += 1
            else:
                self._pend_dst[i] = page
        if fresh_pages_needed > self._free_page_count:
            raise CapacityError(f"no free page for copy-on-write flushes: the batch needs {fresh_pages_needed}"
                                f" fresh pages, {self._free_page_count} are free (pages = {self.pages})")
        if fresh_pages_needed:
            for i in range(n):
                if self._pend_dst[i] == -2:
                    page = self._pop_page()
                    self._refcount[page] = 1  # held by the pending batch until the slot moves onto it
                    self._pend_dst[i] = page
        self._pending_count = <int>n
        return 0

    cdef void _write_outputs(self, Py_ssize_t batch_size) noexcept:
        cdef Py_ssize_t i, n = self._pending_count
        for i in range(n):
            self._out_slot[i] = self._pend_slot[i]
            self._out_src[i] = self._pend_src[i]
            self._out_dst[i] = self._pend_dst[i]
            self._out_drafts[i] = self._pend_drafts[i]
        for i in range(n, batch_size):
            self._out_slot[i] = -1
            self._out_src[i] = -1
            self._out_dst[i] = -1
            self._out_drafts[i] = 0

    cdef inline int32_t _pop_slot(self) noexcept:
        self._free_slot_count -= 1
        return self._free_slots[self._free_slot_count]

    cdef inline int32_t _pop_page(self) noexcept:
        self._free_page_count -= 1
        return self._free_pages[self._free_page_count]

    cdef inline void _move_slot(self, int32_t slot, int32_t src, int32_t dst) noexcept:
        if dst != src:
            self._release_page(src)
            self._page[slot] = dst

    cdef inline void _release_page(self, int32_t page) noexcept:
        self._refcount[page] -= 1
        if self._refcount[page] == 0:
            self._free_pages[self._free_page_count] = page
            self._free_page_count += 1

    cdef Py_ssize_t _check_live_slot(self, slot, str op) except -1:
        slot = slot_number(slot, op)
        if not 0 <= slot < self.slots:
            raise InputError(f"{op}(): slot {slot} is out of range [0, {self.slots})")
        if not self._allocated[<Py_ssize_t>slot]:
            raise InputError(f"{op}(): slot {slot} is not allocated")
        return slot

    cdef Py_ssize_t _check_batch_size(self, batch_size, Py_ssize_t n_requests) except -1:
        batch_size = operator.index(batch_size)
        if batch_size < n_requests:
            raise InputError(f"batch_size = {batch_size} is smaller than the number of requests ({n_requests})")
        return batch_size

    cdef int _check_no_batch(self, str op) except -1:
        if self._pending_kind != NO_BATCH:
            built, finish = _BATCH_NAMES[self._pending_kind]
            raise InputError(f"{op}(): the last {built} batch was not finished; call {finish} first"
                             " (the pool must know what the device did)")
        return 0

    cdef int _check_batch(self, str op, int kind) except -1:
        if self._pending_kind == kind:
            return 0
        built, _ = _BATCH_NAMES[kind]
        if self._pending_kind == NO_BATCH:
            raise InputError(f"{op}(): no {built} batch is pending")
        other_built, other_finish = _BATCH_NAMES[self._pending_kind]
        raise InputError(f"{op}(): the pending batch came from {other_built}; call {other_finish} instead")
