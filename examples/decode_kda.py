"""Decode Kimi Delta Attention (per-channel decay, delta rule)
through the replay kernels, speculative rounds mixed in, and check every output against the
float64 plain recurrence. On the GPU when CuPy sees one, else on the CPU backend.

    python examples/decode_kda.py [--tokens 300] [--backend auto|cpu|cuda]
"""

import sys

from replayssm_dsl import ModelShape, ReplayConfig
from replayssm_dsl.runtime.selfcheck import run_example
from replayssm_dsl.variants import kimi_delta_attention

if __name__ == "__main__":
    shape = ModelShape(heads=8, key_heads=8, v_dim=128, k_dim=128)
    sys.exit(run_example(kimi_delta_attention(), shape, ReplayConfig(window=16, max_drafts=8)))
