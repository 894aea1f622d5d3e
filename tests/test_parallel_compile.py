"""The tuner's candidates compiled at once (runtime/parallel_compile.py): what it compiles, that a
failure is returned and not raised, that nothing is compiled twice, the knob; with NVRTC the cubins
match one-by-one compiles, and on the GPU CuPy's cache holds them before the loads."""

from __future__ import annotations

import re
import threading
from types import SimpleNamespace

import pytest

from replayssm_dsl import knobs, variants
from replayssm_dsl.config import PRESETS
from replayssm_dsl.errors import ConfigError
from replayssm_dsl.lowering import lower
from replayssm_dsl.runtime import parallel_compile
from replayssm_dsl.runtime.autotune import distinct_candidates, group_kernels, tuning_sources
from replayssm_dsl.runtime.benchmark import preset_setup
from replayssm_dsl.runtime.cuda_cache import CudaReplayCache
from replayssm_dsl.runtime.cuda_module import source_hash

BAD_SOURCE = 'extern "C" __global__ void broken() { this is not C++ }\n'


@pytest.fixture(autouse=True)
def nothing_sent_yet(monkeypatch):
    monkeypatch.setattr(parallel_compile, "_SENT", set())


def small_program(variant: str = "gdn"):
    return lower(variants.get(variant), PRESETS["qwen3.5-4b"].shape, preset_setup("qwen3.5-4b")[2])


@pytest.mark.parametrize("group", ["replay", "verify", "verify_few", "conventional"])
def test_tuning_sources_are_the_modules_the_tuner_loads(group):
    """What a scratch cache at each candidate builds (``CudaReplayCache._new_module``): the group's
    family, and for verify the replay family too (commit)."""
    program = small_program()
    scratch = SimpleNamespace(program=program)  # _new_module reads only the program
    families = ("verify", "replay") if group.startswith("verify") else (group,)
    expected = {CudaReplayCache._new_module(scratch, launch, family).source
                for family in families for launch in distinct_candidates(program, group)}
    sources = tuning_sources(program, group)
    assert set(sources) == expected and len(sources) == len(expected) > 1
    for source in sources:
        kernels = [k for family in families for k in group_kernels(program, family)
                   if re.search(rf'extern "C" __global__ void (__launch_bounds__\([\d, ]+\) )?{k}\(', source)]
        assert kernels and set(kernels) in ({*group_kernels(program, f)} for f in families)


def test_every_source_is_compiled_once_on_several_threads():
    seen, threads, lock = [], set(), threading.Lock()
    together = threading.Barrier(2, timeout=30)  # two threads at once, or the barrier breaks

    def record(source):
        if source in ("// module 0\n", "// module 1\n"):
            together.wait()
        with lock:
            seen.append(source)
            threads.add(threading.current_thread().name)
    sources = [f"// module {i}\n" for i in range(12)]
    assert parallel_compile.warm_kernel_cache(sources + sources[:3], workers=4, compile_one=record) == {}
    assert sorted(seen) == sorted(sources)
    assert len(threads) >= 2 and all(name.startswith("replayssm-compile") for name in threads)
    assert parallel_compile.warm_kernel_cache(sources, workers=4, compile_one=record) == {}  # all sent before
    assert len(seen) == len(sources)


def test_a_failed_compile_is_returned_not_raised():
    def compile_one(source):
        if "bad" in source:
            raise RuntimeError("NVRTC rejected it")
    errors = parallel_compile.warm_kernel_cache(["// good\n", "// bad\n", "// good too\n"], workers=2,
                                                compile_one=compile_one)
    assert errors == {source_hash("// bad\n"): "RuntimeError: NVRTC rejected it"}


@pytest.mark.parametrize("workers,sources", [(0, ["// a\n", "// b\n"]), (1, ["// a\n", "// b\n"]), (4, ["// a\n"]),
                                             (4, ["// a\n", "// a\n"]), (4, [])])
