"""Mamba-2 through the replay cache: greedy generation through the model's own
decode path, through the replay cache one token a step, and with speculative rounds; prints the
agreement (see generate.py).

    python examples/hf/mamba2.py [--tokens 128] [--drafts 4] [--device cpu|cuda]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["--family", "mamba2"] + sys.argv[1:]))
