"""The replay step's state rows in flight per SM at given launch shapes (no GPU needed): NVRTC for
sm_90, then ptxas's registers, spills and shared memory, and the CTAs per SM they allow on an H200.

The step's time at B = 256 falls with the rows an SM holds while its CTAs wait on their loads (the
tuner's table, docs/performance.md), so this says before any device time is spent whether a launch
shape (say one with shared rows, ``/sN``) holds more of them than the tuned one.

Usage: ``python scripts/rows_in_flight.py qwen3.5-4b 8x8/r64 4x16/r96/s8 [--kernel replay_step]``.
"""

from __future__ import annotations

import argparse

REGISTERS_PER_SM = 65536
REGISTER_UNIT = 256  # registers are allocated per warp in units of 256
SHARED_PER_SM = 228 * 1024  # bytes; each CTA also takes 1 KiB reserved by the system
SHARED_RESERVED = 1024
MAX_WARPS_PER_SM, MAX_CTAS_PER_SM = 64, 32


def ctas_per_sm(registers: int, shared_bytes: int, warps: int) -> dict[str, int]:
    """CTAs of ``warps`` warps per SM, as each resource allows, and the least of them (``ctas``)."""
    per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    limits = {"registers": REGISTERS_PER_SM // (per_warp * warps),
              "shared": SHARED_PER_SM // (shared_bytes + SHARED_RESERVED),
              "warps": MAX_WARPS_PER_SM // warps, "ctas": MAX_CTAS_PER_SM}
    return {**limits, "ctas": min(limits.values())}


def report(preset: str, labels: list[str], kernel: str = "replay_step") -> list[dict]:
    """One row per launch label: ptxas's resources of ``kernel``, its dynamic shared memory (the shared
    rows) and the rows in flight per SM (``None`` resources where the module does not build, e.g.
    past 48 KiB of static shared memory)."""
    from replayssm_dsl import ReplayConfig, variants
    from replayssm_dsl.config import preset as get_preset
    from replayssm_dsl.lowering import lower
    from replayssm_dsl.lowering.launch import LaunchConfig
    from replayssm_dsl.lowering.render_cuda import render_program
    from replayssm_dsl.lowering.render_replay import dynamic_shared_bytes
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin

    p = get_preset(preset)
    program = lower(variants.get(p.variant), p.shape, ReplayConfig())
    rows = []
    for label in labels:
        launch = LaunchConfig.from_label(label)
        try:
            res = compile_cubin(render_program(program, launch, kernels=[kernel]), f"{kernel}.cu", "sm_90").resources[kernel]
        except RuntimeError as exc:
            rows.append({"launch": label, "resources": None, "error": str(exc).strip().splitlines()[-1]})
            continue
        dynamic = dynamic_shared_bytes(program.kernel(kernel), program, launch)
        limits = ctas_per_sm(res.registers, res.shared_bytes + dynamic, launch.warps)
        rows.append({"launch": label, "resources": res, "dynamic_shared": dynamic, "limits": limits,
                     "rows_per_sm": limits["ctas"] * launch.rows_per_cta})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset")
    parser.add_argument("labels", nargs="+", help="launch labels, e.g. 8x8/r64 4x16/r96/s8")
    parser.add_argument("--kernel", default="replay_step")
    args = parser.parse_args()
    print("| launch | registers | spill stores | shared bytes (static + dynamic) | CTAs/SM (registers, shared) | rows/SM |")
    print("|---|---|---|---|---|---|")
    for row in report(args.preset, args.labels, args.kernel):
        res = row["resources"]
        if res is None:
            print(f"| {row['launch']} | does not build: {row['error']} | | | | |")
            continue
        lim = row["limits"]
        print(f"| {row['launch']} | {res.registers} | {res.spill_stores} | {res.shared_bytes} + {row['dynamic_shared']} | "
              f"{lim['ctas']} ({lim['registers']}, {lim['shared']}) | {row['rows_per_sm']} |")


if __name__ == "__main__":
    main()
