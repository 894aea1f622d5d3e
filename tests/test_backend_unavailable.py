"""Runtime layer: what a machine without CuPy or without a GPU is told (no GPU needed: CuPy is
replaced by stand-ins where it matters)."""

from __future__ import annotations

import sys
import types

import pytest

from replayssm_dsl import BackendUnavailable, ReplaySSMError
from replayssm_dsl.runtime import cli, cuda_module


def fake_cupy(device_count=None, error=None) -> types.ModuleType:
    """A stand-in for ``cupy`` whose runtime reports ``device_count`` GPUs, or raises ``error``."""
    class CUDARuntimeError(RuntimeError):
        pass

    def get_device_count():
        if error:
            raise CUDARuntimeError(error)
        return device_count

    runtime = types.SimpleNamespace(getDeviceCount=get_device_count, CUDARuntimeError=CUDARuntimeError)
    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(runtime=runtime)
    return module


def test_backend_unavailable_is_an_import_error_and_a_project_error():
    assert issubclass(BackendUnavailable, ImportError) and issubclass(BackendUnavailable, ReplaySSMError)


@pytest.mark.parametrize("cupy,match", [
    (fake_cupy(device_count=0), "replayssm bench needs a CUDA GPU; CuPy sees none"),
    (fake_cupy(error="cudaErrorNoDevice: no CUDA-capable device is detected"),
     "replayssm bench needs a CUDA GPU; CUDA says: cudaErrorNoDevice"),
])
def test_require_gpu_says_what_needs_a_gpu(monkeypatch, cupy, match):
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    with pytest.raises(BackendUnavailable, match=match):
        cuda_module.require_gpu("replayssm bench")


def test_require_gpu_gives_cupy_where_it_sees_a_gpu(monkeypatch):
    cupy = fake_cupy(device_count=1)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    assert cuda_module.require_gpu("x") is cupy


def test_without_cupy_the_gpu_commands_end_with_one_line_saying_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    assert cli.main(["bench", "--presets", "kimi-linear", "--batches", "1"]) == 2
    assert cli.main(["check", "gdn", "--backend", "cuda", "--steps", "4"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["replayssm: error: the CUDA backend needs CuPy: pip install 'replayssm-dsl[cuda]'"] * 2


def test_without_a_gpu_bench_says_so(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(device_count=0))
    assert cli.main(["bench", "--presets", "kimi-linear", "--batches", "1"]) == 2
    assert "replayssm bench needs a CUDA GPU; CuPy sees none" in capsys.readouterr().err


@pytest.mark.parametrize("cupy,says", [
    (fake_cupy(device_count=0), "CuPy sees none"),
    (fake_cupy(error="cudaErrorInsufficientDriver: CUDA driver version is insufficient"),
     "CUDA says: cudaErrorInsufficientDriver"),
])
def test_with_cupy_but_no_usable_gpu_the_cuda_backend_ends_with_one_line(monkeypatch, capsys, cupy, says):
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    assert cli.main(["check", "gdn", "--backend", "cuda", "--steps", "4"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("replayssm: error: the CUDA backend needs a CUDA GPU; ") and says in err[0]
