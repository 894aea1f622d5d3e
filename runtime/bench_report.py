"""Runtime layer: one table and plot from several ``replayssm bench`` results files (no GPU needed).

``replayssm report RUN.json [RUN.json ...] --out DIR`` joins the rows of runs that timed different
batch sizes or presets (a device call's time limit can cut a sweep into several runs) and writes
``results.json``, ``results.md`` and ``speedup.png`` (with matplotlib) as ``replayssm bench`` does.
A (preset, batch) row in two files is refused (a table row holds one run's times, never a mix), and
so are rows timed with other token or record dtypes than the first file's.
"""

from __future__ import annotations

import json
from pathlib import Path

from replayssm_dsl.config import PRESETS, RAW_RECORD_FIELDS
from replayssm_dsl.errors import InputError

from .benchmark import write_table_and_plot


SETTINGS = (("token_dtype", "float32"), ("record_dtype", "float32"), ("raw_record_fields", list(RAW_RECORD_FIELDS)))
"""What a row was timed with, beside its preset and batch (a row from before a setting existed had its default)."""


def _rows(path) -> list[dict]:
    try:
        rows = json.loads(Path(path).read_text())
        keys = [(r["preset"], r["B"]) for r in rows]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise InputError(f"{path}: not a replayssm bench results.json ({exc})") from exc
    if not rows:
        raise InputError(f"{path}: holds no rows")
    if len(set(keys)) != len(keys):
        twice = next(k for k in keys if keys.count(k) > 1)
        raise InputError(f"{path}: {twice[0]} at B = {twice[1]} is in it twice")
    return rows


def _settings(row: dict) -> dict:
    return {name: row.get(name, default) for name, default in SETTINGS}


def join_results(paths, out: Path | None = None) -> list[dict]:
    """The rows of every file, by preset (``PRESETS`` order, then others as met) and batch size.
    Refused: a file given twice, or that ``out`` would overwrite; a (preset, batch) row in two files or
    twice in one; rows timed with other settings than the first file's (token, record dtypes)."""
    paths = [Path(p) for p in paths]
    for i, path in enumerate(paths):
        if any(path.resolve() == other.resolve() for other in paths[:i]):
            raise InputError(f"{path}: given twice")
        if out is not None and path.resolve() == (Path(out) / "results.json").resolve():
            raise InputError(f"{path}: --out {out} would overwrite it; write the joined table elsewhere")
    rows, source, first = {}, {}, None
    for path in paths:
        for row in _rows(path):
            key = (row["preset"], row["B"])
            if key in rows:
                raise InputError(f"{path}: {key[0]} at B = {key[1]} is also in {source[key]}; "
                                 "a table row holds one run's times")
            first = first or (path, _settings(row))
            if _settings(row) != first[1]:
                raise InputError(f"{path}: {key[0]} at B = {key[1]} was timed with {_settings(row)}, "
                                 f"{first[0]} with {first[1]}; one table holds one setting")
            rows[key], source[key] = row, path
    order = {name: i for i, name in enumerate(PRESETS)}
    met = {name: len(order) + i for i, name in enumerate(dict.fromkeys(p for p, _ in rows))}
    return [rows[k] for k in sorted(rows, key=lambda k: (order.get(k[0], met[k[0]]), k[1]))]


def main(args) -> int:
    results = join_results(args.runs, args.out)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    write_table_and_plot(results, out)
    return 0
