"""Runtime layer: ``replayssm check`` at the configurations its options allow (half-precision
checkpoints, few drafts) and its usage errors (no GPU: the CPU backend)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.runtime import cli
from replayssm_dsl.runtime.selfcheck import STATE_DTYPE_TOLERANCE, decode_and_compare, tolerance


@pytest.mark.parametrize("state_dtype", ["float16", "bfloat16"])
def test_check_holds_half_precision_checkpoints_to_their_own_tolerance(state_dtype, capsys):
    status = cli.main(["check", "kda", "--backend", "cpu", "--steps", "40", "--state-dtype", state_dtype])
    text = capsys.readouterr().out
    assert status == 0, text
    assert f"{state_dtype} checkpoints" in text
    assert f"tolerance {STATE_DTYPE_TOLERANCE[state_dtype]:g}" in text


def test_report_judges_by_the_checkpoint_dtype():
    shape = ModelShape(2, 1, 16, 16)
    report = decode_and_compare(variants.get("gdn"), shape, ReplayConfig(window=4, max_drafts=4, state_dtype="bfloat16"),
                                backend="cpu", tokens=20, seed=3)
    assert 0 < report.worst <= tolerance(report.config)  # rounded checkpoints: some error, within bf16's bound
    assert report.ok and report.tolerance == STATE_DTYPE_TOLERANCE["bfloat16"]
    report.worst = float("inf")  # a non-finite output scores inf: never ok
    assert not report.ok


@pytest.mark.parametrize("max_drafts", [1, 2, 3])
def test_check_drafts_no_more_than_the_configuration_allows(max_drafts, capsys):
    status = cli.main(["check", "gdn", "--backend", "cpu", "--steps", "30", "--max-drafts", str(max_drafts)])
    text = capsys.readouterr().out
    assert status == 0, text
    assert "(ok," in text


@pytest.mark.parametrize("shape,message", [
    ("4,2,64", "four whole numbers"),
    ("4,2,64,x", "four whole numbers"),
    ("4,0,64,64", "key_heads: must be a positive int, got 0"),
    ("3,2,64,64", "does not divide"),
])
def test_a_bad_shape_is_a_usage_error_naming_the_option(shape, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["check", "gdn", "--backend", "cpu", "--shape", shape])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --shape" in err and message in err


def test_a_reader_that_leaves_early_gets_no_traceback():
    """``replayssm traffic ... | head``: the pipe's reader gone before the output is written."""
    child = subprocess.Popen([sys.executable, "-m", "replayssm_dsl.runtime.cli", "traffic", "--preset", "kimi-linear"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()  # long before the child has imported the package and printed
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
