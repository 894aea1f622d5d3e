"""``replayssm report``: several benchmark results files joined into one table (no GPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from replayssm_dsl.runtime import cli
from replayssm_dsl.runtime.bench_compare import TIMED


def _rows(rng, presets, batches):
    return [dict({key: float(rng.uniform(0.01, 2.0)) for _, key in TIMED}, preset=p, variant="v", B=b, launch="4x8")
            for p in presets for b in batches]


def _write(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text(json.dumps(rows))
    return str(path)


def test_report_joins_runs_in_preset_and_batch_order(tmp_path, capsys):
    rng = np.random.default_rng()
    late = _rows(rng, ["kimi-linear", "qwen3.5-4b"], [512, 8])
    early = _rows(rng, ["qwen3.5-4b"], [1, 256])
    out = tmp_path / "joined"
    assert cli.main(["report", _write(tmp_path, "a.json", late), _write(tmp_path, "b.json", early), "--out", str(out)]) == 0
    joined = json.loads((out / "results.json").read_text())
    assert [(r["preset"], r["B"]) for r in joined] == [("qwen3.5-4b", 1), ("qwen3.5-4b", 8), ("qwen3.5-4b", 256),
                                                       ("qwen3.5-4b", 512), ("kimi-linear", 8), ("kimi-linear", 512)]
    by_key = {(r["preset"], r["B"]): r for r in late + early}
    assert all(r == by_key[(r["preset"], r["B"])] for r in joined), "rows pass through unchanged"
    table = (out / "results.md").read_text()
    assert table in capsys.readouterr().out
    qwen_256 = by_key[("qwen3.5-4b", 256)]
    assert f"| 256 | 4x8 | {qwen_256['conventional_step']:.3f} | {qwen_256['replay_step']:.3f} |" in table


def test_report_refuses_a_row_two_runs_hold(tmp_path, capsys):
    rng = np.random.default_rng()
    a = _write(tmp_path, "a.json", _rows(rng, ["qwen3.5-4b"], [8, 32]))
    b = _write(tmp_path, "b.json", _rows(rng, ["qwen3.5-4b"], [32, 128]))
    assert cli.main(["report", a, b, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "b.json: qwen3.5-4b at B = 32 is also in" in err and "a.json" in err
    assert not (tmp_path / "out").exists(), "nothing written for a refused join"


def test_report_refuses_rows_timed_with_other_settings(tmp_path, capsys):
    rng = np.random.default_rng()
    float32 = _rows(rng, ["kimi-linear"], [8])  # no record_dtype: a row from before the setting, float32
    bf16 = [dict(r, record_dtype="bfloat16", raw_record_fields=["key"]) for r in _rows(rng, ["kimi-linear"], [32])]
    a, b = _write(tmp_path, "a.json", float32), _write(tmp_path, "b.json", bf16)
    assert cli.main(["report", a, b, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "b.json: kimi-linear at B = 32 was timed with" in err and "'record_dtype': 'bfloat16'" in err
    same = [dict(r, token_dtype="float32", record_dtype="float32") for r in _rows(rng, ["kimi-linear"], [32])]
    assert cli.main(["report", a, _write(tmp_path, "c.json", same), "--out", str(tmp_path / "ok")]) == 0
    both = [dict(r, record_dtype="bfloat16", raw_record_fields=["key", "decay"]) for r in _rows(rng, ["kimi-linear"], [8])]
    d = _write(tmp_path, "d.json", both)  # bf16 records in both, but other raw fields
    assert cli.main(["report", d, b, "--out", str(tmp_path / "fields")]) == 2
    assert "'raw_record_fields': ['key']" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["twice in one file", "empty file", "same file twice", "out overwrites an input"])
def test_report_refuses_what_would_lose_or_hide_rows(tmp_path, capsys, case):
    rng = np.random.default_rng()
    out = tmp_path / "out"
    if case == "twice in one file":
        args, says = [_write(tmp_path, "a.json", _rows(rng, ["qwen3.5-4b"], [8, 8]))], "a.json: qwen3.5-4b at B = 8 is in it twice"
    elif case == "empty file":
        args, says = [_write(tmp_path, "a.json", [])], "a.json: holds no rows"
    elif case == "same file twice":
        a = _write(tmp_path, "a.json", _rows(rng, ["qwen3.5-4b"], [8]))
        args, says = [a, a], "a.json: given twice"
    else:
        out.mkdir()
        args, says = [_write(out, "results.json", _rows(rng, ["qwen3.5-4b"], [8]))], "would overwrite it"
    before = sorted(p.name for p in out.iterdir()) if out.exists() else None
    assert cli.main(["report", *args, "--out", str(out)]) == 2
    assert says in capsys.readouterr().err
    assert (sorted(p.name for p in out.iterdir()) if out.exists() else None) == before, "nothing written"


def test_report_puts_presets_it_does_not_know_after_the_known_ones_in_the_order_met(tmp_path):
    rng = np.random.default_rng()
    rows = _rows(rng, ["my-model", "kimi-linear", "another"], [4])
    out = tmp_path / "out"
    assert cli.main(["report", _write(tmp_path, "a.json", rows), "--out", str(out)]) == 0
    assert [r["preset"] for r in json.loads((out / "results.json").read_text())] == ["kimi-linear", "my-model", "another"]
