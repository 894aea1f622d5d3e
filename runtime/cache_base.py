"""Runtime layer: the replay cache's API, shared by the CPU and CUDA backends.

A cache owns, for ``slots`` sequences, the checkpoint pages ``[pages, HV, V, K]``, the record buffers
and the per-slot fills, and offers ``step``, ``verify``, ``commit``, ``flush``, ``load`` and
``materialize`` (plus the baselines ``conventional_step`` and ``snapshot_verify`` on a separate
``state`` array, allocated on the baselines' first use: a cache that only replays never holds it). Batches are vLLM-style: ``slots[b]`` per batch row, ``-1`` for a padded row, and
optional ``src_pages`` / ``dst_pages`` (default: page = slot) for copy-on-write checkpoints.

Subclasses provide storage and ``_launch(kernel_name, rows, batch)``; this class validates every
argument first (nothing is launched for a bad call) and sequences the kernels of each operation.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from replayssm_dsl.bfloat16 import bfloat16_bits, from_bfloat16_bits
from replayssm_dsl.config import ModelShape, ReplayConfig
from replayssm_dsl.declaration import Declaration
from replayssm_dsl.errors import ConfigError, InputError

from replayssm_dsl.lowering.lower import lower

from .param_terms import check_parameter_terms
from .validation import (BF16_BITS_DTYPES, FLOAT_DTYPES, as_index, check_accepted, check_array, check_drafts,
                         check_page_writes, check_pages, check_slot_index, check_slots, dtype_name,
                         is_device_array, readable_host_array)


BASELINE_BUFFERS = ("state",)  # read and written by the baselines' kernels alone
BASELINE_KERNELS = ("conventional_step", "snapshot_verify")


def _count(value, name: str, at_least: int) -> int:
    """A count given to the constructor (``slots``, ``pages``): any int (NumPy's too), not a bool."""
    count = as_index(value)
    if count is None or count < at_least:
        bound = "a positive int" if at_least == 1 else f"an int >= slots={at_least}"
        raise ConfigError(f"{name}: must be {bound}, got {value!r}")
    return count


class ReplayCacheBase:
    """Values (finite, declared signs) are checked for host arrays; device arrays are checked for
    shape, dtype and layout only, so the decode loop never waits on the GPU."""

    array_device: str | None = None  # where tokens and states must live ("cpu"), or None: host or GPU

    def __init__(self, decl: Declaration, shape: ModelShape, config: ReplayConfig | None = None, *,
                 slots: int, params: dict, pages: int | None = None):
        slots = _count(slots, "slots", 1)
        pages = slots if pages is None else _count(pages, "pages", slots)
        self.program = lower(decl, shape, config or ReplayConfig())
        self.decl, self.shape, self.config = decl, shape, self.program.config
        self.num_slots, self.num_pages = slots, pages
        self.params = self._check_params(params)
        check_parameter_terms(decl, shape, self.params)
        self._last_verify = None

    # --- argument checks ---------------------------------------------------------------------------
    def _dims(self, dims, **known) -> tuple:
        sizes = {"HV": self.shape.heads, "H": self.shape.key_heads, "V": self.shape.v_dim,
                 "K": self.shape.k_dim, "slots": self.num_slots, "pages": self.num_pages,
                 "cap": self.config.capacity, **known}
        return tuple(sizes[d] if isinstance(d, str) else d for d in dims)

    def _declared(self, kind: str, given: dict, verify: bool = False) -> list:
        """The declared inputs of ``kind``; raise naming any unknown or missing one in ``given``."""
        declared = [s for s in self.decl.inputs if s.kind == kind]
        label = "params" if kind == "param" else "tokens"
        if not isinstance(given, Mapping):
            raise InputError(f"{label}: expected a dict of arrays by input name "
                             f"({[s.name for s in declared]}), got {type(given).__name__}")
        unknown = sorted(set(given) - {s.name for s in declared})
        if unknown:
            raise InputError(f"{label}: {unknown} not declared by {self.decl.name!r} "
                             f"({label}: {[s.name for s in declared]})")
        for spec in declared:
            if spec.name not in given:
                raise InputError(f"{label}: missing {spec.name!r} ({self.decl.name} declares it as "
                                 f"{kind} {spec.shape_text(verify=verify)})")
        return declared

    def _check_params(self, params: dict) -> dict:
        params = dict(params or {})
        out = {}
        for spec in self._declared("param", params):
            value = params[spec.name]
            if not hasattr(value, "__cuda_array_interface__"):
                value = readable_host_array(value, f"params[{spec.name!r}]")  # a CPU torch tensor's values
                if value.dtype.kind not in "iuf":
                    raise InputError(f"params[{spec.name!r}]: dtype {value.dtype} not accepted; "
                                     "use real numbers (float or int)")
                value = value.astype(np.float64)
            shape = self._dims(self.program.buffer(spec.name).dims)
            out[spec.name] = check_array(value, f"params[{spec.name!r}]", shape, sign=spec.sign,
                                         device=self.array_device)
        return out

    def _check_tokens(self, tokens: dict, rows: int, t: int | None) -> dict:
        """Checked tokens, ``[B, T, ...]``. A token declared bf16 may come as floats (rounded to bf16
        here when on the host, by the backend when on the device) or as raw bf16 bits (``uint16``,
        ``int16``); a host one is checked as the float32 values of its bf16 (floats before they are
        rounded, so that one past bf16's range is named as overflowing it) and leaves as
        ``_host_bfloat16`` chooses (values here, bits for the CUDA backend): converted to bf16 once
        (float64 by way of float32, as torch converts), never converted back."""
        out = {}
        for spec in self._declared("token", tokens, verify=t is not None):
            dims = self.program.buffer(spec.name).dims  # ("B", "T", heads[, size])
            shape = self._dims(dims, B=rows, T=t) if t is not None else self._dims(dims[:1] + dims[2:], B=rows)
            value, dtypes, bits, finite_as = tokens[spec.name], FLOAT_DTYPES, None, "float32"
            if spec.dtype == "bfloat16":
                dtypes = FLOAT_DTYPES + BF16_BITS_DTYPES
                if not is_device_array(value):  # a host array of any kind (a CPU torch tensor: NumPy holds no bf16)
                    value = readable_host_array(value, f"tokens[{spec.name!r}]")
                if isinstance(value, np.ndarray) and dtype_name(value) in BF16_BITS_DTYPES:
                    bits = np.ascontiguousarray(value).view(np.uint16)  # raw bits: checked as the values they hold
                    value = from_bfloat16_bits(bits)
                elif isinstance(value, np.ndarray) and dtype_name(value) in dtypes:
                    finite_as = "bfloat16"  # floats: checked as bf16 holds them (a finite one may overflow it)
            value = check_array(value, f"tokens[{spec.name!r}]", shape, sign=spec.sign, dtypes=dtypes,
                                check_values=True, device=self.array_device, finite_as=finite_as)
            if finite_as == "bfloat16":  # then rounded to bf16, once
                bits = bfloat16_bits(value)
                value = from_bfloat16_bits(bits)
            if bits is not None:
                value = self._host_bfloat16(bits, value)
            out[spec.name] = value if t is not None else value[:, None]
        return out

    def _host_bfloat16(self, bits: np.ndarray, values: np.ndarray) -> np.ndarray:
        """A checked host token declared bf16, as this backend takes it: its float32 values (``bits``:
        the same token's raw bits, for a backend whose kernels read those)."""
        return values

    def _no_pending_verify(self, operation: str) -> None:
        if self._last_verify is not None:
            raise InputError(f"{operation}: the last verify is not committed yet; call commit(accepted) first "
                             "(commit([0] * rows) rejects every draft)")

    def _batch(self, slots, src_pages=None, dst_pages=None, operation: str = "call",
               every_row_writes: bool = False) -> dict:
        """The batch's int32 rows after every check: slots, then pages (``every_row_writes``: each
        live row writes its ``dst_pages``, as flush and load do; see ``check_page_writes``)."""
        self._no_pending_verify(operation)
        slot = check_slots(slots, self.num_slots)
        rows = slot.shape[0]
        src = slot.copy() if src_pages is None else check_pages(src_pages, rows, self.num_pages, slot, "src_pages")
        dst = src.copy() if dst_pages is None else check_pages(dst_pages, rows, self.num_pages, slot, "dst_pages")
        if operation == "load":
            src = dst.copy()  # a load reads no checkpoint: it writes its dst page
        check_page_writes(slot, src, dst, every_row_writes)
        return {"slot": slot, "src_page": src, "dst_page": dst,
                "drafts": np.where(slot >= 0, 1, 0).astype(np.int32), "accepted": np.zeros(rows, np.int32)}

    # --- operations --------------------------------------------------------------------------------
    def step(self, slots, tokens: dict, *, src_pages=None, dst_pages=None, out=None):
        """One decode token per row: append a record and read, or fold and flush. ``[B, HV, V]``.
        ``out`` may be ``[B, HV, V]``, as returned, or ``[B, 1, HV, V]``, the kernels' (verify's T = 1)."""
        batch = self._batch(slots, src_pages, dst_pages, "step")
        rows = batch["slot"].shape[0]
        toks = self._check_tokens(tokens, rows, None)
        out = self._step_output(out, rows)
        self._launch("replay_step", rows, batch, toks, out=out)
        return out[:, 0]

    def verify(self, slots, tokens: dict, drafts, *, src_pages=None, dst_pages=None, out=None):
        """Outputs of ``drafts[b]`` speculative tokens per row (``tokens[name]`` ``[B, T, ...]``);
        writes their records, moves no fill. Follow with ``commit``. Returns ``[B, T, HV, V]``."""
        batch = self._batch(slots, src_pages, dst_pages, "verify")
        rows = batch["slot"].shape[0]
        batch["drafts"] = check_drafts(drafts, batch["slot"], self.config.max_drafts, self.config.capacity)
        t = self._drafts_within_tokens(batch["drafts"], tokens)
        toks = self._check_tokens(tokens, rows, t)
        out = self._output(out, (rows, t, self.shape.heads, self.shape.v_dim), "out")
        self._launch("flush_for_verify", rows, batch, t_tok=t)
        self._launch("verify", rows, batch, toks, out=out)
        self._last_verify = batch, t
        return out

    @property
    def pending_verify(self) -> dict | None:
        """The last verify's rows while it waits for its commit, as host copies ``{"slot", "drafts"}``
        (``[B]`` int32), else None."""
        if self._last_verify is None:
            return None
        batch = self._last_verify[0]
        return {"slot": np.array(batch["slot"]), "drafts": np.array(batch["drafts"])}

    def commit(self, accepted):
        """Accept ``accepted[b]`` of the last verify's drafts per row: a pointer move."""
        if self._last_verify is None:
            raise InputError("commit: no verify to commit (each verify is committed once, before the next step)")
        batch, t = dict(self._last_verify[0]), self._last_verify[1]
        batch["accepted"] = check_accepted(accepted, batch["slot"], batch["drafts"])
        self._launch("commit", batch["slot"].shape[0], batch, t_tok=t)
        self._last_verify = None

    def flush(self, slots, *, src_pages=None, dst_pages=None):
        """Fold every record of the given slots into their checkpoints (fill becomes 0)."""
        batch = self._batch(slots, src_pages, dst_pages, "flush", every_row_writes=True)
        rows = batch["slot"].shape[0]
        self._launch("flush", rows, batch)
        self._launch("reset_fill", rows, batch)

    def load(self, slots, states, *, dst_pages=None):
        """Checkpoint ← ``states`` ``[B, HV, V, K]`` (e.g. prefill's final state); empties the buffer."""
        batch = self._batch(slots, None, dst_pages, "load", every_row_writes=True)
        rows = batch["slot"].shape[0]
        shape = (rows, self.shape.heads, self.shape.v_dim, self.shape.k_dim)
        states = check_array(states, "states", shape, finite_as=self.config.state_dtype, device=self.array_device)
        self._launch("load", rows, batch, initial=states)
        self._launch("reset_fill", rows, batch)

    def materialize(self, slots, *, src_pages=None, out=None):
        """The plain state of each slot, ``[B, HV, V, K]``: checkpoint folded with its records."""
        batch = self._batch(slots, src_pages, operation="materialize")
        rows = batch["slot"].shape[0]
        out = self._output(out, (rows, self.shape.heads, self.shape.v_dim, self.shape.k_dim), "out")
        self._launch("materialize", rows, batch, materialized=out)
        return out

    def copy_records(self, parent: int, child: int) -> None:
        """Give ``child`` a copy of ``parent``'s records and fill (a fork; the checkpoint is shared)."""
        self._no_pending_verify("copy_records")
        parent, child = (check_slot_index(s, self.num_slots, n) for s, n in ((parent, "parent"), (child, "child")))
        for buf in self.program.buffers:
            if buf.role in ("record", "meta"):
                self.buffers[buf.name][child] = self.buffers[buf.name][parent]

    # --- baselines ---------------------------------------------------------------------------------
    def baseline_state(self):
        """The baselines' state ``[pages, HV, V, K]`` (``conventional_step``, ``snapshot_verify``), zeros
        when first asked for: a cache that only replays never allocates it (as much memory as the
        checkpoint pages). Every baseline launch asks for it first (before any graph capture too, as
        ``capture_graphs`` launches once eagerly)."""
        if "state" not in self.buffers:
            buf = self.program.buffer("state")
            self.buffers["state"] = self._zeros(self._dims(buf.dims), buf.dtype)
        return self.buffers["state"]

    def load_conventional(self, slots, states):
        """Baseline state ← ``states``, for ``conventional_step`` and ``snapshot_verify``."""
        batch = self._batch(slots, operation="load_conventional", every_row_writes=True)
        shape = (batch["slot"].shape[0], self.shape.heads, self.shape.v_dim, self.shape.k_dim)
        check_array(states, "states", shape, finite_as=self.config.state_dtype, device=self.array_device)
        self._store_conventional(batch, states)

    def conventional_step(self, slots, tokens: dict, *, out=None):
        """Baseline: read the state, update it in place, output. ``[B, HV, V]`` (``out``: as ``step``'s)."""
        batch = self._batch(slots, operation="conventional_step")
        rows = batch["slot"].shape[0]
        toks = self._check_tokens(tokens, rows, None)
        out = self._step_output(out, rows)
        self._launch("conventional_step", rows, batch, toks, out=out)
        return out[:, 0]

    def snapshot_verify(self, slots, tokens: dict, drafts, *, out=None, snapshots=None):
        """Baseline speculative verify: outputs and one full state per draft ``[B, T, HV, V, K]``."""
        batch = self._batch(slots, operation="snapshot_verify")
        rows = batch["slot"].shape[0]
        batch["drafts"] = check_drafts(drafts, batch["slot"], self.config.max_drafts, self.config.capacity)
        t = self._drafts_within_tokens(batch["drafts"], tokens)
        toks = self._check_tokens(tokens, rows, t)
        out = self._output(out, (rows, t, self.shape.heads, self.shape.v_dim), "out")
        snaps = self._output(snapshots, (rows, t, self.shape.heads, self.shape.v_dim, self.shape.k_dim),
                             "snapshots", dtype=self.config.state_dtype)
        self._launch("snapshot_verify", rows, batch, toks, out=out, snapshots=snaps)
        return out, snaps

    def _drafts_within_tokens(self, drafts: np.ndarray, tokens: dict) -> int:
        """The tokens' T, after checking that no row drafts more than it holds."""
        t = self._token_length(tokens)
        if drafts.max() > t:
            i = int(np.argmax(drafts))
            name = next(s.name for s in self.decl.inputs if s.kind == "token" and s.name in tokens)
            raise InputError(f"drafts[{i}] = {drafts[i]} but tokens hold only T = {t} drafts (tokens[{name!r}] has "
                             f"shape {list(np.shape(tokens[name]))}; verify tokens are [B, T, ...])")
        return t

    @staticmethod
    def _launch_tokens(tokens: dict | None, t_tok: int | None) -> int:
        """``t_tok`` of a launch: the given one, else the tokens' T (``[B, T, ...]``), else 1."""
        if t_tok is not None:
            return t_tok
        return next((int(np.shape(v)[1]) for v in (tokens or {}).values()), 1)

    def _token_length(self, tokens: dict) -> int:
        for spec in self.decl.inputs:
            if spec.kind == "token" and spec.name in tokens:
                shape = getattr(tokens[spec.name], "shape", ())
                if len(shape) < 2:
                    raise InputError(f"tokens[{spec.name!r}]: verify tokens are [B, T, ...], got {list(shape)}")
                return int(shape[1])
        raise InputError("tokens: no declared token input given")

    # --- backend hooks -----------------------------------------------------------------------------
    def poisoned(self, shape):
        """A float32 output array of this backend filled with NaN (tests pass it as ``out=``)."""
        out = self._output(None, shape, "out")
        out[...] = np.nan
        return out

    def _output(self, out, shape, name, dtype="float32"):
        raise NotImplementedError

    def _zeros(self, shape: tuple, dtype: str):
        """A zeroed buffer of this backend in the storage of ``dtype`` (a lowered buffer's dtype name)."""
        raise NotImplementedError

    def _allocate_buffers(self) -> None:
        """The cache's own buffers (checkpoint pages, records, fills; not the baselines' ``state``,
        which ``baseline_state`` allocates when first used)."""
        self.buffers = {buf.name: self._zeros(self._dims(buf.dims), buf.dtype) for buf in self.program.buffers
                        if buf.role in ("state", "record", "meta") and "B" not in buf.dims
                        and buf.name not in BASELINE_BUFFERS}

    def _launch(self, kernel: str, rows: int, batch: dict, tokens: dict | None = None, *,
                t_tok: int | None = None, **arrays):
        """Run one generated kernel over ``rows`` batch rows. ``t_tok`` is the token count T the kernel's
        rows are checked against (default: the tokens' T, else 1); every kernel of one verify gets the
        same T, so a row whose draft count exceeds it is skipped by all of them."""
        raise NotImplementedError

    def _store_conventional(self, batch: dict, states) -> None:
        raise NotImplementedError

    def fills(self) -> np.ndarray:
        """Per-slot fills, copied to the host (a synchronising read; not for the decode loop)."""
        raise NotImplementedError

    def _step_output(self, out, rows: int):
        """A step's output ``[B, 1, HV, V]`` (verify's layout, T = 1): new, or ``out`` checked, given
        in that shape or in the ``[B, HV, V]`` a step returns (then written through a view)."""
        if len(getattr(out, "shape", ())) == 3:
            return self._output(out, (rows, self.shape.heads, self.shape.v_dim), "out")[:, None]
        return self._output(out, (rows, 1, self.shape.heads, self.shape.v_dim), "out")

    def _page_index(self, page) -> int:
        """``checkpoint``'s page, an int in ``[0, pages)`` (a negative one would count from the end)."""
        index = as_index(page)
        if index is None or not 0 <= index < self.num_pages:
            raise InputError(f"page: expected a checkpoint page, an int in [0, {self.num_pages}), got {page!r}")
        return index
