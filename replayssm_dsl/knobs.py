"""DSL layer: every environment knob of the project, declared once, typed.

- ``REPLAYSSM_DUMP_DIR``: when set, the CUDA source of every module the runtime builds is written
  there as ``<declaration>-<sha256 prefix>.cu``.
- ``REPLAYSSM_ARCH``: the GPU architecture NVRTC compiles for when no GPU says otherwise (``sm_90``).
- ``REPLAYSSM_AUTOTUNE_CACHE``: where tuned launch shapes are kept (see ``runtime/autotune.py``).
"""

from __future__ import annotations

import os
from pathlib import Path


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
