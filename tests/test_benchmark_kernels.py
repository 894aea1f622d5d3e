"""Runtime layer, no GPU: ``replayssm bench --kernels`` (a subset of the timed kernels) and the table it
prints for the rows it has."""

from __future__ import annotations

import math

import numpy as np
import pytest

from replayssm_dsl.runtime import cli
from replayssm_dsl.runtime.benchmark import COLUMNS, KERNELS, markdown, parse_kernels


def test_default_kernels_are_all_of_them():
    args = cli.build_parser().parse_args(["bench"])
    assert parse_kernels(args.kernels) == KERNELS


def test_an_unknown_kernel_is_named_before_any_gpu_work(capsys):
    assert cli.main(["bench", "--kernels", "verify,replya"]) == 2
    err = capsys.readouterr().err
    assert "--kernels: replya not among" in err and "verify" in err


def test_nothing_to_time_is_refused():
    with pytest.raises(Exception, match="--kernels: nothing"):
        parse_kernels(",")


def test_table_of_a_subset_leaves_what_was_not_timed_out():
    rng = np.random.default_rng()
    row = {"preset": "qwen3.5-4b", "variant": "gdn", "B": 256, "launch": "ver 8x16; ver4 4x8/r80; conv 4x16",
           "conventional_step": float(rng.uniform(0.1, 1)), "verify_T2": 0.1, "verify_T4": 0.2,
           "verify_T8": float(rng.uniform(0.1, 1))}
    line = next(x for x in markdown([row]).splitlines() if x.startswith("| 256 "))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[COLUMNS.index(("replay", "replay_step", "{:.3f}"))] == "n/a"
    ratios = cells[len(COLUMNS):]
    assert float(ratios[4]) == pytest.approx(row["verify_T8"] / row["conventional_step"], abs=6e-3)
    assert all(math.isnan(float(x)) for i, x in enumerate(ratios) if i != 4)


def test_no_plot_without_both_steps(tmp_path):
    from replayssm_dsl.runtime.benchmark import plot
    row = {"preset": "qwen3.5-4b", "variant": "gdn", "B": 256, "conventional_step": 0.27, "verify_T8": 0.36}
    assert plot([row], tmp_path / "speedup.png") is False
    assert not (tmp_path / "speedup.png").exists()
