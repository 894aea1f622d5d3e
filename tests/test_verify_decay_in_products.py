"""Lowering without a GPU: which verify kernels apply their drafts' scalar decays to the state products'
results (``decay_in_products``) instead of to the queries, and that those have no cumulate phase and
no barrier after it. (Their outputs against the float64 recurrence: tests/test_gpu_verify_tensor_cores.py
and the verify tests of tests/test_gpu_kernels.py, on the GPU.)"""

from __future__ import annotations

import re

import pytest

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.lowering.render_cuda import render_program
from replayssm_dsl.lowering.render_verify_mma import decay_in_products

SHAPE = ModelShape(4, 2, 80, 128)  # [slots, HV = 4, V = 80, K = 128], two key heads
TENSOR_CORES = "5x16/r96/f4"  # verify on tensor cores, as tuned for nano


def _verify_source(name: str, label: str) -> str:
    program = lower(variants.get(name), SHAPE, ReplayConfig(max_drafts=8))
    text = render_program(program, LaunchConfig.from_label(label))
    start = text.index(" verify(")  # the kernel (not snapshot_verify, flush_for_verify)
    return text[start:text.index("\n}\n", start)]


@pytest.mark.parametrize("name,label,expected", [
    ("mamba2", TENSOR_CORES, True),  # a scalar decay, no delta rule, scores on tensor cores
    ("mamba2", "8x16", True),
    ("mamba2", TENSOR_CORES + "/c", False),  # scores on CUDA cores read the cumulate's G
    ("gdn", TENSOR_CORES, False),  # the delta rule's key fragments: measured slower (docs/performance.md)
    ("kda", TENSOR_CORES, False),  # a decay vector
    ("mamba2", "4x4", True),  # (any launch of verify on tensor cores)
])
def test_decay_in_products_takes_scalar_decays_without_a_delta_rule_on_tensor_core_scores(name, label, expected):
    program = lower(variants.get(name), SHAPE, ReplayConfig(max_drafts=8))
    assert decay_in_products(program, LaunchConfig.from_label(label)) is expected


def test_mamba2_verify_on_tensor_cores_has_no_cumulate_and_scales_its_columns():
    verify = _verify_source("mamba2", TENSOR_CORES)
    assert "const float dec = expf(acc);" not in verify  # no cumulate
    assert "sh_qd[fragment_slot(j, e)] = f" in verify  # the fields write the raw queries' fragments
    assert "sh_qd[fragment_slot(t + x / K, x % K)] = 0.f;" in verify  # and zeros past the drafts
    assert verify.count("expf(G_at(n + j0))") == 1 and "cq[mt][i] *= (i & 1) ? d1 : d0;" in verify
    assert "= G_at(n + j);" in verify  # the records' appended decays
    assert "sh_G[n + j]" not in verify  # no reader of a cumulate's sums
    # the scaling sits between the state products' sums and the buffer's records' products
    sums = verify.index("cq[mt][i] += cqs[mt][i];")
    assert sums < verify.index("cq[mt][i] *= (i & 1)") < verify.index("the buffer's records, 8 per product")


def test_decay_in_products_drops_one_barrier():
    with_cumulate = _verify_source("mamba2", TENSOR_CORES + "/c")
    without = _verify_source("mamba2", TENSOR_CORES)
    barriers = re.compile(r"__syncthreads\(\);")
    assert len(barriers.findall(without)) == len(barriers.findall(with_cumulate)) - 1


def test_delta_rule_verify_keeps_its_cumulate():
    verify = _verify_source("gdn", TENSOR_CORES)
    assert "const float dec = expf(acc);" in verify and "G_at(" not in verify
