"""Tests of scripts/variant_tests.py (no GPU): its renderer applies a variant's edits where they apply,
renders the unedited source elsewhere, and counts both, so a GPU run with a variant that edited
nothing is seen as such."""

from __future__ import annotations

from replayssm_dsl import ReplayConfig, variants
from replayssm_dsl.config import preset
from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.lowering.lower import lower

from scripts_loader import load_script

SCRIPT = load_script("variant_tests")
LABEL = "fold writes from shared"  # a KDA variant: the GDN kernels have no decay vectors' sh_G to reuse


def _program(name):
    p = preset(name)
    return lower(variants.get(p.variant), p.shape, ReplayConfig())


def test_the_variant_edits_the_modules_it_applies_to_and_counts_the_rest():
    counts = {"edited": 0, "unedited": 0}
    render = SCRIPT.edited_where_it_applies(SCRIPT.experiment_variants.VARIANTS[LABEL], counts)
    plain = SCRIPT.experiment_variants.patched_renderer([])
    launch = LaunchConfig.from_label("8x16/r80/s12/w/v")
    kda = render(_program("kimi-linear"), launch)
    assert "sh_wf[m * BV" in kda and kda != plain(_program("kimi-linear"), launch)
    gdn = render(_program("qwen3.5-4b"), launch)
    assert gdn == plain(_program("qwen3.5-4b"), launch)
    assert counts == {"edited": 1, "unedited": 1}


def test_an_unknown_variant_is_refused_with_the_list():
    assert SCRIPT.main(["no such variant"]) == 2
