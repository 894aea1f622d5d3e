"""Tests of scripts/same_cubins.py (NVRTC, no GPU): a tree compared with itself gives the same
kernels, and a tree whose kernels compute something else is told apart, naming the sections."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from scripts_loader import load_script

ROOT = Path(__file__).parents[1]


@pytest.mark.nvrtc
def test_a_changed_fold_is_told_apart_and_the_same_tree_is_the_same(tmp_path, monkeypatch, capsys):
    same_cubins = load_script("same_cubins")
    monkeypatch.setattr(same_cubins, "HEADLINE_LAUNCHES", {"qwen3.5-4b": ["4x8"]})
    for folder in ("replayssm_dsl", "lowering", "runtime"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    monkeypatch.setattr("sys.argv", ["same_cubins.py", str(tmp_path), str(ROOT)])
    assert same_cubins.main() == 0
    assert "1 of 1 programs give the same kernels" in capsys.readouterr().out
    blocks = tmp_path / "lowering" / "render_blocks.py"
    text = blocks.read_text()
    old = "sh_key[x] *= {factor};"
    assert old in text
    blocks.write_text(text.replace(old, "sh_key[x] *= 1.0001f * {factor};"))
    assert same_cubins.main() == 1
    out = capsys.readouterr().out
    assert ".text.flush" in out and ".text.replay_step" in out and "0 of 1 programs give the same kernels" in out
