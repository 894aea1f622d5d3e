"""Does NVRTC on this machine take cubins from the CUDA compute cache (and then drop ptxas's report)?

A measurement script for the GPU machine (no GPU needed): compiles one fresh source (a unique comment)
twice with plain NVRTC calls, then twice through ``compile_cubin`` (which compiles with
``--no-cache``), and prints how many kernels each ptxas report names.

Usage: ``python scripts/nvrtc_cache_probe.py``.
"""

from __future__ import annotations

import time

from cuda.bindings import nvrtc

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.lowering.launch import choose_launch
from replayssm_dsl.lowering.lower import lower
from replayssm_dsl.lowering.render_cuda import render_program
from replayssm_dsl.runtime.nvrtc_compile import compile_cubin, parse_ptxas_report


def plain_nvrtc_report(source: str) -> int:
    """Kernels in the ptxas report of one plain NVRTC compile (the environment as it is)."""
    prog = nvrtc.nvrtcCreateProgram(source.encode(), b"probe.cu", 0, [], [])[1]
    opts = [b"--gpu-architecture=sm_90", b"--ptxas-options=-v", b"-std=c++17"]
    assert int(nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]) == 0
    log = bytes(nvrtc.nvrtcGetProgramLogSize(prog)[1])
    nvrtc.nvrtcGetProgramLog(prog, log)
    nvrtc.nvrtcDestroyProgram(prog)
    return len(parse_ptxas_report(log.decode(errors="replace")))


shape = ModelShape(2, 1, 8, 32)
source = f"// probe {time.time_ns()}\n" + render_program(lower(variants.get("gdn"), shape, ReplayConfig()), choose_launch(shape, 1))
print("NVRTC", nvrtc.nvrtcVersion()[1:])
print("plain NVRTC, first and second compile:", plain_nvrtc_report(source), plain_nvrtc_report(source))
try:
    print("compile_cubin, twice:", len(compile_cubin(source).resources), len(compile_cubin(source).resources))
except RuntimeError as exc:
    print("compile_cubin raised:", exc)
