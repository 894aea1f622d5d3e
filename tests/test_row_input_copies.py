"""Verify on tensor cores copies its per-row token inputs to shared memory before the state rows
(lowering/render_row_inputs.py): where the copies go, what is computed from them and when, and where
the generator keeps the old loads (no GPU; the GPU tests run the kernels against the oracle)."""

from __future__ import annotations

from types import MethodType, SimpleNamespace

import numpy as np
import pytest

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.config import PRESETS
from replayssm_dsl.lowering.launch import LaunchConfig, choose_launch
from replayssm_dsl.lowering.lower import lower
from replayssm_dsl.lowering.render_cuda import render_program
from replayssm_dsl.lowering.render_row_inputs import row_inputs, staged_row_inputs

STAGE = "stage_token_rows("
OLD_LOOP = "for (int x = THREADS - 1 - tid; x < t * BV; x += THREADS) {"
FIRST_ROW_LOAD = "reinterpret_cast<const float4*>(checkpoint"


def kernel_body(text: str, kernel: str) -> str:
    start = text.index(f") {kernel}(")
    end = text.find('extern "C"', start)
    return text[start:] if end < 0 else text[start:end]


def verify_source(decl, shape, launch=None):
    config = ReplayConfig()
    launch = launch or choose_launch(shape, 256, "verify", config)
    return render_program(lower(decl, shape, config), launch)


@pytest.mark.parametrize("name", sorted(variants.BUILTINS))
def test_verify_copies_each_row_input_before_the_state_rows_and_loads_none_after(name):
    decl = variants.get(name)
    shape = PRESETS["qwen3.5-4b"].shape
    body = kernel_body(verify_source(decl, shape), "verify")
    inputs = [spec.name for spec in row_inputs(decl)]
    assert inputs, "every built-in's rows read a value"
    for input_name in inputs:
        copy = body.index(f"tok_{input_name} + ((size_t)b * t_tok")
        assert body.rfind(STAGE, 0, copy) > body.index("if (t < 1 || t > TMAX") and copy < body.index(FIRST_ROW_LOAD)
        assert f"prefetch_l1(tok_{input_name} +" not in body, "a copied input is not also prefetched"
        assert f"tok_{input_name}[" not in body, "nothing loads a copied input after the rows"
    assert OLD_LOOP not in body
    # every way out between the copies and the first barrier waits for them first
    span = body[body.index(STAGE):body.index("cp_async_wait();\n    __syncthreads();")]
    exits = [i for i in range(len(span)) if span.startswith("return;", i)]
    assert exits, "the fill check's exit"
    for i in exits:
        assert span[max(0, i - 20):i].rstrip().endswith("cp_async_wait();"), span[max(0, i - 80):i + 7]


def test_the_value_and_gate_land_in_their_row_fields_and_mamba2s_skip_and_silu_follow_the_first_barrier():
    shape = PRESETS["nemotron-nano-4b"].shape
    gdn = kernel_body(verify_source(variants.get("gdn"), shape), "verify")
    assert "stage_token_rows(sh_value, tok_v +" in gdn and "sh_in_" not in gdn
    assert "__shared__ __align__(16) float sh_value[TMAX * BV];" in gdn
    mamba2 = kernel_body(verify_source(variants.get("mamba2"), shape), "verify")
    assert "stage_token_rows(sh_value, tok_x +" in mamba2 and "stage_token_rows(sh_gate, tok_z +" in mamba2
    assert "sh_in_" not in mamba2, "float32 inputs land in their row fields: no shared arrays of their own"
    computed = mamba2.index("// the row fields from the copied inputs")
    first_barrier = mamba2.index("cp_async_wait();\n    __syncthreads();")
    assert first_barrier < computed < mamba2.index("__syncthreads();", computed), "computed before the rows' barriers"
    loop = mamba2[computed:mamba2.index("__syncthreads();", computed)]
    assert "sh_skip[x] =" in loop and "sh_value[x]" in loop
    gate_read, gate_write = loop.index("= sh_gate[x];"), loop.index("sh_gate[x] = silu_f(")
    assert gate_read < gate_write, "silu(gate) replaces the gate's copy in place: read, then written"
    assert "sh_value[x] =" not in loop, "the copy is the value"


