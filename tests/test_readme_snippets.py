"""Tests (docs): the README's Python snippets run as written, in order, in one namespace. Without a GPU the
"Running it" snippet runs on ``CpuReplayCache`` (the swap its import comment offers); on a GPU it runs as
written and its outputs match the CPU cache's float64 results for the same inputs."""

import re
from pathlib import Path

import numpy as np
import pytest
from gpu_cases import FP32_TOL
from twin import assert_close, to_host

README = Path(__file__).resolve().parents[1] / "README.md"
CUDA_IMPORT = "from replayssm_dsl.runtime.cuda_cache import CudaReplayCache"
CPU_IMPORT = "from replayssm_dsl.runtime.cpu_cache import CpuReplayCache as CudaReplayCache"
SOURCE_LINE = re.compile(r"^print\(cache\.source\).*$", re.MULTILINE)


def readme_snippets() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", README.read_text(), re.MULTILINE | re.DOTALL)


def run_snippets(tmp_path, monkeypatch, on_cpu: bool) -> dict:
    """Every snippet in one namespace, in ``tmp_path`` (``write_standalone`` writes ``out/`` there)."""
    snippets = readme_snippets()
    running = [s for s in snippets if CUDA_IMPORT in s]
    assert len(snippets) >= 3 and len(running) == 1, "the README's snippets moved: update this test"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for snippet in snippets:
        if snippet is running[0] and on_cpu:
            assert SOURCE_LINE.search(snippet), "the running snippet no longer prints cache.source"
            snippet = SOURCE_LINE.sub("", snippet.replace(CUDA_IMPORT, CPU_IMPORT))
        exec(compile(snippet, str(README), "exec"), namespace)
    return namespace


def check_results(ns: dict) -> None:
    """The shapes the snippet's comments give; every live row's drafts and state finite; the files."""
    slots, drafts = np.asarray(ns["slots"]), np.asarray(ns["drafts"])
    out, state = to_host(ns["out"]), to_host(ns["S"])
    assert out.shape == (len(slots), ns["T"], 32, 128)
    assert state.shape == (len(slots), 32, 128, 128)
    for b in np.flatnonzero(slots >= 0):
        assert np.isfinite(out[b, : drafts[b]]).all() and np.isfinite(state[b]).all(), f"row {b}"
    assert any(Path("out").glob("*.cu")) and Path("out", "manifest.json").is_file()
    assert "__global__" in ns["source"]


def test_readme_snippets_run_on_cpu(tmp_path, monkeypatch, capsys):
    check_results(run_snippets(tmp_path, monkeypatch, on_cpu=True))
    assert "replay_step" in capsys.readouterr().out  # the plan the lowering snippet prints


@pytest.mark.gpu
def test_readme_snippets_run_on_gpu_as_written(tmp_path, monkeypatch):
    (tmp_path / "cpu").mkdir(), (tmp_path / "gpu").mkdir()
    cpu = run_snippets(tmp_path / "cpu", monkeypatch, on_cpu=True)
    gpu = run_snippets(tmp_path / "gpu", monkeypatch, on_cpu=False)
    check_results(gpu)
    assert "__global__" in gpu["cache"].source
    slots, drafts = np.asarray(gpu["slots"]), np.asarray(gpu["drafts"])
    for b in np.flatnonzero(slots >= 0):
        assert_close(to_host(gpu["out"])[b, : drafts[b]], to_host(cpu["out"])[b, : drafts[b]], FP32_TOL, f"verify row {b}")
        assert_close(to_host(gpu["S"])[b], to_host(cpu["S"])[b], FP32_TOL, f"materialized row {b}")
