"""Runtime layer: a lowered program compiled for the GPU through CuPy's ``RawModule``.

``CompiledProgram.source`` is the generated CUDA; modules are cached in-process by the sha256 of
their source (CuPy keeps its own on-disk cache of cubins under the same key), and each source is
written to ``REPLAYSSM_DUMP_DIR`` when that is set. Kernels launch on the caller's current stream:
a CuPy stream, or a torch stream passed as ``stream=`` (anything with ``__cuda_stream__`` or
``cuda_stream``).
"""

from __future__ import annotations

import hashlib

from replayssm_dsl import knobs
from replayssm_dsl.errors import BackendUnavailable
from replayssm_dsl.lowering.ir import Program
from replayssm_dsl.lowering.launch import LaunchConfig, grid_of
from replayssm_dsl.lowering.render_cuda import render_program
from replayssm_dsl.lowering.render_replay import dynamic_shared_bytes

from .nvrtc_compile import NVRTC_OPTIONS

_MODULES: dict[str, object] = {}


def _cupy():
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BackendUnavailable("the CUDA backend needs CuPy: pip install 'replayssm-dsl[cuda]'") from exc
    return cupy


def require_gpu(what: str):
    """CuPy, where it sees a GPU; else ``BackendUnavailable`` saying that ``what`` needs one."""
    cupy = _cupy()
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise BackendUnavailable(f"{what} needs a CUDA GPU; CUDA says: {exc}") from exc
    if count == 0:
        raise BackendUnavailable(f"{what} needs a CUDA GPU; CuPy sees none")
    return cupy


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def as_cupy_stream(stream):
    """A CuPy stream for ``stream`` (None: the current one; CuPy stream; torch stream)."""
    cupy = _cupy()
    if stream is None or isinstance(stream, cupy.cuda.Stream):
        return stream
    if hasattr(stream, "__cuda_stream__") and hasattr(cupy.cuda.Stream, "from_external"):
        return cupy.cuda.Stream.from_external(stream)
    if hasattr(stream, "__cuda_stream__"):
        _, handle = stream.__cuda_stream__()
    elif hasattr(stream, "cuda_stream"):
        handle = stream.cuda_stream
    else:
        raise TypeError(f"stream: expected a CuPy or torch CUDA stream, got {type(stream).__name__}")
    return cupy.cuda.ExternalStream(int(handle))


class CompiledProgram:
    """The CUDA module of one program and launch configuration: all its kernels, or the named ``kernels``."""

    def __init__(self, program: Program, launch: LaunchConfig | None = None, kernels=None):
        self.program = program
        self.launch = launch or LaunchConfig()
        self.kernel_names = tuple(kernels) if kernels is not None else tuple(k.name for k in program.kernels)
        self.source = render_program(program, self.launch, kernels=kernels)
        self.hash = source_hash(self.source)
        self._module = None
        self._kernels = {}
        # bytes of dynamic shared memory each kernel launches with (the replay step's shared rows, verify's write records)
        self.dynamic_shared = {name: dynamic_shared_bytes(program.kernel(name), program, self.launch)
                               for name in self.kernel_names}
        self.dumped = self._dump()

    @property
    def module(self):
        if self._module is None:
            self._module = _MODULES.get(self.hash)
            if self._module is None:
                cupy = _cupy()
                self._module = cupy.RawModule(code=self.source, options=NVRTC_OPTIONS,
                                              name_expressions=None)
                _MODULES[self.hash] = self._module
        return self._module

    def _dump(self):
        """Write the source to ``REPLAYSSM_DUMP_DIR`` when set; return the path (or None)."""
        where = knobs.dump_dir()
        if where is None:
            return None
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"{self.program.declaration.name}-{self.hash[:12]}.cu"
        path.write_text(self.source)
        return path

    def local_memory(self) -> dict | None:
        """Kernel name → bytes of local memory per thread (spills or stack), empty when there is none;
        ``None`` when the module does not build (NVRTC or the module load refuses it, e.g. more than
        48 KiB of static shared memory)."""
        cupy = _cupy()
        try:
            sizes = {name: self.kernel(name).attributes["local_size_bytes"] for name in self.kernel_names}
        except (cupy.cuda.compiler.CompileException, cupy.cuda.driver.CUDADriverError):
            return None
        return {name: size for name, size in sizes.items() if size}

    def kernel(self, name: str):
        """The kernel ``name``, allowed the dynamic shared memory it launches with (past 48 KiB of
        static and dynamic together only once allowed)."""
        if name not in self._kernels:
            kernel = self.module.get_function(name)
            if self.dynamic_shared[name]:
                kernel.max_dynamic_shared_size_bytes = self.dynamic_shared[name]
            self._kernels[name] = kernel
        return self._kernels[name]

    def launch_kernel(self, name: str, rows: int, args: tuple, stream=None) -> None:
        grid, block = grid_of(self.program.kernel(name), self.program, self.launch, rows)
        shared = self.dynamic_shared[name]
        kernel = self.kernel(name)
        stream = as_cupy_stream(stream)
        if stream is None:
            kernel(grid, block, args, shared_mem=shared)
        else:
            with stream:
                kernel(grid, block, args, shared_mem=shared)
