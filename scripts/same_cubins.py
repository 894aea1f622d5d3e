"""Are two checkouts' generated kernels the same machine code? Their sm_90 cubins' kernel sections compared.

A measurement script (no GPU needed): for each preset at the launch shapes of the headline run in
docs/performance.md (replay step, verify, verify of few drafts, conventional step) it renders the
whole program from the tree given, compiles it with this checkout's ``compile_cubin`` and compares,
per kernel, the cubin's sections that make it (the ``.text`` machine code, the sizes of its shared
and constant memory) and ptxas's report (registers, spills): one line per program, ``same`` or
what differs. Unused helpers
in the common header may change other bytes of the cubin, not these. Kernels that are the same
machine code take the same time, so a headline measured before the change stands.

Usage: ``git worktree add /tmp/old REV && python scripts/same_cubins.py /tmp/old [NEW_TREE]``
(NEW_TREE: this checkout by default). Each tree renders its sources in a child process of its own.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

from replayssm_dsl.runtime.nvrtc_compile import compile_cubin

HEADLINE_LAUNCHES = {  # the 155b361 headline's launch shapes (docs/performance.md)
    "nemotron-nano-4b": ["4x20/r96/s10", "8x16", "4x10/r80", "4x16"],
    "nemotron-super-120b": ["4x16/r96/s8", "4x16", "8x8/r64/p4", "4x8"],
    "qwen3.5-4b": ["8x16/r80/s11/w", "8x16", "8x8/r64/p4", "4x8/r80"],
    "qwen3.5-122b": ["8x16/r80/s11/w", "8x16", "8x8/r64/p4", "4x16"],
    "kimi-linear": ["8x16/r80/s11/w", "8x16", "4x8"],
}

# Run in a child process with the tree's three folders mapped to the package names, as pyproject.toml
# maps them: it renders the programs and prints their sources (this checkout compiles them).
CHILD = r'''
import importlib.util, json, sys
root, launches = sys.argv[1], json.loads(sys.argv[2])
for name, folder in (("replayssm_dsl", "replayssm_dsl"), ("replayssm_dsl.lowering", "lowering"),
                     ("replayssm_dsl.runtime", "runtime")):
    path = f"{root}/{folder}"
    spec = importlib.util.spec_from_file_location(name, path + "/__init__.py", submodule_search_locations=[path])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
from replayssm_dsl import ReplayConfig, variants
from replayssm_dsl.config import PRESETS
from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.lowering.lower import lower
from replayssm_dsl.lowering.render_cuda import render_program

sources = {}
for preset, labels in launches.items():
    p = PRESETS[preset]
    program = lower(variants.get(p.variant), p.shape, ReplayConfig(window=16, max_drafts=8))
    for label in labels:
        sources[f"{preset} {label}"] = render_program(program, LaunchConfig.from_label(label))
print(json.dumps(sources))
'''
KERNEL_SECTIONS = (".text.", ".nv.shared.", ".nv.constant0.")


def kernel_sections(cubin: bytes) -> dict:
    """{section name: bytes} of the ELF cubin's per-kernel sections: the machine code, and the sizes
    of its shared and constant memory (.nv.info holds symbol indices, which unused helpers shift, so
    it is left out; ptxas's report gives the registers)."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    out = {}
    for name_off, _, _, _, offset, size, *_ in headers:
        name = cubin[names_at + name_off:cubin.index(b"\0", names_at + name_off)].decode()
        if name.startswith(".text."):
            out[name] = cubin[offset:offset + size]
        elif name.startswith(KERNEL_SECTIONS):
            out[name] = size.to_bytes(8, "little")
    return out


def kernel_digests(source: str) -> dict:
    """{section or ``resources.KERNEL``: digest} of one program compiled for sm_90."""
    result = compile_cubin(source)
    out = {name: hashlib.sha256(data).hexdigest() for name, data in sorted(kernel_sections(result.cubin).items())}
    out.update({f"resources.{kernel}": str(res) for kernel, res in result.resources.items()})
    return out


def digests(tree: Path) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, str(tree), json.dumps(HEADLINE_LAUNCHES)],
                         capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"rendering the kernels of {tree} failed:\n{run.stderr}")
    return {key: kernel_digests(source) for key, source in json.loads(run.stdout).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="a checkout (e.g. a git worktree of the headline's commit)")
    parser.add_argument("new", type=Path, nargs="?", default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    old, new = digests(args.old), digests(args.new)
    differ = 0
    for key, sections in old.items():
        changed = sorted(name for name in sections.keys() | new[key].keys() if sections.get(name) != new[key].get(name))
        differ += bool(changed)
        print(f"{key:<36} {'same' if not changed else 'different: ' + ', '.join(changed)}")
    print(f"{len(old) - differ} of {len(old)} programs give the same kernels")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
