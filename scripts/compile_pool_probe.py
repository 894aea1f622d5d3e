"""What compiling the tuner's candidates on a pool of threads saves (``runtime/parallel_compile.py``).

A measurement script (CuPy and NVRTC; a GPU optional). For one preset's candidates of one group it
compiles each source once one by one and once on ``--workers`` threads (``warm_kernel_cache``), every
source made new by a comment so that neither finds the other's cubins, and prints the seconds and how
many cubins each left in CuPy's kernel cache. With a GPU it compiles as ``CompiledProgram.module``
does (``cupy_compile``) and then times loading the pool's modules as the tuner would. Without one,
CuPy's compile for sm_90 is called with the architecture given (CuPy asks the driver for it
otherwise), below ``RawModule``'s entry (so under other cache keys than its own); it shows the
threads' overlap and that the cubin is written before the module load, which then fails for want of
a driver. That the tuner's loads find the pool's cubins is the GPU test's to show
(``tests/test_parallel_compile.py``).

Usage: ``python scripts/compile_pool_probe.py [--preset kimi-linear] [--group replay] [--workers 16]``.
"""

from __future__ import annotations

import argparse
import time
import uuid

import cupy

from replayssm_dsl.lowering import lower
from replayssm_dsl.runtime.autotune import family_of, group_kernels, tuning_sources
from replayssm_dsl.runtime.benchmark import preset_setup
from replayssm_dsl.runtime.nvrtc_compile import NVRTC_OPTIONS
from replayssm_dsl.runtime.parallel_compile import cupy_compile, warm_kernel_cache


def has_gpu() -> bool:
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except cupy.cuda.runtime.CUDARuntimeError:
        return False


def compile_without_gpu(source: str) -> None:
    """CuPy's compile into its cache for sm_90, the architecture given (the load after it fails here)."""
    cupy.cuda.compiler._compile_with_cache_cuda(source, NVRTC_OPTIONS, "90")


def cached_cubins() -> set:
    from pathlib import Path

    backend = cupy.cuda.compiler._kernel_cache_backend  # CuPy 14: the folder is read once at import
    return set(Path(backend._cache_dir).glob("*.cubin"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="kimi-linear")
    parser.add_argument("--group", default="replay")
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()
    gpu = has_gpu()
    if gpu:
        device = cupy.cuda.Device().id
        compile_one = lambda source: cupy_compile(source, device)  # noqa: E731
    else:  # what CuPy passes NVRTC for sm_90, which it would ask the driver about
        cupy.cuda.compiler._get_arch_for_options_for_nvrtc = lambda arch=None: ("-arch=sm_90", "cubin")
        compile_one = compile_without_gpu
    decl, shape, config, _, _ = preset_setup(args.preset)
    program = lower(decl, shape, config)
    base = tuning_sources(program, args.group)
    print(f"{args.preset} {args.group}: {len(base)} candidates; {'GPU' if gpu else 'no GPU'}")
    for label, workers in (("one by one", 1), (f"{args.workers} threads", args.workers)):
        sources = [source + f"// {uuid.uuid4()}\n" for source in base]
        before, t0 = cached_cubins(), time.perf_counter()
        if workers == 1:
            failed = 0
            for source in sources:
                try:
                    compile_one(source)
                except Exception:  # noqa: BLE001 - without a GPU the load after the compile fails
                    failed += 1
        else:
            failed = len(warm_kernel_cache(sources, workers, compile_one))
        seconds = time.perf_counter() - t0
        print(f"{label}: {seconds:.1f} s, {len(cached_cubins() - before)} cubins cached, {failed} raised")
    if gpu:  # the tuner's loads of the pool's modules
        t0 = time.perf_counter()
        kernel = group_kernels(program, family_of(args.group))[0]
        for source in sources:
            cupy.RawModule(code=source, options=NVRTC_OPTIONS, name_expressions=None).get_function(kernel)
        print(f"loads after the pool: {time.perf_counter() - t0:.2f} s for {len(sources)} modules")


if __name__ == "__main__":
    main()
