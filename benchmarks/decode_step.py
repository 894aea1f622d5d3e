"""GPU benchmark of the generated decode kernels (same as ``replayssm bench``).

    python benchmarks/decode_step.py [--quick] [--out DIR] [--batches 1,8,32,128,256,512] [--presets ...]
"""

import sys

from replayssm_dsl.runtime.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench"] + sys.argv[1:]))