def test_no_pool_for_fewer_than_two_workers_or_sources(workers, sources):
    def compile_one(source):
        raise AssertionError("compiled without a pool")
    assert parallel_compile.warm_kernel_cache(sources, workers=workers, compile_one=compile_one) == {}
    assert parallel_compile._SENT == set()  # left for the loads


def test_the_workers_knob(monkeypatch):
    monkeypatch.setenv("REPLAYSSM_COMPILE_WORKERS", "6")
    assert knobs.compile_workers() == 6
    monkeypatch.delenv("REPLAYSSM_COMPILE_WORKERS")
    assert 1 <= knobs.compile_workers() <= knobs.DEFAULT_COMPILE_WORKERS_MAX
    for bad in ("many", "-2", "1.5"):
        monkeypatch.setenv("REPLAYSSM_COMPILE_WORKERS", bad)
        with pytest.raises(ConfigError, match="REPLAYSSM_COMPILE_WORKERS"):
            knobs.compile_workers()


@pytest.mark.nvrtc
def test_nvrtc_on_threads_gives_the_cubins_of_one_by_one_compiles():
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin

    sources = tuning_sources(small_program("mamba2"), "conventional")[:4]
    cubins, lock = {}, threading.Lock()

    def compile_one(source):
        result = compile_cubin(source)
        with lock:
            cubins[source] = result.cubin
    errors = parallel_compile.warm_kernel_cache(sources + [BAD_SOURCE], workers=3, compile_one=compile_one)
    assert list(errors) == [source_hash(BAD_SOURCE)] and "NVRTC" in errors[source_hash(BAD_SOURCE)]
    assert len(cubins) == len(sources)
    for source in sources:
        assert cubins[source] == compile_cubin(source).cubin


@pytest.mark.gpu
def test_cupy_cache_holds_the_cubins_before_the_loads(monkeypatch, tmp_path):
    """On a kernel cache of this test's own, emptied memos: the pool writes one cubin per source, and
    the loads as ``CompiledProgram`` makes them read those files and write none."""
    import cupy

    from replayssm_dsl.runtime import cuda_module

    compiler = cupy.cuda.compiler
    if not hasattr(compiler, "_kernel_cache_backend"):
        pytest.skip("a CuPy before 14 (its kernel cache has no backend to point at a test's folder)")
    from cupy.cuda._compiler_cache import DiskKernelCacheBackend

    monkeypatch.setattr(compiler, "_kernel_cache_backend", DiskKernelCacheBackend(str(tmp_path)))
    monkeypatch.setattr(cuda_module, "_MODULES", {})
    program = small_program("mamba2")
    kernels = group_kernels(program, "conventional")
    modules = [CudaReplayCache._new_module(SimpleNamespace(program=program), launch, "conventional")
               for launch in distinct_candidates(program, "conventional")[:3]]
    cupy.clear_memo()  # no module of this process's memo stands in for the cache
    assert parallel_compile.warm_kernel_cache([m.source for m in modules], workers=3) == {}

    def files():
        return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in tmp_path.glob("*.cubin")}
    cached = files()
    assert len(cached) == len(modules)
    cupy.clear_memo()  # the loads below read the disk
    for module in modules:
        assert module.local_memory() is not None and all(module.kernel(k) for k in kernels)  # it builds, from the cache
    assert files() == cached  # nothing compiled again (a compile replaces the file)


def test_bench_compiles_each_preset_group_candidate_once():
    from replayssm_dsl.runtime.benchmark import tuner_sources

    presets = ["qwen3.5-4b", "kimi-linear"]
    programs = [lower(*preset_setup(name)[:3]) for name in presets]
    replay = tuner_sources(presets, ("replay", "flush"))
    assert replay == [s for p in programs for s in tuning_sources(p, "replay")]
    every = tuner_sources(presets, ("replay", "verify", "conventional"))
    assert set(every) == {s for p in programs for g in ("replay", "verify", "conventional") for s in tuning_sources(p, g)}
    assert len(every) == len(set(every))
