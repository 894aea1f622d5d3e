"""Summarise Nsight Compute's per-instruction stall sampling of one kernel (no GPU needed).

Reads the CSV that ``ncu --import REPORT --page source --csv --print-source sass`` writes (what
``scripts/gpu-check.sh stalls`` saves as ``stalls-<kernel>-sass.csv``) and prints the share of each
stall reason over all samples, then the instructions with the most samples, each with its offset in
the kernel, how often warps executed it and the reasons that make up most of its samples. Samples
on the instruction *after* a ``BAR.SYNC`` are warps waiting at that barrier.

Usage: ``python scripts/stall_summary.py stalls-replay_step-sass.csv [--top 25]``.
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def summarise(path: str, top: int) -> str:
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    kernel = rows[0][1] if rows and len(rows[0]) > 1 else "?"
    header, data = rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    totals = Counter()
    for row in data:
        for reason in reasons:
            totals[reason] += number(row[col[reason]])
    all_samples = sum(totals.values()) or 1.0
    base = int(data[0][col["Address"]], 16)
    lines = [f"{kernel}: {all_samples:.0f} stall samples, {sum(number(r[col[EXECUTED]]) for r in data):.0f} "
             "warp instructions executed",
             "reasons: " + ", ".join(f"{r[6:]} {100 * v / all_samples:.1f}%" for r, v in totals.most_common(8))]
    lines.append(f"{'offset':>7} {'samples':>8} {'share':>6} {'executed':>9}  instruction  [main reasons]")
    for row in sorted(data, key=lambda r: -number(r[col[SAMPLES]]))[:top]:
        samples = number(row[col[SAMPLES]])
        main = {r[6:]: int(number(row[col[r]])) for r in reasons if number(row[col[r]]) > 0.15 * samples}
        lines.append(f"{int(row[col['Address']], 16) - base:07x} {samples:8.0f} {100 * samples / all_samples:5.1f}% "
                     f"{number(row[col[EXECUTED]]):9.0f}  {row[col['Source']].strip()[:70]}  {main}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="+")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print("\n\n".join(summarise(path, args.top) for path in args.csv))


if __name__ == "__main__":
    main()
