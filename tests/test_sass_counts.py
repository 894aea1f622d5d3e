"""Tests of scripts/sass_counts.py (no GPU, no nvdisasm): reading nvdisasm's text into per-kernel
opcodes, and the counts between barriers."""

from __future__ import annotations

import numpy as np

from scripts_loader import load_script


def listing(kernels: dict[str, list[str]]) -> str:
    """A disassembly in nvdisasm's layout: section headers, labels, predicated and plain instructions."""
    lines, address = ["\t.headerflags\t@\"EF_CUDA_SM90\""], 0
    for name, opcodes in kernels.items():
        lines += [f"//--------------------- .text.{name}         --------------------------",
                  f"\t.section\t.text.{name},\"ax\",@progbits", f".text.{name}:"]
        for i, op in enumerate(opcodes):
            predicate = "@!P0 " if i % 3 == 1 else ("@P1 " if i % 3 == 2 else "")
            lines.append(f"        /*{address:04x}*/               {predicate}{op} R1, R2, R3 ;")
            address += 16
            if i == 1:
                lines.append(".L_x_12:")
    return "\n".join(lines)


def test_opcodes_are_read_per_kernel_in_code_order():
    sass = load_script("sass_counts")
    rng = np.random.default_rng()
    pool = ["FFMA", "LDG.E.128", "IMAD.WIDE", "SHFL.BFLY", "BAR.SYNC.DEFER_BLOCKING", "LEA.HI.X", "EXIT"]
    kernels = {name: [pool[i] for i in rng.integers(0, len(pool), int(rng.integers(3, 40)))]
               for name in ("replay_step", "verify", "flush")}
    assert sass.parse(listing(kernels)) == kernels


def test_phases_split_at_each_barrier():
    sass = load_script("sass_counts")
    rng = np.random.default_rng()
    runs = [int(x) for x in rng.integers(0, 9, int(rng.integers(1, 6)))]
    opcodes = []
    for i, run in enumerate(runs):
        opcodes += ["FFMA"] * run + (["BAR.SYNC.DEFER_BLOCKING"] if i < len(runs) - 1 else [])
    assert sass.phases(opcodes) == runs
    report = sass.report({"replay_step": opcodes, "flush": ["EXIT"]}, names=["replay_step"])
    assert report.startswith(f"replay_step: {len(opcodes)} instructions; between barriers {runs}")
    assert "flush" not in report


def test_a_variant_is_counted_with_its_edits_and_only_then():
    """``--variant``: the source that is compiled and counted carries that variant's edits (the fold
    on tensor cores' ``mma_3xtf32`` in the replay step), and without it the generator's own."""
    sass = load_script("sass_counts")
    edited = sass.program_source("kimi-linear", "8x16/r80/s12/w/v", variant="fold on tensor cores")
    plain = sass.program_source("kimi-linear", "8x16/r80/s12/w/v")
    step = edited[edited.index(") replay_step("):edited.index("extern \"C\" __global__", edited.index(") replay_step("))]
    assert "mma_3xtf32(c[2 * mm]" in step
    assert "mma_3xtf32(c[2 * mm]" not in plain and edited != plain
