"""Runtime layer: the ``replayssm`` command line.

    replayssm variants                       the built-in declarations (NAME: one of them, or your own
                                             as module:attribute or path/to/file.py:attribute)
    replayssm show NAME [--preset P]         a declaration and its lowered kernel plans
    replayssm traffic --preset P             bytes per decode step: conventional vs replay
    replayssm check NAME [--backend B]       run NAME end to end, largest error against the oracle
    replayssm emit NAME --preset P -o DIR    every kernel's CUDA source, each compilable alone (or --shape)
                     [--standalone]          or one .cu with extern "C" launchers, a header, manifest.json
    replayssm bench [--quick]                GPU benchmark (needs a GPU): table, JSON, Markdown, PNG
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.config import DESIGN_PRESETS, PRESETS, RAW_RECORD_FIELDS, parse_raw_record_fields, preset
from replayssm_dsl.errors import ReplaySSMError
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.record_inputs import raw_record_inputs
from replayssm_dsl.lowering.traffic import (design_formulas, kernel_traffic, record_bytes, replay_step_amortized,
                                            verify_mixed)

from .benchmark import KERNELS as BENCH_KERNELS  # (no CuPy at import: the benchmark imports it when it runs)


VARIANT_HELP = "a built-in (replayssm variants) or your own: module:attribute or path/to/file.py:attribute"


def shape_argument(text: str) -> ModelShape:
    """``--shape HV,H,V,K``: four whole numbers, which ``ModelShape`` checks (argparse reports what
    either refuses as a usage error naming the option)."""
    try:
        dims = [int(part) for part in text.split(",")]
    except ValueError:
        dims = []
    if len(dims) != 4:
        raise argparse.ArgumentTypeError(f"expected HV,H,V,K: four whole numbers, got {text!r}")
    try:
        return ModelShape(*dims)
    except ReplaySSMError as exc:  # a dimension not positive, HV not a multiple of H
        raise argparse.ArgumentTypeError(str(exc)) from None


def _shape(args) -> ModelShape:
    if getattr(args, "preset", None):
        return preset(args.preset).shape
    if getattr(args, "shape", None):
        return args.shape
    return ModelShape(4, 2, 64, 64)


def _config(args) -> ReplayConfig:
    return ReplayConfig(window=args.window, max_drafts=args.max_drafts, state_dtype=args.state_dtype,
                        record_dtype=args.record_dtype, raw_record_fields=args.raw_record_fields)


def _declaration(name: str, args):
    """The variant ``name``, its token inputs arriving as ``--token-dtype`` (a note on stderr where
    ``--record-dtype bfloat16`` would keep no record field raw, so that it changes nothing)."""
    decl = variants.get(name)
    decl = decl if args.token_dtype == "float32" else decl.with_token_dtype(args.token_dtype)
    if args.record_dtype == "bfloat16" and not raw_record_inputs(decl, _config(args)):
        why = " (no token input is bf16: add --token-dtype bfloat16)" if args.token_dtype == "float32" else ""
        print(f"replayssm: note: --record-dtype bfloat16 changes nothing for {decl.name}: no record field it keeps raw "
              f"({', '.join(args.raw_record_fields)}) is computed from one bf16 token input alone{why}, so its "
              "records stay float32", file=sys.stderr)
    return decl


def cmd_variants(args) -> int:
    for name in variants.BUILTINS:
        d = variants.get(name)
        write = "delta rule" if d.is_delta else "plain write"
        print(f"{name:<10} {d.decay_form:>6} decay, {write:<11} {d.doc}")
    return 0


def cmd_show(args) -> int:
    decl = _declaration(args.name, args)
    print(decl.describe())
    print()
    print(lower(decl, _shape(args), _config(args)).pretty())
    return 0


def cmd_traffic(args) -> int:
    p = preset(args.preset)
    program = lower(_declaration(args.variant or p.variant, args), p.shape, _config(args))
    E, R, B = p.shape.state_elements, record_bytes(program), args.batch
    per_step = B * p.shape.heads / 1e6
    formulas = design_formulas(program)
    print(f"{p.name}: {p.note}; HV={p.shape.heads} H={p.shape.key_heads} V={p.shape.v_dim} K={p.shape.k_dim}, "
          f"E={E} elements, record R={R:g} B per value head, L={program.config.window}, B={B}")
    print(f"{'kernel (fill)':<36}{'state R':>10}{'state W':>10}{'rec R':>9}{'rec W':>9}{'total/head':>12}{'MB/step':>9}"
          f"{'tok R':>9}{'out W':>8}")

    def line(label, tr):
        print(f"{label:<36}{tr.state_read:>10.0f}{tr.state_write:>10.0f}{tr.record_read:>9.0f}{tr.record_write:>9.0f}"
              f"{tr.total:>12.0f}{tr.total * per_step:>9.1f}{tr.token_read:>9.0f}{tr.output_write:>8.0f}")
    T = program.config.max_drafts
    rows = [("conventional_step", 0, 1), ("replay_step", 0, 1), ("replay_step", program.config.window // 2, 1),
            ("replay_step", program.config.window - 1, 1), ("verify", 0, min(4, T)), ("verify", 0, T),
            ("snapshot_verify", 0, T)]
    for kernel, fill, t in rows:
        line(f"{kernel} (n={fill}{', t=' + str(t) if t > 1 else ''})", kernel_traffic(program, kernel, fill, t))
    amortised = replay_step_amortized(program)
    line("replay_step amortised over L", amortised)
    line(f"verify t={T}, fills 0..L-1, with fold", verify_mixed(program, T))
    print("bytes per batch row and value head; tok R / out W (the token inputs read, the outputs written) are not in\n"
          "total/head (docs/design.md's model) but count in verify's floor, where at t = T_max they are a tenth or more")
    conv = kernel_traffic(program, "conventional_step", 0).total
    amort = amortised.total
    print(f"conventional / replay (amortised): {conv / amort:.2f}x less state traffic")
    ok = abs(conv - formulas["conventional"]) < 1e-6 and abs(amort - formulas["replay_amortized"]) < 1e-6
    print(f"traffic formulas (docs/design.md): conventional 2·E·s = {formulas['conventional']:.0f}, replay amortised "
          f"= {formulas['replay_amortized']:.0f} B/head -> {'agree' if ok else 'DISAGREE'} with the plan-derived model")
    return 0 if ok else 1


def cmd_check(args) -> int:
    from .selfcheck import decode_and_compare

    report = decode_and_compare(_declaration(args.name, args), _shape(args), _config(args), backend=args.backend,
                                tokens=args.steps, seed=args.seed)
    print(report.summary())
    return 0 if report.ok else 1


def cmd_emit(args) -> int:
    from replayssm_dsl.lowering.render_cuda import render_program

    if bool(args.preset) == bool(args.shape):
        raise ReplaySSMError("emit: give the shape as --preset or --shape (one of them)")
    decl = _declaration(args.name, args)
    shape = _shape(args)
    label = args.preset or f"{shape.heads}x{shape.key_heads}x{shape.v_dim}x{shape.k_dim}"
    program = lower(decl, shape, _config(args))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    if args.standalone:
        from replayssm_dsl.lowering.standalone import write_standalone
        for path in write_standalone(program, out):
            print(path)
        return 0
    for kernel in program.kernels:
        path = out / f"{decl.name}-{label}-{kernel.name}.cu"
        path.write_text(render_program(program, kernels=[kernel.name]))
        print(path)
    whole = out / f"{decl.name}-{label}.cu"
    whole.write_text(render_program(program))
    print(whole)
    return 0


def cmd_bench(args) -> int:
    from .benchmark import main as bench_main
    return bench_main(args)


def cmd_compare(args) -> int:
    from .bench_compare import main as compare_main
    return compare_main(args)


def cmd_report(args) -> int:
    from .bench_report import main as report_main
    return report_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="replayssm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def with_input_dtypes(p, token_help: str):
        p.add_argument("--token-dtype", default="float32", choices=["float32", "bfloat16"], help=token_help)
        p.add_argument("--record-dtype", default="float32", choices=["float32", "bfloat16"],
                       help="bfloat16: records keep the bits of the bf16 token input a key or decay vector is computed from")
        p.add_argument("--raw-record-fields", type=parse_raw_record_fields, default=RAW_RECORD_FIELDS,
                       help="with --record-dtype bfloat16: which fields records keep raw (default key,decay)")

    def with_config(p, shape=True, shape_required=False):
        if shape:
            p.add_argument("--preset", choices=sorted(PRESETS), help="a model shape (docs/design.md, \"Traffic model\")")
            p.add_argument("--shape", type=shape_argument,
                           help="HV,H,V,K" + (" (this or --preset)" if shape_required else " (default 4,2,64,64)"))
        p.add_argument("--window", type=int, default=16, help="replay window L (default 16)")
        p.add_argument("--max-drafts", type=int, default=8, help="most drafts T per verify (default 8)")
        p.add_argument("--state-dtype", default="float32", choices=["float32", "float16", "bfloat16"])
        with_input_dtypes(p, "how every token input arrives (bfloat16: the kernels read raw bf16 bits)")

    sub.add_parser("variants", help="list the built-in variants").set_defaults(func=cmd_variants)
    p = sub.add_parser("show", help="print a declaration and its lowered plans")
    p.add_argument("name", help=VARIANT_HELP)
    with_config(p)
    p.set_defaults(func=cmd_show)
    p = sub.add_parser("traffic", help="traffic model for a model shape")
    p.add_argument("--preset", required=True, choices=sorted(PRESETS))
    p.add_argument("--variant", help="override the preset's variant (" + VARIANT_HELP + ")")
    p.add_argument("--batch", type=int, default=256)
    with_config(p, shape=False)
    p.set_defaults(func=cmd_traffic)
    p = sub.add_parser("check", help="run a variant end to end against the oracle")
    p.add_argument("name", help=VARIANT_HELP)
    p.add_argument("--backend", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    with_config(p)
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("emit", help="write the CUDA sources of a variant for a preset or a shape")
    p.add_argument("name", help=VARIANT_HELP)
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--standalone", action="store_true",
                   help="one self-contained .cu with extern \"C\" launchers, a header and manifest.json")
    with_config(p, shape_required=True)
    p.set_defaults(func=cmd_emit)
    p = sub.add_parser("bench", help="GPU benchmark of the generated kernels (needs a GPU)")
    p.add_argument("--out", default="bench-out", help="folder for results.json, results.md, speedup.png")
    p.add_argument("--quick", action="store_true", help="fewer batch sizes and repetitions")
    p.add_argument("--batches", default="1,8,32,128,256,512")
    p.add_argument("--presets", default=",".join(DESIGN_PRESETS),
                   help=f"comma-separated (default: docs/design.md's five; all: {','.join(PRESETS)})")
    p.add_argument("--kernels", default=",".join(BENCH_KERNELS),
                   help="what to time, comma-separated, of " + ", ".join(BENCH_KERNELS)
                   + " (default: all); a subset tunes only the launch groups it needs")
    with_input_dtypes(p, "how the token inputs arrive (bfloat16: every token input, and FLA's q, k, v)")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("compare", help="new / old time per kernel between two bench results.json files (no GPU)")
    p.add_argument("old")
    p.add_argument("new")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("report", help="one table and plot from several bench results.json files (no GPU)")
    p.add_argument("runs", nargs="+", help="results.json files of runs that timed different presets or batches")
    p.add_argument("--out", required=True, help="folder for the joined results.json, results.md, speedup.png")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ReplaySSMError as exc:
        print(f"replayssm: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left early (`replayssm traffic ... | head`): no traceback
        # (Python's documented recipe: point stdout at devnull so the interpreter's final flush is silent)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
