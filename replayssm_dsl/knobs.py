"""DSL layer: every environment knob of the project, declared once, typed.

- ``REPLAYSSM_DUMP_DIR``: when set, the CUDA source of every module the runtime builds is written
  there as ``<declaration>-<sha256 prefix>.cu``.
- ``REPLAYSSM_ARCH``: the GPU architecture NVRTC compiles for when no GPU says otherwise (``sm_90``).
- ``REPLAYSSM_AUTOTUNE_CACHE``: where tuned launch shapes are kept (see ``runtime/autotune.py``).
- ``REPLAYSSM_COMPILE_WORKERS``: how many threads compile the autotuner's candidates at once
  (``runtime/parallel_compile.py``; default: the CPUs this process may use, at most
  ``DEFAULT_COMPILE_WORKERS_MAX``, since each NVRTC compile holds a few hundred MB; 0 or 1: one by one
  as they load).
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError


def dump_dir() -> Path | None:
    value = os.environ.get("REPLAYSSM_DUMP_DIR", "").strip()
    return Path(value) if value else None


def arch() -> str:
    return os.environ.get("REPLAYSSM_ARCH", "sm_90").strip() or "sm_90"


def autotune_cache() -> Path:
    """``REPLAYSSM_AUTOTUNE_CACHE``: the JSON table of tuned launch shapes
    (default ``~/.cache/replayssm/autotune.json``)."""
    value = os.environ.get("REPLAYSSM_AUTOTUNE_CACHE", "").strip()
    return Path(value) if value else Path.home() / ".cache" / "replayssm" / "autotune.json"


DEFAULT_COMPILE_WORKERS_MAX = 16


def compile_workers() -> int:
    """``REPLAYSSM_COMPILE_WORKERS``: threads that compile modules at once (default: the CPUs this
    process may use, at most ``DEFAULT_COMPILE_WORKERS_MAX``)."""
    value = os.environ.get("REPLAYSSM_COMPILE_WORKERS", "").strip()
    if not value:
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return min(usable, DEFAULT_COMPILE_WORKERS_MAX)
    try:
        workers = int(value)
    except ValueError:
        raise ConfigError(f"REPLAYSSM_COMPILE_WORKERS: expected a whole number of threads, got {value!r}") from None
    if workers < 0:
        raise ConfigError(f"REPLAYSSM_COMPILE_WORKERS: expected 0 or more threads, got {workers}")
    return workers
