"""GPU tests: verify on tensor cores at the launch shapes the tuner picks for it at B = 256 (a whole
head per CTA, uncapped or under a register cap with shared fragments), with every draft count up to
T_max = 8 and every other accepted count (0, 2, ...), steps between, against the float64 recurrence. (The other GPU
tests run verify of at most 3 drafts at these shapes, or of 8 at the small shapes' default launch.)"""

from __future__ import annotations

import numpy as np
import pytest

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.lowering.launch import LaunchConfig
from twin import ReplayTwin

pytestmark = pytest.mark.gpu
FP32_TOL = 2e-4
LAUNCHES = {"8x16": 128, "8x16/r80/f6": 128, "5x16/r96/f4": 80}  # launch: V (GDN's and KDA's V, and nano's)


@pytest.mark.parametrize("label", sorted(LAUNCHES))
@pytest.mark.parametrize("name", ["gdn", "mamba2", "kda", "kda_safe_gate"])
def test_gpu_verify_of_up_to_eight_drafts_on_tensor_cores_matches_oracle(name, label):
    from replayssm_dsl.runtime.cuda_cache import CudaReplayCache
    twin = ReplayTwin(CudaReplayCache, variants.get(name), ModelShape(4, 2, LAUNCHES[label], 128), ReplayConfig(window=16, max_drafts=8),
                      np.random.default_rng(41), slots=2, tol=FP32_TOL, launch=LaunchConfig.from_label(label))
    twin.load([0, 1])
    for t in range(1, 9):
        for a in range(0, t + 1, 2):
            toks = twin.verify([1, 0], [t, max(1, t - 2)])
            twin.commit([1, 0], toks, [a, min(a, max(1, t - 2))])
            if (t + a) % 3 == 0:
                twin.step([0, 1])
    twin.check_materialize([0, 1])
