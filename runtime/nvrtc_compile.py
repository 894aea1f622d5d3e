"""Runtime layer: compile generated CUDA with NVRTC (cuda-python) and read the ptxas report.

Works without a GPU (CI compiles every generated kernel for sm_90 this way). Needs
``cuda-python`` and ``nvidia-cuda-nvrtc`` (the ``nvrtc`` or ``cuda`` extra).

NVRTC (12.9 on) caches cubins where a CUDA driver is installed, and a cubin from its cache comes
without ptxas's report (measured on the GPU machine: a second compile of one source reported no
kernel); ``compile_cubin`` compiles with ``--no-cache`` for that reason, and raises where the report
is still missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from replayssm_dsl.errors import BackendUnavailable

NVRTC_OPTIONS = ("-std=c++17",)  # every module's, here and through CuPy (part of its cache key)
_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_WARNING = re.compile(r"(?i)\bwarning\b")
_REGS = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


@dataclass(frozen=True)
class KernelResources:
    registers: int
    stack_frame: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int

    @property
    def clean(self) -> bool:
        """No spills and no local memory (stack frame)."""
        return self.stack_frame == 0 and self.spill_stores == 0 and self.spill_loads == 0


@dataclass(frozen=True)
class CompileResult:
    cubin: bytes
    log: str
    resources: dict  # kernel name -> KernelResources

    @property
    def warnings(self) -> list[str]:
        """The compiler's warning lines (generated sources compile without any)."""
        return [line for line in self.log.splitlines()
                if _WARNING.search(line) and not line.startswith("Remark")]  # "Remark: The warnings can be suppressed"


def parse_ptxas_report(log: str) -> dict:
    out, current, frame = {}, None, None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current, frame = m.group(1), None
        elif (m := _FRAME.search(line)) and current:
            frame = tuple(int(x) for x in m.groups())
        elif (m := _REGS.search(line)) and current and frame is not None:
            out[current] = KernelResources(int(m.group(1)), *frame, int(m.group(2) or 0))
            current = None
    return out


def _check(result, what: str):
    err = result[0]
    if int(err) != 0:
        raise RuntimeError(f"NVRTC {what} failed: {err}")
    return result[1:] if len(result) > 2 else (result[1] if len(result) == 2 else None)


def compile_cubin(source: str, name: str = "replayssm.cu", arch: str = "sm_90") -> CompileResult:
    """Compile ``source`` to a cubin for ``arch`` with ``ptxas -v``; raise with the log on error, and
    where the compile succeeds without a ptxas report for a source with kernels (a cubin from a cache)."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BackendUnavailable("NVRTC needs cuda-python: pip install 'replayssm-dsl[nvrtc]'") from exc
    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "create")
    opts = [f"--gpu-architecture={arch}".encode(), b"--ptxas-options=-v", b"--no-cache"] + [o.encode() for o in NVRTC_OPTIONS]
    status = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
    size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
    log = bytes(size)  # zeros: an empty log (size 1) must not write into the shared one-byte b" "
    nvrtc.nvrtcGetProgramLog(prog, log)
    text = log.decode(errors="replace").replace("\x00", "")  # NVRTC ends the log, and at times a line, with NULs
    if int(status) != 0:
        nvrtc.nvrtcDestroyProgram(prog)
        raise RuntimeError(f"NVRTC could not compile {name} for {arch}:\n{text}")
    size = _check(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
    cubin = bytes(size)
    nvrtc.nvrtcGetCUBIN(prog, cubin)
    nvrtc.nvrtcDestroyProgram(prog)
    resources = parse_ptxas_report(text)
    if not resources and "__global__" in source:
        raise RuntimeError(f"NVRTC compiled {name} for {arch} without a ptxas report (a cubin from a cache, "
                           "although compiled with --no-cache?)")
    return CompileResult(cubin, text, resources)
