"""Qwen3-Next (Gated DeltaNet) through the replay cache: greedy generation through the model's own
decode path, through the replay cache one token a step, and with speculative rounds; prints the
agreement (see generate.py).

    python examples/hf/qwen3_next.py [--tokens 128] [--drafts 4] [--device cpu|cuda]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["--family", "qwen3_next"] + sys.argv[1:]))
