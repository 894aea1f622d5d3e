"""The standalone export (``replayssm emit --standalone``): files, manifest, a shared library built
with nvcc where nvcc is installed, and, on a GPU, the library's outputs equal the Python runtime's."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess

import numpy as np
import pytest

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.config import PRESETS
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.launch import LaunchConfig, kernel_arguments
from replayssm_dsl.lowering.standalone import write_standalone


@pytest.mark.parametrize("fields,raw", [(("key", "decay"), ["decay", "key"]), (("key",), ["key"])])
def test_the_manifest_says_which_record_fields_are_bf16_token_bits(tmp_path, fields, raw):
    decl = variants.get("kda").with_token_dtype("bfloat16")
    config = ReplayConfig(record_dtype="bfloat16", raw_record_fields=fields)
    _, _, meta = write_standalone(lower(decl, PRESETS["kimi-linear"].shape, config), tmp_path)
    manifest = json.loads(meta.read_text())
    assert (manifest["record_dtype"], manifest["raw_record_fields"]) == ("bfloat16", raw)
    dtypes = {a["name"]: a.get("dtype") for a in manifest["argument_order"]}
    assert dtypes["rec_key"] == "bf16 (raw bits)"
    assert dtypes["rec_decay"] == ("bf16 (raw bits)" if "decay" in raw else "float")


def test_the_manifest_states_the_sizes_the_kernels_were_built_for(tmp_path):
    shape, config = ModelShape(8, 2, 32, 16), ReplayConfig(window=12, max_drafts=4)
    _, _, meta = write_standalone(lower(variants.get("gdn"), shape, config), tmp_path)
    assert json.loads(meta.read_text())["sizes"] == {"HV": 8, "H": 2, "V": 32, "K": 16, "L": 12, "T": 4,
                                                       "cap": config.capacity}


def test_export_writes_source_header_and_manifest(tmp_path):
    program = lower(variants.get("kda"), PRESETS["kimi-linear"].shape, ReplayConfig())
    source, header, meta = write_standalone(program, tmp_path)
    manifest = json.loads(meta.read_text())
    assert manifest["declaration_hash"] == program.declaration.fingerprint
    assert (manifest["record_dtype"], manifest["raw_record_fields"]) == ("float32", [])
    assert [k["name"] for k in manifest["kernels"]] == [k.name for k in program.kernels]
    order = [a["name"] for a in manifest["argument_order"]]
    assert order == [name for _, name in kernel_arguments(program)]
    text = header.read_text()
    for kernel in program.kernels:
        assert f"replayssm_kda_{kernel.name}(" in text and f"replayssm_kda_{kernel.name}(" in source.read_text()
    assert "tok_g_raw;  /* float [B, t_tok, HV, K]" in text
    assert "int num_slots;" in text and "int num_pages;" in text  # bounds the kernels check rows against


def _build(tmp_path, program, launch=None):
    source, header, _ = write_standalone(program, tmp_path, launch)
    lib = tmp_path / "libreplayssm.so"
    subprocess.run(["nvcc", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", str(source), "-o", str(lib)],
                   check=True, capture_output=True, text=True)
    return lib


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_export_builds_a_shared_library_with_nvcc(tmp_path):
    program = lower(variants.get("mamba2"), ModelShape(6, 2, 80, 96), ReplayConfig())
    lib = _build(tmp_path, program)
    symbols = subprocess.run(["nm", "-D", str(lib)], capture_output=True, text=True).stdout
    for kernel in program.kernels:
        assert f"replayssm_mamba2_{kernel.name}" in symbols


def test_launchers_allow_the_kernels_dynamic_shared_memory(tmp_path):
    """A launch with shared rows gives the replay step dynamic shared memory (WARPS · SRPW · K state
    elements), and verify always keeps its write records there (NREC · W_PITCH floats): each launcher
    allows that much before the launch and passes it, and the manifest says so; every other kernel,
    and the replay step of a launch without shared rows, launches with none."""
    from replayssm_dsl.lowering.launch import write_record_layout
    program = lower(variants.get("gdn"), PRESETS["qwen3.5-4b"].shape, ReplayConfig())
    for launch, step_bytes in ((LaunchConfig(4, 16, max_registers=96, shared_rows=8), 4 * 8 * 128 * 4), (LaunchConfig(8, 8), 0)):
        source, _, meta = write_standalone(program, tmp_path / launch.label.replace("/", "-"), launch)
        manifest = json.loads(meta.read_text())
        verify_bytes = (ReplayConfig().capacity + 1) * write_record_layout(launch.rows_per_warp, launch.rows_per_cta, 128)[1] * 4
        shared = {k["name"]: k["dynamic_shared_bytes"] for k in manifest["kernels"]}
        want = {"replay_step": step_bytes, "verify": verify_bytes}
        assert shared == {k.name: want.get(k.name, 0) for k in program.kernels}
        assert manifest["launch"]["label"] == launch.label
        text = source.read_text()
        for name, size in want.items():
            allowed = f"cudaFuncSetAttribute({name}, cudaFuncAttributeMaxDynamicSharedMemorySize, {size});"
            assert (allowed in text) == bool(size), name
        assert text.count("cudaFuncSetAttribute(") == sum(1 for size in want.values() if size)
        assert f"replay_step<<<dim3({-(-128 // launch.rows_per_cta)}, 32, rows), dim3({launch.threads}), {step_bytes}, stream>>>" in text
        assert f"verify<<<dim3({-(-128 // launch.rows_per_cta)}, 32, rows), dim3({launch.threads}), {verify_bytes}, stream>>>" in text


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("label", ["4x4", "8x16/r80/s8", "4x16/r96/s8/w"])
def test_library_through_ctypes_matches_the_python_runtime(tmp_path, label):
    """The replay step through the library equals the Python runtime's (at a launch with shared rows
    too: dynamic shared memory, allowed by the launcher)."""
    import cupy as cp

    from replayssm_dsl.random_inputs import random_params, random_state, random_tokens
    from replayssm_dsl.runtime.cuda_cache import CudaReplayCache

    decl, shape, config = variants.get("gdn"), ModelShape(4, 2, 64, 64), ReplayConfig(window=4, max_drafts=2)
    rng = np.random.default_rng(0)
    params = random_params(decl, shape, rng)
    python = CudaReplayCache(decl, shape, config, slots=3, params=params, launch=LaunchConfig())
    mirror = CudaReplayCache(decl, shape, config, slots=3, params=params, launch=LaunchConfig.from_label(label))
    S0 = random_state(shape, rng, (3,)).astype(np.float32)
    python.load([0, 1, 2], S0)
    mirror.load([0, 1, 2], S0)
    library = ctypes.CDLL(str(_build(tmp_path, mirror.program, mirror.fixed_launch)))
    fields = [(ctype, name) for ctype, name in kernel_arguments(mirror.program) if name not in ("rows", "t_tok")]
    args = [name for _, name in fields]

    class Buffers(ctypes.Structure):
        _fields_ = [(name, ctypes.c_int if ctype == "int" else ctypes.c_void_p) for ctype, name in fields]

    slots = np.array([2, -1, 0], np.int32)
    batch = {k: cp.asarray(v) for k, v in mirror._batch(slots).items()}
    for step in range(9):
        toks = {k: v.astype(np.float32) for k, v in random_tokens(decl, shape, rng, (3,)).items()}
        want = python.step(slots, toks)
        out = cp.full((3, 1, shape.heads, shape.v_dim), np.nan, cp.float32)
        dev = {k: cp.asarray(v[:, None]) for k, v in toks.items()}
        pointers = {**{k: v.data.ptr for k, v in mirror.buffers.items()}, **{f"tok_{k}": v.data.ptr for k, v in dev.items()},
                    **{f"par_{k}": mirror.buffers[k].data.ptr for k in params}, "slots": batch["slot"].data.ptr,
                    "src_page": batch["src_page"].data.ptr, "dst_page": batch["dst_page"].data.ptr,
                    "drafts": batch["drafts"].data.ptr, "accepted": batch["accepted"].data.ptr, "out": out.data.ptr,
                    "num_slots": mirror.num_slots, "num_pages": mirror.num_pages}
        dummy = mirror._dummy["float"].data.ptr
        buffers = Buffers(**{name: pointers.get(name, dummy) for name in args})
        for kernel in ("replay_step",):
            assert getattr(library, f"replayssm_gdn_{kernel}")(ctypes.byref(buffers), 3, 1, None) == 0
        cp.cuda.runtime.deviceSynchronize()
        live = slots >= 0
        np.testing.assert_allclose(out[live, 0].get(), want[live].get(), rtol=1e-5, atol=1e-6)
    assert np.array_equal(python.fills(), mirror.fills())
