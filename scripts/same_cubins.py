"""Are two checkouts' generated kernels the same machine code? SHA-256 of NVRTC's sm_90 cubins.

A measurement script (no GPU needed): for each preset at the launch shapes of the headline run in
docs/performance.md (replay step, verify, verify of few drafts, conventional step) it renders the
whole program from the tree given, compiles it with NVRTC and prints one line per program:
``same`` where both trees give byte-identical cubins, ``different`` otherwise. A change that leaves
every cubin the same leaves every timing the same, so a headline measured before it stands.

Usage: ``git worktree add /tmp/old REV && python scripts/same_cubins.py /tmp/old [NEW_TREE]``
(NEW_TREE: this checkout by default). Each tree is imported in a child process of its own.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HEADLINE_LAUNCHES = {  # the 155b361 headline's launch shapes (docs/performance.md)
    "nemotron-nano-4b": ["4x20/r96/s10", "8x16", "4x10/r80", "4x16"],
    "nemotron-super-120b": ["4x16/r96/s8", "4x16", "8x8/r64/p4", "4x8"],
    "qwen3.5-4b": ["8x16/r80/s11/w", "8x16", "8x8/r64/p4", "4x8/r80"],
    "qwen3.5-122b": ["8x16/r80/s11/w", "8x16", "8x8/r64/p4", "4x16"],
    "kimi-linear": ["8x16/r80/s11/w", "8x16", "4x8"],
}

# Run in a child process with the tree's three folders mapped to the package names, as pyproject.toml maps them.
CHILD = r'''
import hashlib, importlib.util, json, sys
root, launches = sys.argv[1], json.loads(sys.argv[2])
for name, folder in (("replayssm_dsl", "replayssm_dsl"), ("replayssm_dsl.lowering", "lowering"),
                     ("replayssm_dsl.runtime", "runtime")):
    path = f"{root}/{folder}"
    spec = importlib.util.spec_from_file_location(name, path + "/__init__.py", submodule_search_locations=[path])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
from cuda.bindings import nvrtc
from replayssm_dsl import ReplayConfig, variants
from replayssm_dsl.config import PRESETS
from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.lowering.lower import lower
from replayssm_dsl.lowering.render_cuda import render_program

def cubin_digest(source):
    prog = nvrtc.nvrtcCreateProgram(source.encode(), b"program.cu", 0, [], [])[1]
    opts = [b"--gpu-architecture=sm_90", b"-std=c++17", b"--no-cache"]
    assert int(nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]) == 0, "NVRTC failed"
    cubin = bytes(nvrtc.nvrtcGetCUBINSize(prog)[1])
    nvrtc.nvrtcGetCUBIN(prog, cubin)
    nvrtc.nvrtcDestroyProgram(prog)
    return hashlib.sha256(cubin).hexdigest()

digests = {}
for preset, labels in launches.items():
    p = PRESETS[preset]
    program = lower(variants.get(p.variant), p.shape, ReplayConfig(window=16, max_drafts=8))
    for label in labels:
        digests[f"{preset} {label}"] = cubin_digest(render_program(program, LaunchConfig.from_label(label)))
print(json.dumps(digests))
'''


def digests(tree: Path) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, str(tree), json.dumps(HEADLINE_LAUNCHES)],
                         check=True, capture_output=True, text=True)
    return json.loads(run.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="a checkout (e.g. a git worktree of the headline's commit)")
    parser.add_argument("new", type=Path, nargs="?", default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    old, new = digests(args.old), digests(args.new)
    for key in old:
        print(f"{key:<36} {'same' if old[key] == new.get(key) else 'different'}")
    differ = sum(old[k] != new.get(k) for k in old)
    print(f"{len(old) - differ} of {len(old)} programs give the same cubin")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
