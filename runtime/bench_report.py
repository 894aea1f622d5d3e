"""Runtime layer: one table and plot from several ``replayssm bench`` results files (no GPU needed).

``replayssm report RUN.json [RUN.json ...] --out DIR`` joins the rows of runs that timed different
batch sizes or presets (a device call's time limit can cut a sweep into several runs) and writes
``results.json``, ``results.md`` and ``speedup.png`` (with matplotlib) as ``replayssm bench`` does.
A (preset, batch) row in two files is refused: a table row holds one run's times, never a mix.
"""

from __future__ import annotations

import json
from pathlib import Path

from replayssm_dsl.config import PRESETS
from replayssm_dsl.errors import InputError

from .bench_compare import load_results
from .benchmark import write_table_and_plot


def join_results(paths) -> list[dict]:
    """The rows of every file, by preset (``PRESETS`` order, then others as met) and batch size."""
    rows, source = {}, {}
    for path in paths:
        for key, row in load_results(path).items():
            if key in rows:
                raise InputError(f"{path}: {key[0]} at B = {key[1]} is also in {source[key]}; "
                                 "a table row holds one run's times")
            rows[key], source[key] = row, path
    order = {name: i for i, name in enumerate(PRESETS)}
    met = {name: len(order) + i for i, name in enumerate(dict.fromkeys(p for p, _ in rows))}
    return [rows[k] for k in sorted(rows, key=lambda k: (order.get(k[0], met[k[0]]), k[1]))]


def main(args) -> int:
    results = join_results(args.runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    write_table_and_plot(results, out)
    return 0
