"""Runtime layer: the CPU backend, the lowered plans executed by NumPy (float64 or float32).

The reference every GPU kernel is checked against: the same buffers, layouts and kernel sequence as
the CUDA backend, interpreted by ``lowering.interpret``. Needs no GPU and no CuPy.
"""

from __future__ import annotations

import numpy as np

from replayssm_dsl.errors import ConfigError, InputError
from replayssm_dsl.lowering.interpret import Interpreter

from .cache_base import BASELINE_KERNELS, ReplayCacheBase
from .validation import host_values

PRECISIONS = {"float64": np.float64, "float32": np.float32}


class CpuReplayCache(ReplayCacheBase):
    """Replay cache on the host. ``precision="float64"`` is the exact reference; ``"float32"`` stores
    and computes in FP32 like the GPU. Half-precision checkpoints are rounded on every store."""

    array_device = "cpu"  # tokens and states: NumPy arrays or CPU torch tensors

    def __init__(self, decl, shape, config=None, *, slots: int, params: dict, pages: int | None = None,
                 precision: str = "float64"):
        super().__init__(decl, shape, config, slots=slots, params=params, pages=pages)
        if precision not in PRECISIONS:
            raise ConfigError(f"precision: {precision!r}; use 'float64' or 'float32'")
        self.compute = np.dtype(PRECISIONS[precision])
        self.interpreter = Interpreter(self.program, self.compute)
        self._allocate_buffers()
        self.buffers.update({k: v.astype(self.compute) for k, v in self.params.items()})

    def _storage_dtype(self, dtype: str):
        return np.float16 if dtype == "float16" else self.compute

    def _zeros(self, shape, dtype):
        return np.zeros(shape, np.int32 if dtype == "int32" else self._storage_dtype(dtype))

    def _check_tokens(self, tokens, rows, t):
        """The shared checks (which refuse a token not on the host, naming it), then every token as a
        NumPy array of the compute dtype, so nothing that could fail is left for the launches (verify
        folds its buffers with ``flush_for_verify`` before the kernel that reads the tokens)."""
        checked = super()._check_tokens(tokens, rows, t)
        return {name: np.asarray(host_values(value), self.compute) for name, value in checked.items()}

    def _output(self, out, shape, name, dtype="float32"):
        """A new NaN-filled output, or ``out`` checked: a writeable NumPy array of ``shape`` in this
        cache's dtype for it (the compute dtype, or float32 as on the GPU), so no value is truncated
        and no write fails once a kernel of the call has run."""
        own = np.dtype(self._storage_dtype(dtype) if dtype != "float32" else self.compute)
        if out is None:
            return np.full(shape, np.nan, own)
        if not isinstance(out, np.ndarray):
            raise InputError(f"{name}: expected a NumPy array for the CPU backend, got {type(out).__name__}")
        if tuple(out.shape) != tuple(shape):
            raise InputError(f"{name}: expected shape {list(shape)}, got {list(out.shape)}")
        accepted = {own, np.dtype(np.float32)} if dtype == "float32" else {own}
        if out.dtype not in accepted:
            raise InputError(f"{name}: dtype {out.dtype} not accepted; use {' or '.join(sorted(d.name for d in accepted))}")
        if not out.flags.writeable:
            raise InputError(f"{name}: is read-only; pass a writeable array")
        return out

    def _launch(self, kernel, rows, batch, tokens=None, *, t_tok=None, **arrays):
        if kernel in BASELINE_KERNELS:
            self.baseline_state()
        bufs = dict(self.buffers)
        bufs.update(batch)
        bufs.update({k: np.asarray(v, self.compute) for k, v in (tokens or {}).items()})
        bufs["t_tok"] = self._launch_tokens(tokens, t_tok)
        for name, arr in arrays.items():  # outputs (NumPy, from ``_output``) and load's states
            bufs[name] = arr if isinstance(arr, np.ndarray) else host_values(arr)
        self.interpreter.run(kernel, bufs, rows)

    def _store_conventional(self, batch, states):
        live = batch["slot"] >= 0
        self.baseline_state()[batch["src_page"][live]] = host_values(states)[live]

    def fills(self) -> np.ndarray:
        return self.buffers["fill"].copy()

    def checkpoint(self, page: int) -> np.ndarray:
        return self.buffers["checkpoint"][self._page_index(page)].copy()
