"""Test configuration: ``tests/`` on the import path (strategies, twin); GPU and NVRTC tests skip
cleanly, with the reason, where there is no GPU / no NVRTC."""

import functools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@functools.lru_cache(maxsize=None)
def gpu_unavailable() -> str:
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as exc:  # CuPy raises its own CUDARuntimeError without a driver
        return f"no usable CUDA device ({type(exc).__name__})"
    return ""


@functools.lru_cache(maxsize=None)
def nvrtc_unavailable() -> str:
    try:
        from cuda.bindings.nvrtc import nvrtcVersion
        nvrtcVersion()
    except Exception as exc:
        return f"NVRTC (cuda-python + nvidia-cuda-nvrtc) not usable: {type(exc).__name__}: {exc}"
    return ""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and gpu_unavailable():
            item.add_marker(pytest.mark.skip(reason=f"GPU test: {gpu_unavailable()}"))
        if "nvrtc" in item.keywords and nvrtc_unavailable():
            item.add_marker(pytest.mark.skip(reason=nvrtc_unavailable()))
