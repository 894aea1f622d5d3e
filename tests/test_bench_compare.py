"""``replayssm compare``: new / old time per kernel between two benchmark results files (no GPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from replayssm_dsl.runtime import cli
from replayssm_dsl.runtime.bench_compare import TIMED


def _results(rng, presets, batches, launch):
    return [dict({key: float(rng.uniform(0.01, 2.0)) for _, key in TIMED}, preset=p, B=b, launch=launch)
            for p in presets for b in batches]


def test_compare_prints_each_kernel_new_over_old(tmp_path, capsys):
    rng = np.random.default_rng()
    old = _results(rng, ["qwen3.5-4b", "kimi-linear"], [1, 256], "4x8")
    new = _results(rng, ["qwen3.5-4b"], [256, 512], "4x16")
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    assert cli.main(["compare", str(tmp_path / "old.json"), str(tmp_path / "new.json")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| qwen")]
    assert len(rows) == 1, "only (preset, B) rows that both files hold"
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[:3] == ["qwen3.5-4b", "256", "4x8 → 4x16"]
    a, b = old[1], new[0]
    for (_, key), cell in zip(TIMED, cells[3:]):
        assert float(cell) == pytest.approx(b[key] / a[key], abs=6e-4)


def test_compare_names_a_file_that_is_not_results(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not json")
    (tmp_path / "ok.json").write_text(json.dumps(_results(np.random.default_rng(), ["qwen3.5-4b"], [1], "4x4")))
    assert cli.main(["compare", str(tmp_path / "notes.txt"), str(tmp_path / "ok.json")]) == 2
    assert "notes.txt: not a replayssm bench results.json" in capsys.readouterr().err


def test_compare_refuses_files_with_nothing_in_common(tmp_path, capsys):
    rng = np.random.default_rng()
    (tmp_path / "a.json").write_text(json.dumps(_results(rng, ["qwen3.5-4b"], [1], "4x4")))
    (tmp_path / "b.json").write_text(json.dumps(_results(rng, ["kimi-linear"], [1], "4x4")))
    assert cli.main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    assert "share no (preset, batch) row" in capsys.readouterr().err
