"""Runtime layer: compare two ``replayssm bench`` results files (no GPU needed).

``replayssm compare OLD.json NEW.json`` prints, for every preset and batch size both files hold, the
new time over the old for each timed kernel, with both launch shapes: the way to read what a change
did between two benchmark runs. Ratios below 1 are faster.
"""

from __future__ import annotations

import json
from pathlib import Path

from replayssm_dsl.errors import InputError

from .benchmark import COLUMNS

TIMED = tuple((name, key) for name, key, _ in COLUMNS if key not in ("B", "launch"))  # the table's times, in its order


def load_results(path) -> dict:
    """(preset, B) → result row of a ``results.json``; a clear error for a file that is not one."""
    try:
        rows = json.loads(Path(path).read_text())
        return {(r["preset"], r["B"]): r for r in rows}
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise InputError(f"{path}: not a replayssm bench results.json ({exc})") from exc


def compare(old: dict, new: dict) -> list[str]:
    """Markdown lines: one row per (preset, B) in both, each timed column as new / old."""
    header = "| preset | B | launch (old → new) | " + " | ".join(name for name, _ in TIMED) + " |"
    lines = [header, "|" + "---|" * (3 + len(TIMED))]
    for key in (k for k in new if k in old):
        a, b = old[key], new[key]
        ratios = [f"{b[k] / a[k]:.3f}" if a.get(k) and b.get(k) else "n/a" for _, k in TIMED]
        launch = a["launch"] if a["launch"] == b["launch"] else f"{a['launch']} → {b['launch']}"
        lines.append(f"| {key[0]} | {key[1]} | {launch} | " + " | ".join(ratios) + " |")
    return lines


def main(args) -> int:
    old, new = load_results(args.old), load_results(args.new)
    lines = compare(old, new)
    if len(lines) == 2:
        raise InputError(f"{args.old} and {args.new} share no (preset, batch) row")
    print(f"new / old time per kernel ({args.new} over {args.old}); below 1 is faster")
    print("\n".join(lines))
    return 0
