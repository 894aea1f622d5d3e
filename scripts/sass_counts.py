"""Static instruction counts of the generated kernels (no GPU needed): NVRTC cubin, then ``nvdisasm``.

For one preset at one launch shape it compiles the whole program for sm_90, disassembles it and
prints, per kernel, the number of SASS instructions, the most common opcode families, the
instructions between consecutive ``BAR.SYNC`` (the kernel's phases, in code order; a loop's body
counts once) and ptxas's registers and spills. Counting before and after a change says whether it takes work off a tile before any
device time is spent on timing it.

``nvdisasm`` is not in the NVRTC wheel: ``pip download --no-deps nvidia-cuda-nvdisasm==13.2.51`` (a
newer one reads sm_90 cubins too), unzip it and pass ``--nvdisasm PATH`` or put it on ``PATH``.

Usage: ``python scripts/sass_counts.py qwen3.5-4b 8x8/r64 [--kernels replay_step verify] [--variant
"fold on tensor cores"]`` (``--variant``: one of ``experiment_variants.py``'s source edits first).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from replayssm_dsl.config import RAW_RECORD_FIELDS, parse_raw_record_fields

_FUNCTION = re.compile(r"^\.text\.(\w+):")
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?")


def parse(disassembly: str) -> dict[str, list[str]]:
    """Kernel name -> its opcodes in code order (with their modifiers, e.g. ``BAR.SYNC.DEFER_BLOCKING``)."""
    kernels, current = {}, None
    for line in disassembly.splitlines():
        match = _FUNCTION.match(line)
        if match:
            current = kernels.setdefault(match.group(1), [])
            continue
        match = _INSTRUCTION.match(line)
        if match and current is not None:
            current.append(match.group(1) + (match.group(2) or ""))
    return kernels


def phases(opcodes: list[str]) -> list[int]:
    """Instructions before the first ``BAR.SYNC``, between consecutive ones, and after the last."""
    counts, run = [], 0
    for op in opcodes:
        if op.startswith("BAR.SYNC"):
            counts.append(run)
            run = 0
        else:
            run += 1
    return counts + [run]


def report(kernels: dict[str, list[str]], names=None, top: int = 10, resources=None) -> str:
    """Per kernel: instructions, between barriers, and (given ptxas's ``resources``) registers and spills."""
    lines = []
    for name, opcodes in kernels.items():
        if names and name not in names:
            continue
        families = Counter(op.split(".")[0] for op in opcodes)
        res = (resources or {}).get(name)
        usage = (f"; {res.registers} registers, spill stores {res.spill_stores} B, stack {res.stack_frame} B"
                 if res else "")
        lines.append(f"{name}: {len(opcodes)} instructions; between barriers {phases(opcodes)}{usage}")
        lines.append("  " + ", ".join(f"{op} {n}" for op, n in families.most_common(top)))
    return "\n".join(lines)


def program_source(preset_name: str, label: str, token_dtype: str = "float32", record_dtype: str = "float32",
                   raw_record_fields: tuple = RAW_RECORD_FIELDS, variant: str | None = None) -> str:
    """The whole program's CUDA source at that launch shape (the benchmark's settings for the preset);
    with ``variant``, one of ``experiment_variants.py``'s labels, its edits applied."""
    from replayssm_dsl.lowering.launch import LaunchConfig
    from replayssm_dsl.lowering.lower import lower
    from replayssm_dsl.lowering.render_cuda import render_program
    from replayssm_dsl.runtime.benchmark import preset_setup

    decl, shape, config, _, _ = preset_setup(preset_name, token_dtype, record_dtype, raw_record_fields)
    program = lower(decl, shape, config)
    render = render_program
    if variant is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import experiment_variants
        render = experiment_variants.patched_renderer(experiment_variants.VARIANTS[variant])
    return render(program, LaunchConfig.from_label(label))


def disassemble(preset_name: str, label: str, nvdisasm: str, token_dtype: str = "float32",
                record_dtype: str = "float32", raw_record_fields: tuple = RAW_RECORD_FIELDS,
                variant: str | None = None) -> tuple[str, dict]:
    """nvdisasm's text of ``program_source`` compiled for sm_90, and ptxas's resources per kernel."""
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin

    source = program_source(preset_name, label, token_dtype, record_dtype, raw_record_fields, variant)
    result = compile_cubin(source, f"{preset_name}.cu")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(result.cubin)
        cubin.flush()
        text = subprocess.run([nvdisasm, "-c", cubin.name], check=True, capture_output=True, text=True).stdout
    return text, result.resources


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset")
    parser.add_argument("launch", help="a launch label: warps x rows per warp, then /rN (register cap), "
                        "/e (eager records), /pN (verify's rows per pass): 8x8/r64/p4")
    parser.add_argument("--kernels", nargs="*", help="only these kernels (default: all)")
    parser.add_argument("--nvdisasm", default=shutil.which("nvdisasm"), help="path of nvdisasm")
    parser.add_argument("--token-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--record-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--raw-record-fields", type=parse_raw_record_fields, default=RAW_RECORD_FIELDS,
                        help="with --record-dtype bfloat16: comma-separated, out of key and decay")
    parser.add_argument("--variant", help="one of experiment_variants.py's labels: its edits applied first")
    args = parser.parse_args()
    from replayssm_dsl.lowering.launch import LaunchConfig
    try:
        LaunchConfig.from_label(args.launch)
    except ValueError as exc:
        parser.error(str(exc))
    if not args.nvdisasm:
        parser.error("--nvdisasm: not on PATH; see this script's docstring for where to get it")
    text, resources = disassemble(args.preset, args.launch, args.nvdisasm, args.token_dtype, args.record_dtype,
                                  args.raw_record_fields, args.variant)
    print(report(parse(text), args.kernels, resources=resources))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
