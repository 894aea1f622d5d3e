"""The autotuner's option twins side by side, from its table (a measurement helper, no GPU).

For every table entry whose first pass timed a launch and its twin (verify of few drafts' ``/c``,
``score_twins``; and ``/n``, the fill word read plainly, in the tables of the ``fill-steps-hybrid``
branch, docs/performance.md), one line: the entry's shape, batch size and group, the pair's
first-pass times, their ratio and, where both were finalists, their confirmed medians; and the launch
the entry chose (the least confirmed median). Usage: ``python scripts/twin_times.py $REPLAYSSM_AUTOTUNE_CACHE``.
"""

from __future__ import annotations

import json
import sys

TWIN_SUFFIXES = ("/n", "/c")


def twin_rows(table: dict) -> list[str]:
    rows = []
    for key, entry in sorted(table.items()):
        parts = key.split("|")
        where = f"B={parts[4]}" + (f" {parts[5]}" if len(parts) > 5 else " replay")
        first, confirmed = entry.get("ms", {}), entry.get("confirmed_ms", {})
        for label, ms in sorted(first.items()):
            for suffix in TWIN_SUFFIXES:
                if label.endswith(suffix) and label[:-len(suffix)] in first:
                    base = label[:-len(suffix)]
                    both = (f"; confirmed {confirmed[base]:.5f} / {confirmed[label]:.5f} = {confirmed[label] / confirmed[base]:.3f}"
                            if base in confirmed and label in confirmed else "")
                    rows.append(f"{parts[2]} {where}: {base} {first[base]:.5f}, {label} {ms:.5f} = {ms / first[base]:.3f}{both}")
        if confirmed:
            rows.append(f"{parts[2]} {where}: chose {min(confirmed, key=confirmed.get)}")
    return rows


if __name__ == "__main__":
    print("\n".join(twin_rows(json.loads(open(sys.argv[1]).read()))))
