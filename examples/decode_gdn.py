"""Decode Gated DeltaNet (Qwen3.5; FLA conventions, grouped value heads)
through the replay kernels, speculative rounds mixed in, and check every output against the
float64 plain recurrence. On the GPU when CuPy sees one, else on the CPU backend.

    python examples/decode_gdn.py [--tokens 300] [--backend auto|cpu|cuda]
"""

import sys

from replayssm_dsl import ModelShape, ReplayConfig
from replayssm_dsl.runtime.selfcheck import run_example
from replayssm_dsl.variants import gated_deltanet

if __name__ == "__main__":
    shape = ModelShape(heads=8, key_heads=4, v_dim=128, k_dim=128)
    sys.exit(run_example(gated_deltanet(), shape, ReplayConfig(window=16, max_drafts=8)))
