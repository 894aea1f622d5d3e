"""Decode Gated linear attention (per-channel decay, plain write)
through the replay kernels, speculative rounds mixed in, and check every output against the
float64 plain recurrence. On the GPU when CuPy sees one, else on the CPU backend.

    python examples/decode_gla.py [--tokens 300] [--backend auto|cpu|cuda]
"""

import sys

from replayssm_dsl import ModelShape, ReplayConfig
from replayssm_dsl.runtime.selfcheck import run_example
from replayssm_dsl.variants import gated_linear_attention

if __name__ == "__main__":
    shape = ModelShape(heads=4, key_heads=4, v_dim=64, k_dim=64)
    sys.exit(run_example(gated_linear_attention(), shape, ReplayConfig(window=16, max_drafts=8)))
