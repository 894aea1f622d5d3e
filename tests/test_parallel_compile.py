"""The tuner's candidates compiled at once (runtime/parallel_compile.py): what it compiles, that a
failure is returned and not raised, that nothing is compiled twice, the knob; with NVRTC the cubins
match one-by-one compiles, and on the GPU CuPy's cache holds them before the loads."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from replayssm_dsl import knobs, variants
from replayssm_dsl.config import PRESETS
from replayssm_dsl.errors import ConfigError
from replayssm_dsl.lowering import lower
from replayssm_dsl.runtime import parallel_compile
from replayssm_dsl.runtime.autotune import distinct_candidates, group_kernels, tuning_sources
from replayssm_dsl.runtime.benchmark import preset_setup
from replayssm_dsl.runtime.cuda_module import CompiledProgram, source_hash

BAD_SOURCE = 'extern "C" __global__ void broken() { this is not C++ }\n'


@pytest.fixture(autouse=True)
def nothing_sent_yet(monkeypatch):
    monkeypatch.setattr(parallel_compile, "_SENT", set())


def small_program(variant: str = "gdn"):
    return lower(variants.get(variant), PRESETS["qwen3.5-4b"].shape, preset_setup("qwen3.5-4b")[2])


@pytest.mark.parametrize("group", ["replay", "verify", "conventional"])
def test_tuning_sources_are_the_modules_the_tuner_loads(group):
    program = small_program()
    sources = tuning_sources(program, group)
    candidates = distinct_candidates(program, group)
    assert len(sources) == len(candidates) > 1
    for launch, source in zip(candidates, sources):
        assert source == CompiledProgram(program, launch, group_kernels(program, group)).source
        for name in group_kernels(program, group):
            assert re.search(rf'extern "C" __global__ void (__launch_bounds__\([\d, ]+\) )?{name}\(', source), (launch.label, name)
    assert len({source_hash(s) for s in sources}) == len(sources)  # one module per candidate


def test_verify_few_compiles_nothing_verify_did_not():
    program = small_program()
    assert set(tuning_sources(program, "verify_few")) == set(tuning_sources(program, "verify"))


def test_every_source_is_compiled_once_on_several_threads():
    seen, threads, lock = [], set(), threading.Lock()

    def record(source):
        with lock:
            seen.append(source)
            threads.add(threading.current_thread().name)
    sources = [f"// module {i}\n" for i in range(12)]
    assert parallel_compile.warm_kernel_cache(sources + sources[:3], workers=4, compile_one=record) == {}
    assert sorted(seen) == sorted(sources)
    assert all(name.startswith("replayssm-compile") for name in threads)
    assert parallel_compile.warm_kernel_cache(sources, workers=4, compile_one=record) == {}  # all sent before
    assert len(seen) == len(sources)


def test_a_failed_compile_is_returned_not_raised():
    def compile_one(source):
        if "bad" in source:
            raise RuntimeError("NVRTC rejected it")
    errors = parallel_compile.warm_kernel_cache(["// good\n", "// bad\n", "// good too\n"], workers=2,
                                                compile_one=compile_one)
    assert errors == {source_hash("// bad\n"): "RuntimeError: NVRTC rejected it"}


@pytest.mark.parametrize("workers", [0, 1])
def test_no_pool_compiles_nothing(workers):
    def compile_one(source):
        raise AssertionError("compiled without a pool")
    assert parallel_compile.warm_kernel_cache(["// a\n", "// b\n"], workers=workers, compile_one=compile_one) == {}
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


def cupy_cache_dir(cupy):
    """The folder of CuPy's kernel cache (read once at import since CuPy 14, from ``CUPY_CACHE_DIR``)."""
    backend = getattr(cupy.cuda.compiler, "_kernel_cache_backend", None)
    if backend is not None and hasattr(backend, "_cache_dir"):
        return Path(backend._cache_dir)
    if hasattr(cupy.cuda.compiler, "get_cache_dir"):
        return Path(cupy.cuda.compiler.get_cache_dir())
    pytest.skip("this CuPy does not say where its kernel cache is")


@pytest.mark.gpu
def test_cupy_cache_holds_the_cubins_before_the_loads(tmp_path):
    import cupy

    from replayssm_dsl.runtime.nvrtc_compile import NVRTC_OPTIONS

    cache = cupy_cache_dir(cupy)
    program = small_program("mamba2")
    kernels = group_kernels(program, "conventional")
    # sources of this test alone (no process has compiled them before)
    sources = [source + f"// {tmp_path}\n" for source in tuning_sources(program, "conventional")[:3]]
    before = set(cache.glob("*.cubin"))
    assert parallel_compile.warm_kernel_cache(sources, workers=3) == {}
    cached = set(cache.glob("*.cubin"))
    assert len(cached - before) == len(sources)
    for source in sources:  # as CompiledProgram loads a module: nothing compiled again
        module = cupy.RawModule(code=source, options=NVRTC_OPTIONS, name_expressions=None)
        assert all(module.get_function(name).attributes["local_size_bytes"] == 0 for name in kernels)
    assert set(cache.glob("*.cubin")) == cached


def test_bench_compiles_each_preset_group_candidate_once():
    from replayssm_dsl.runtime.benchmark import tuner_sources

    presets = ["qwen3.5-4b", "kimi-linear"]
    programs = [lower(*preset_setup(name)[:3]) for name in presets]
    replay = tuner_sources(presets, ("replay", "flush"))
    assert replay == [s for p in programs for s in tuning_sources(p, "replay")]
    every = tuner_sources(presets, ("replay", "verify", "conventional"))
    assert set(every) == {s for p in programs for g in ("replay", "verify", "conventional") for s in tuning_sources(p, g)}
    assert len(every) == len(set(every))
