"""The autotuner's table (no GPU needed to read and key it): one entry per program, batch size and
kernel group, so the conventional baselines get their own launch shape."""

from __future__ import annotations

import json

import pytest

from replayssm_dsl import ReplayConfig, variants
from replayssm_dsl.config import PRESETS
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.runtime import autotune


@pytest.fixture
def program():
    return lower(variants.get("gdn"), PRESETS["qwen3.5-4b"].shape, ReplayConfig())


def test_groups_of_kernels(program):
    assert {autotune.group_of(k.name) for k in program.kernels} == set(autotune.GROUPS)
    assert [k.name for k in program.kernels if autotune.group_of(k.name) == "conventional"] == \
        ["conventional_step", "snapshot_verify"]
    assert [k.name for k in program.kernels if autotune.group_of(k.name) == "verify"] == ["flush_for_verify", "verify"]


def test_lookup_reads_each_group_and_batch_separately(program, tmp_path, monkeypatch):
    table = tmp_path / "autotune.json"
    monkeypatch.setenv("REPLAYSSM_AUTOTUNE_CACHE", str(table))
    entries = {autotune.table_key(program, 256): {"launch": {"warps": 4, "rows_per_warp": 16, "max_registers": 128}},
               autotune.table_key(program, 256, "conventional"): {"launch": {"warps": 4, "rows_per_warp": 8}},
               autotune.table_key(program, 32): {"launch": {"warps": 8, "rows_per_warp": 4, "max_registers": 64}}}
    table.write_text(json.dumps(entries))
    assert autotune.lookup(program, 256) == LaunchConfig(4, 16)
    assert autotune.lookup(program, 256, "conventional") == LaunchConfig(4, 8)
    assert autotune.lookup(program, 32) == LaunchConfig(8, 4, max_registers=64)
    assert autotune.lookup(program, 32, "conventional") is None
    assert autotune.lookup(program, 8) is None
    other = lower(variants.get("gdn"), PRESETS["qwen3.5-4b"].shape, ReplayConfig(window=8))
    assert autotune.lookup(other, 256) is None, "the key names the replay settings"


def test_a_missing_or_broken_table_means_no_entry(program, tmp_path, monkeypatch):
    monkeypatch.setenv("REPLAYSSM_AUTOTUNE_CACHE", str(tmp_path / "absent.json"))
    assert autotune.lookup(program, 256) is None
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    monkeypatch.setenv("REPLAYSSM_AUTOTUNE_CACHE", str(broken))
    assert autotune.lookup(program, 256) is None
