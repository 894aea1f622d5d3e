"""The examples run and check themselves (short runs, CPU backend here; the GPU check script runs
them on the device as well)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_and_agrees_with_the_oracle(path, monkeypatch, capsys):
    short = ["--steps", "40"] if path.stem == "engine_loop" else ["--tokens", "24"]
    monkeypatch.setattr(sys, "argv", [str(path), "--backend", "cpu"] + short)
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    assert done.value.code == 0, out
    assert "largest relative error" in out


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_asked_for_cuda_without_cupy_ends_with_one_line(path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    monkeypatch.setattr(sys, "argv", [str(path), "--backend", "cuda"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(path), run_name="__main__")
    assert done.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"{path.name}: error: the CUDA backend needs CuPy: pip install 'replayssm-dsl[cuda]'"]
