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


def run_snippets(workdir: Path, monkeypatch, on_cpu: bool) -> dict:
    """Every snippet in one namespace, in ``workdir`` (``write_standalone`` writes ``out/`` there)."""
    snippets = readme_snippets()
    running = [s for s in snippets if CUDA_IMPORT in s]
    assert len(snippets) >= 3 and len(running) == 1, "the README's snippets moved: update this test"
    workdir.mkdir(exist_ok=True)
    monkeypatch.chdir(workdir)
    namespace: dict = {}
    for snippet in snippets:
        if snippet is running[0] and on_cpu:
            assert SOURCE_LINE.search(snippet), "the running snippet no longer prints cache.source"
            snippet = SOURCE_LINE.sub("", snippet.replace(CUDA_IMPORT, CPU_IMPORT))
        exec(compile(snippet, str(README), "exec"), namespace)  # noqa: S102 (the README's own code)
    return namespace


def check_results(ns: dict) -> None:
    """The shapes the snippet's comments give; every live row's drafts and state finite; the files."""
    slots, drafts, shape = np.asarray(ns["slots"]), np.asarray(ns["drafts"]), ns["shape"]
    out, state = to_host(ns["out"]), to_host(ns["S"])
    assert out.shape == (len(slots), ns["T"], shape.heads, shape.v_dim)
    assert state.shape == (len(slots), shape.heads, shape.v_dim, shape.k_dim)
    for b in np.flatnonzero(slots >= 0):
        assert np.isfinite(out[b, : drafts[b]]).all() and np.isfinite(state[b]).all(), f"row {b}"
    assert any(Path("out").glob("*.cu")) and Path("out", "manifest.json").is_file()
    assert "__global__" in ns["source"]


def test_readme_snippets_run_on_cpu(tmp_path, monkeypatch, capsys):
    check_results(run_snippets(tmp_path, monkeypatch, on_cpu=True))
    assert "replay_step" in capsys.readouterr().out  # the plan the lowering snippet prints


@pytest.mark.gpu
def test_readme_snippets_run_on_gpu_as_written(tmp_path, monkeypatch):
    cpu = run_snippets(tmp_path / "cpu", monkeypatch, on_cpu=True)
    gpu = run_snippets(tmp_path / "gpu", monkeypatch, on_cpu=False)
    check_results(gpu)
    assert "__global__" in gpu["cache"].source
    slots, drafts = np.asarray(gpu["slots"]), np.asarray(gpu["drafts"])
    (gpu_out, gpu_state), (cpu_out, cpu_state) = ((to_host(ns["out"]), to_host(ns["S"])) for ns in (gpu, cpu))
    for b in np.flatnonzero(slots >= 0):
        assert_close(gpu_out[b, : drafts[b]], cpu_out[b, : drafts[b]], FP32_TOL, f"verify row {b}")
        assert_close(gpu_state[b], cpu_state[b], FP32_TOL, f"materialized row {b}")
