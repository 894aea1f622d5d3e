"""GPU tests: declarations that combine features no built-in combines (``new_variants``) give the
float64 plain recurrence through every kernel, at the launches the CUDA cache picks for them.

At 24 value heads of V = K = 128, the twin's steps (three rows) and verifies (two) are past
``choose_launch``'s small-batch rule, so the cache takes the large-batch shapes: verify's whole head
per CTA (``8x16``), where a vector decay with the delta rule, a skip and a gate passes 48 KiB of
static shared memory, so the cache takes the next of ``fallback_launches`` (``4x16``;
``test_cuda_compiles_new_variants`` compiles it).

Marked ``gpu``: skipped without CuPy and a CUDA device. The twin poisons every output with NaN before
the launch that should write it; FP32 state, tolerance 2e-4 of the largest reference magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpu_cases import FP32_TOL, cuda_cache, steps_verifies_and_flush
from new_variants import NEW_COMBINATIONS, declare_combination
from replayssm_dsl import ModelShape, ReplayConfig
from twin import ReplayTwin

pytestmark = pytest.mark.gpu

VERIFY_ROWS = 2  # steps_verifies_and_flush verifies two slots


@pytest.mark.parametrize("combination", sorted(NEW_COMBINATIONS))
def test_gpu_a_new_combination_gives_the_oracle_at_the_launches_the_cache_picks(combination):
    from replayssm_dsl.lowering.launch import fallback_launches
    shape, config = ModelShape(24, 4, 128, 128), ReplayConfig()
    twin = ReplayTwin(cuda_cache(), declare_combination(*NEW_COMBINATIONS[combination]), shape, config,
                      np.random.default_rng(31), slots=3, tol=FP32_TOL)
    steps_verifies_and_flush(twin)
    verify_launch = twin.cache.module_for("verify", VERIFY_ROWS).launch
    first, halved = fallback_launches(shape, VERIFY_ROWS, "verify", config)[:2]
    assert first.label == "8x16"
    assert verify_launch == (halved if combination == "kda-skip-gate" else first), verify_launch.label
