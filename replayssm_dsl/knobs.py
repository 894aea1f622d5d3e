"""DSL layer: every environment knob of the project, declared once, typed.

- ``REPLAYSSM_DUMP_DIR``: when set, each compiled module's CUDA source (``<name>-<hash>.cu``) and its
  ptxas report are written there.
- ``REPLAYSSM_ARCH``: the GPU architecture NVRTC compiles for when no GPU says otherwise (``sm_90``).
"""

from __future__ import annotations

import os
from pathlib import Path


def dump_dir() -> Path | None:
    value = os.environ.get("REPLAYSSM_DUMP_DIR", "").strip()
    return Path(value) if value else None


def arch() -> str:
    return os.environ.get("REPLAYSSM_ARCH", "sm_90").strip() or "sm_90"
