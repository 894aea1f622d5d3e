"""Runtime layer: the replay cache on the GPU (CuPy device buffers, generated kernels).

Same API as ``CpuReplayCache`` (``cache_base.py``). Tokens and states may be CuPy arrays or torch
tensors on the GPU (shared without copies through ``__cuda_array_interface__``), float32 (token
inputs declared bf16: bf16 or its raw bits, see ``_device_token``) and C-contiguous; host arrays
(NumPy, CPU torch tensors) are copied over, but an ``out=`` must be a device array. Slot and page
arrays are checked on the host, then copied to the device. For CUDA-graph capture, ``launch_step``/``launch_verify``/``launch_commit``
take device-resident int32 batch arrays and do no host work at all.
"""

from __future__ import annotations

import contextlib

import numpy as np

from replayssm_dsl.errors import InputError, LoweringError
from replayssm_dsl.lowering.launch import LaunchConfig, fallback_launches, kernel_arguments
from replayssm_dsl.lowering.render_cuda import render_program

from replayssm_dsl.bfloat16 import bfloat16_bits

from .cache_base import BASELINE_KERNELS, ReplayCacheBase
from .autotune import family_of, group_kernels, group_of, lookup
from .cuda_module import CompiledProgram, as_cupy_stream, require_gpu
from .validation import (BF16_BITS_DTYPES, FLOAT_DTYPES, check_aligned, dtype_name, is_device_array,
                         readable_host_array)

STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}  # bf16 kept as raw bits


def device_tokens(cp, decl, tokens: dict) -> dict:
    """Host token arrays → device arrays in the dtype the kernels read (float32, or raw bf16 bits for
    inputs declared bf16), so a captured graph launches the kernels alone (no conversion on the way)."""
    return {name: cp.asarray(bfloat16_bits(value) if decl.input(name).dtype == "bfloat16"
                             else np.asarray(value, np.float32)) for name, value in tokens.items()}


