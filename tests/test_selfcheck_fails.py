"""Runtime layer tests: the self-check (``replayssm check``, the examples) can fail. A backend whose
step, verify or materialize is wrong, or writes a NaN, is reported TOO LARGE with exit status 1;
the traffic command exits 1 where its formulas and the plan-derived model disagree. No GPU: the CPU
backend, with one of its methods corrupted.
"""

from __future__ import annotations

import numpy as np
import pytest

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.runtime import cli, selfcheck
from replayssm_dsl.runtime.cpu_cache import CpuReplayCache

SHAPE, CONFIG = ModelShape(2, 1, 16, 16), ReplayConfig(window=4, max_drafts=4)


def _nan_in_row_one(out):
    out = np.array(out, copy=True)
    out[1, ..., 0] = np.nan
    return out


def _drafts_past_the_first_off(out):
    out = np.array(out, copy=True)
    out[:, 1:] += 1e-2
    return out


def _states_off(out):
    return np.asarray(out) + 1e-2


@pytest.mark.parametrize("method,corrupt", [("step", _nan_in_row_one), ("verify", _drafts_past_the_first_off),
                                            ("materialize", _states_off)], ids=["step-nan", "verify-drafts", "materialize"])
def test_a_wrong_backend_fails_the_check(monkeypatch, method, corrupt):
    honest = getattr(CpuReplayCache, method)
    monkeypatch.setattr(CpuReplayCache, method, lambda self, *a, **k: corrupt(honest(self, *a, **k)))
    report = selfcheck.decode_and_compare(variants.get("gdn"), SHAPE, CONFIG, backend="cpu", tokens=20, seed=1)
    assert not report.ok and report.worst > report.tolerance, report.summary()
    assert "TOO LARGE" in report.summary()
    if method == "step":
        assert report.worst == float("inf")  # a NaN scores inf (max() alone would drop it)


def test_the_error_is_relative_to_at_least_one():
    assert selfcheck._rel(np.array([0.01]), np.array([0.0])) == pytest.approx(0.01)
    assert selfcheck._rel(np.array([4.4]), np.array([4.0])) == pytest.approx(0.1)
    assert selfcheck._rel(np.array([np.nan]), np.array([1.0])) == float("inf")
    assert selfcheck._rel(np.array([np.inf]), np.array([1.0])) == float("inf")


def test_a_failing_check_exits_1(monkeypatch, capsys):
    monkeypatch.setattr(CpuReplayCache, "step", lambda self, *a, **k: np.full((2, 1, 1), np.nan))
    assert cli.main(["check", "gdn", "--backend", "cpu", "--steps", "3"]) == 1
    assert "TOO LARGE" in capsys.readouterr().out
    status = selfcheck.run_example(variants.get("gdn"), SHAPE, CONFIG, ["--backend", "cpu", "--tokens", "3"])
    assert status == 1 and "TOO LARGE" in capsys.readouterr().out


def test_traffic_exits_1_where_the_formulas_disagree(monkeypatch, capsys):
    honest = cli.design_formulas
    monkeypatch.setattr(cli, "design_formulas", lambda program: {k: v + 1.0 for k, v in honest(program).items()})
    assert cli.main(["traffic", "--preset", "qwen3.5-4b"]) == 1
    assert "DISAGREE" in capsys.readouterr().out
    monkeypatch.setattr(cli, "design_formulas", honest)
    assert cli.main(["traffic", "--preset", "qwen3.5-4b"]) == 0