def test_bf16_row_inputs_are_copied_as_bits_and_widened_after_the_first_barrier():
    decl = variants.get("gdn").with_token_dtype("bfloat16", ["v"])
    body = kernel_body(verify_source(decl, PRESETS["qwen3.5-4b"].shape), "verify")
    assert "__shared__ __align__(16) unsigned short sh_in_v[TMAX * BV];" in body
    copy, first_barrier = body.index("stage_token_rows(sh_in_v, tok_v +"), body.index("cp_async_wait();\n    __syncthreads();")
    widen = body.index("bf16_bits_to_f32(sh_in_v[x])")
    assert copy < body.index(FIRST_ROW_LOAD) and first_barrier < widen < body.index("sh_value[x] =", widen)
    assert widen < body.index("__syncthreads();", widen), "widened before the rows' barriers"


@pytest.mark.parametrize("shape,launch,why", [
    (ModelShape(2, 1, 30, 32), None, "V = 30: a 16-byte chunk of floats would straddle V"),
    (PRESETS["qwen3.5-4b"].shape, LaunchConfig(4, 8, max_registers=80), "verify's SIMT rows under a register cap"),
], ids=["V-not-a-multiple-of-4", "simt-verify"])
def test_verify_keeps_loading_its_row_inputs_where_it_does_not_copy_them(shape, launch, why):
    body = kernel_body(verify_source(variants.get("gdn"), shape, launch), "verify")
    assert STAGE not in body and OLD_LOOP in body, why


def test_a_bf16_input_needs_rows_in_multiples_of_8_to_be_copied():
    decl = variants.get("gdn").with_token_dtype("bfloat16", ["v"])
    assert staged_row_inputs(decl, 128, 128) == {"v": "sh_in_v"}
    assert staged_row_inputs(decl, 132, 132) == {}  # 132 floats tile by 4, not bf16 by 8
    assert staged_row_inputs(variants.get("gdn"), 132, 132) == {"v": "sh_value"}


@pytest.mark.parametrize("kernel", ["replay_step", "conventional_step", "snapshot_verify", "flush_for_verify"])
def test_only_verify_copies_row_inputs(kernel):
    text = verify_source(variants.get("mamba2"), PRESETS["nemotron-nano-4b"].shape)
    assert STAGE not in kernel_body(text, kernel)


def test_a_row_input_off_a_16_byte_boundary_is_refused_naming_it():
    """The copies move 16-byte chunks: the CUDA backend refuses a per-row token input at an address
    off a 16-byte boundary (``_device_token``) rather than let the copy fault; on the GPU
    ``test_gpu_a_row_input_view_at_an_offset_is_refused_before_any_launch`` runs the same."""
    from replayssm_dsl.errors import InputError
    from replayssm_dsl.runtime.validation import check_aligned
    why = "verify copies its rows in 16-byte chunks"
    check_aligned(0x7F0000001000, "tokens['v']", why)
    check_aligned(0x7F0000001010, "tokens['v']", why)
    with pytest.raises(InputError, match=r"tokens\['v'\]: must start at a 16-byte aligned address \(verify copies.*4 bytes past"):
        check_aligned(0x7F0000001004, "tokens['v']", why)


class _DeviceArray:
    """A stand-in for a CuPy array: what ``CudaReplayCache._device`` reads of one (no GPU here)."""

    def __init__(self, ptr: int):
        self.dtype, self.flags, self.data = np.dtype(np.float32), SimpleNamespace(c_contiguous=True), SimpleNamespace(ptr=ptr)
        self.__cuda_array_interface__ = {}


@pytest.mark.parametrize("name,size", [("v", "V"), ("q", "K"), ("a", "")])
def test_the_cuda_backend_checks_the_alignment_of_row_inputs_alone(name, size):
    """``_device_token`` on a stand-in CuPy: a per-row input 4 bytes off a 16-byte boundary is refused
    naming it; at a boundary it passes; K-sized and scalar inputs are not held to it."""
    from replayssm_dsl.errors import InputError
    from replayssm_dsl.runtime.cuda_cache import CudaReplayCache
    cache = SimpleNamespace(decl=variants.get("gdn"), cp=SimpleNamespace(ndarray=_DeviceArray, asarray=lambda a, dtype=None: a))
    for method in ("_device", "_token_as_read"):
        setattr(cache, method, MethodType(getattr(CudaReplayCache, method), cache))
    assert cache.decl.input(name).size == size
    aligned, off = _DeviceArray(0x7F0000002000), _DeviceArray(0x7F0000002004)
    assert CudaReplayCache._device_token(cache, name, aligned) is aligned
    if size != "V":
        assert CudaReplayCache._device_token(cache, name, off) is off
        return
    with pytest.raises(InputError, match=rf"tokens\['{name}'\]: must start at a 16-byte aligned address"):
        CudaReplayCache._device_token(cache, name, off)