class CudaReplayCache(ReplayCacheBase):
    def __init__(self, decl, shape, config=None, *, slots: int, params: dict, pages: int | None = None,
                 launch: LaunchConfig | None = None, stream=None):
        super().__init__(decl, shape, config, slots=slots, params=params, pages=pages)
        cp = require_gpu("the CUDA backend")  # a clear error, not CUDA's traceback, on a machine without a GPU
        self.cp, self.stream = cp, stream
        self.fixed_launch = launch
        self._compiled: dict[tuple[LaunchConfig, str], CompiledProgram] = {}  # (launch, family) -> module
        self._tuned: dict[tuple[int, str], LaunchConfig | None] = {}
        self._fitting: dict[tuple[int, str], LaunchConfig] = {}
        self.compiled = self.module_for("replay", 1)
        self._allocate_buffers()
        for name, value in self.params.items():
            self.buffers[name] = cp.ascontiguousarray(cp.asarray(value, dtype=cp.float32))
        self._dummy = {"float": cp.zeros(4, cp.float32), "int": cp.zeros(4, cp.int32),
                       "state": cp.zeros(4, STORAGE[self.config.state_dtype])}
        self._args = kernel_arguments(self.program)

    def module_for(self, group: str, rows: int) -> CompiledProgram:
        """The module that runs ``group``'s kernels (``group_kernels``) for a batch of ``rows``: at a fixed
        launch if given, else the autotuner's entry for the group (verify_few falls back to verify's),
        else ``choose_launch``'s shape or the first fallback that builds (``_fitting_launch``)."""
        family = family_of(group)
        launch = (self.fixed_launch or self._tuned_launch(rows, group)
                  or (self._tuned_launch(rows, "verify") if group == "verify_few" else None)
                  or self._fitting_launch(rows, family))
        return self._module(launch, family)

    def _module(self, launch: LaunchConfig, family: str) -> CompiledProgram:
        if (launch, family) not in self._compiled:
            self._compiled[launch, family] = self._new_module(launch, family)
        return self._compiled[launch, family]

    def _new_module(self, launch: LaunchConfig, family: str) -> CompiledProgram:
        """The module of ``family``'s kernels (``group_kernels``) at ``launch``, not yet kept."""
        return CompiledProgram(self.program, launch, group_kernels(self.program, family))

    def _compiled_for(self, rows: int, kernel: str = "replay_step", drafts: int | None = None) -> CompiledProgram:
        """The module that runs ``kernel`` for a batch of ``rows`` (and, for verify's kernels, ``drafts``
        tokens): its group's (``group_of``: replay, verify, verify_few or conventional)."""
        return self.module_for(group_of(kernel, drafts), rows)

    def _tuned_launch(self, rows: int, group: str) -> LaunchConfig | None:
        """The autotuner's table entry, read once per batch size and kernel group."""
        if (rows, group) not in self._tuned:
            self._tuned[rows, group] = lookup(self.program, rows, group)
        return self._tuned[rows, group]

    def _fitting_launch(self, rows: int, family: str) -> LaunchConfig:
        """The first of ``fallback_launches`` (``choose_launch``'s shape, then smaller ones) whose
        kernels fit in 48 KiB of static shared memory and do not spill to local memory (a declaration
        with more per-token fields than the built-ins may pass either at the first); a shape that
        spills is used only when none builds clean. Remembered per ``rows`` and family."""
        if (rows, family) in self._fitting:
            return self._fitting[rows, family]
        fallbacks = fallback_launches(self.shape, rows, family, self.config)
        spilling = None
        for launch in fallbacks:
            compiled = self._compiled.get((launch, family)) or self._new_module(launch, family)
            spills = compiled.local_memory()
            if spills is None:
                continue  # does not build (e.g. too much shared memory): not kept
            self._compiled[launch, family] = compiled
            if not spills:
                break
            spilling = spilling or launch
        else:
            if spilling is None:
                labels = [c.label for c in fallbacks]
                raise LoweringError(f"no launch shape of {labels} builds the {family} kernels for "
                                    f"{self.program.declaration.name!r} at {self.shape} (static shared memory "
                                    "is limited to 48 KiB per CTA; a smaller window or max_drafts needs less)")
            launch = spilling
        self._fitting[rows, family] = launch
        return launch

    @property
    def source(self) -> str:
        """The generated CUDA source of all this cache's kernels at the replay group's launch shape for
        one batch row (each group launches from a module of its own kernels: ``module_for``)."""
        return render_program(self.program, self.compiled.launch)

    def _zeros(self, shape, dtype):
        """Zeros written on this cache's stream, so its kernels see them without a wait between streams
        (``baseline_state`` allocates just before the first baseline launch)."""
        with self._on_stream():
            return self.cp.zeros(shape, np.int32 if dtype == "int32" else STORAGE[dtype])

    def _on_stream(self):
        """CuPy's current stream set to this cache's (a CuPy or torch stream), or left as it is."""
        stream = as_cupy_stream(self.stream)
        return stream if stream is not None else contextlib.nullcontext()

    def _device(self, array, name: str = "array", dtype=np.float32):
        """A CuPy view of a device array (no copy), or a device copy of a host array (NumPy, a CPU torch
        tensor) in ``dtype``."""
        cp = self.cp
        if isinstance(array, np.ndarray):
            return cp.asarray(array, dtype=dtype)
        if hasattr(array, "shape") and not is_device_array(array):
            return cp.asarray(readable_host_array(array, name), dtype=dtype)
        if isinstance(array, cp.ndarray) or hasattr(array, "__cuda_array_interface__"):
            dev = cp.asarray(array)
        elif hasattr(array, "__dlpack__"):
            dev = cp.from_dlpack(array)
        else:
            raise InputError(f"{name}: expected a CuPy array, torch CUDA tensor or NumPy array, "
                             f"got {type(array).__name__}")
        if dev.dtype != dtype:
            raise InputError(f"{name}: device arrays must be {np.dtype(dtype).name}, got {dev.dtype}")
        if not dev.flags.c_contiguous:
            raise InputError(f"{name}: must be C-contiguous, got strides {dev.strides}")
        return dev

    def _check_tokens(self, tokens: dict, rows: int, t: int | None) -> dict:
        """The shared checks, then every token as its kernels read it (``_device_token``: device, dtype,
        layout), so a token the kernels cannot take raises here, before any launch: verify launches
        ``flush_for_verify`` before the kernel that reads the tokens."""
        checked = super()._check_tokens(tokens, rows, t)
        return {name: self._device_token(name, value) for name, value in checked.items()}

    def _host_bfloat16(self, bits: np.ndarray, values: np.ndarray) -> np.ndarray:
        """The kernels read raw bf16 bits: a checked host bf16 token leaves as its bits (not rounded again)."""
        return bits

    def _device_token(self, name: str, value, convert: bool = True):
        """Token input ``name`` as its kernels read it (``_token_as_read``); a per-row (V-sized) input
        starts at a 16-byte aligned address, as verify's copies of its rows need (``check_aligned``)."""
        dev = self._token_as_read(name, value, convert)
        if self.decl.input(name).size == "V":
            check_aligned(dev.data.ptr, f"tokens[{name!r}]", "verify copies its rows in 16-byte chunks")
        return dev

    def _token_as_read(self, name: str, value, convert: bool):
        """Token input ``name`` as its kernels read it: float32, or raw bf16 bits (``uint16``) where the
        declaration says bf16. Those accept raw bits (``uint16``/``int16``, e.g. a torch bf16 tensor's
        ``.view(torch.int16)``), a torch bf16 tensor itself, host floats, and with ``convert`` (the
        checked calls, not the graph-capturable ``launch_*``, whose launches must not allocate) float32
        device values, rounded to bf16 on this cache's stream."""
        label = f"tokens[{name!r}]"
        if self.decl.input(name).dtype != "bfloat16":
            return self._device(value, label)
        cp = self.cp
        if dtype_name(value) == "bfloat16" and hasattr(value, "view"):  # torch: no CUDA array interface for bf16
            import torch
            value = value.view(torch.int16)
        dtype = dtype_name(value)
        if dtype in BF16_BITS_DTYPES:
            return self._device(value, label, np.dtype(dtype)).view(cp.uint16)
        if isinstance(value, np.ndarray) and dtype in FLOAT_DTYPES:  # host floats: their bf16 bits
            return cp.asarray(bfloat16_bits(value))
        if dtype == "float32" and convert:
            with self._on_stream():
                return bfloat16_bits(self._device(value, label), xp=cp)
        if dtype == "float32":
            raise InputError(f"{label}: declared bfloat16; launch_step and launch_verify take a bf16 tensor or its "
                             "raw bits (uint16 or int16), not float32 (no conversion inside a capturable launch)")
        raise InputError(f"{label}: declared bfloat16; pass float32 values, a bf16 tensor or its raw bits "
                         f"(uint16 or int16), got {dtype}")

    def _output(self, out, shape, name, dtype="float32"):
        cp = self.cp
        if out is None:
            return cp.empty(shape, STORAGE[dtype])
        if not is_device_array(out):  # a device copy of it would take the outputs, and ``out`` would keep none
            raise InputError(f"{name}: must be a device array (CuPy or a torch CUDA tensor) for the CUDA backend, "
                             f"got {type(out).__name__} on the host")
        dev = self._device(out, name, STORAGE[dtype])
        if tuple(dev.shape) != tuple(shape):
            raise InputError(f"{name}: expected shape {list(shape)}, got {list(dev.shape)}")
        return dev

    def _device_batch(self, batch: dict) -> dict:
        return {k: self.cp.asarray(v, dtype=self.cp.int32) for k, v in batch.items()}

    def _launch_tokens_as_read(self, tokens: dict) -> dict:
        """Tokens of a graph-capturable launch as the kernels read them (``_device_token`` without
        conversion: a launch that may be captured allocates nothing)."""
        return {name: self._device_token(name, value, convert=False) for name, value in tokens.items()}

    def _launch(self, kernel, rows, batch, tokens=None, *, t_tok=None, **arrays):
        """``tokens`` come as the kernels read them (``_check_tokens`` or ``_launch_tokens_as_read`` made
        them so): each is passed once through ``_device_token``, not again here."""
        if kernel in BASELINE_KERNELS:
            self.baseline_state()
        dev = batch if isinstance(next(iter(batch.values())), self.cp.ndarray) else self._device_batch(batch)
        toks = tokens or {}
        t_tok = self._launch_tokens(toks, t_tok)
        named = {**self.buffers}
        for name, value in arrays.items():
            named[name] = self._device(value, name, STORAGE[self.config.state_dtype] if name == "snapshots" else np.float32)
        args = []
        for ctype, name in self._args:
            if name == "rows":
                args.append(np.int32(rows))
            elif name == "t_tok":
                args.append(np.int32(t_tok))
            elif name == "num_slots":
                args.append(np.int32(self.num_slots))
            elif name == "num_pages":
                args.append(np.int32(self.num_pages))
            elif name == "slots":
                args.append(dev["slot"])
            elif name in dev:
                args.append(dev[name])
            elif name.startswith("tok_") and name[4:] in toks:
                args.append(toks[name[4:]])
            elif name.startswith("par_"):
                args.append(self.buffers[name[4:]])
            elif name in named:
                args.append(named[name])
            else:
                args.append(self._dummy["state" if ctype == "STATE_T*" else "int" if "int" in ctype else "float"])
        self._compiled_for(rows, kernel, t_tok).launch_kernel(kernel, rows, tuple(args), self.stream)

    def _to_storage(self, values):
        """float32 device values → the state buffer's storage (bf16 as round-to-nearest-even bits)."""
        cp = self.cp
        if self.config.state_dtype != "bfloat16":
            return values.astype(STORAGE[self.config.state_dtype])
        return bfloat16_bits(values, xp=cp)

    def _store_conventional(self, batch, states):
        states = self._device(states, "states")
        live = np.flatnonzero(batch["slot"] >= 0)
        pages = self.cp.asarray(batch["src_page"][live])
        self.baseline_state()[pages] = self._to_storage(states[self.cp.asarray(live)])

    def fills(self) -> np.ndarray:
        return self.cp.asnumpy(self.buffers["fill"])

    def checkpoint(self, page: int):
        return self.cp.asnumpy(self.buffers["checkpoint"][self._page_index(page)])

    # --- graph-capturable launches: device-resident batch arrays, no host work ------------------------
    def launch_step(self, batch: dict, tokens: dict, out) -> None:
        """``batch``: device int32 arrays ``slot, src_page, dst_page, drafts, accepted`` ``[B]``;
        ``tokens[name]``: device ``[B, 1, ...]``; ``out``: ``[B, 1, HV, V]``. No host checks: a row whose
        slot or page is outside this cache is skipped by the kernels (nothing written, output untouched).
        Slots must be unique within the batch (as the host path checks)."""
        rows = int(batch["slot"].shape[0])
        self._launch("replay_step", rows, batch, self._launch_tokens_as_read(tokens), out=out)

    def launch_verify(self, batch: dict, tokens: dict, out) -> None:
        """``tokens[name]``: device ``[B, T, ...]``; ``out``: ``[B, T, HV, V]``. A row whose draft count is
        outside [1, min(T, T_max)] is skipped by both kernels (its buffer is neither folded nor written)."""
        rows = int(batch["slot"].shape[0])
        tokens = self._launch_tokens_as_read(tokens)  # before flush_for_verify: a wrong token launches nothing
        t = int(next(iter(tokens.values())).shape[1])
        self._launch("flush_for_verify", rows, batch, t_tok=t)
        self._launch("verify", rows, batch, tokens, out=out)

    def launch_commit(self, batch: dict, t_tok: int | None = None) -> None:
        """Commit ``batch["accepted"]`` of the verify launched with the same ``batch``. ``t_tok``: that
        verify's T, so rows it skipped are skipped here too (default ``max_drafts``: rows are then
        checked only against the buffers)."""
        self._launch("commit", int(batch["slot"].shape[0]), batch,
                     t_tok=self.config.max_drafts if t_tok is None else t_tok)
