"""Tests of scripts/experiment_pdl.py (no GPU): its edit, the wait before the first token read with the
token prefetches dropped, applies to both step kernels of every preset at its launch shapes and builds
them clean; it refuses a kernel without the marker."""

from __future__ import annotations

import pytest

from replayssm_dsl import ReplayConfig, variants
from replayssm_dsl.config import DESIGN_PRESETS, preset
from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.lowering.lower import lower

from scripts_loader import load_script

SCRIPT = load_script("experiment_pdl")
VARIANTS = load_script("experiment_variants")


def _kernel_text(source: str, name: str) -> str:
    start = source.index(f") {name}(")
    end = source.find('extern "C" __global__', start)
    return source[start:end if end >= 0 else len(source)]


@pytest.mark.nvrtc
@pytest.mark.parametrize("edit", sorted(SCRIPT.PDL_EDITS | SCRIPT.BOUNDS))
@pytest.mark.parametrize("preset_name", sorted(DESIGN_PRESETS))
def test_the_wait_goes_before_every_token_read_and_builds_clean(preset_name, edit):
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    p = preset(preset_name)
    program = lower(variants.get(p.variant), p.shape, ReplayConfig())
    labels = {*zip(SCRIPT.STEP_KERNELS, SCRIPT.B1_LAUNCHES[preset_name])}
    if edit not in SCRIPT.BOUNDS:  # the bounds are for B = 1 (at nano's B = 256 launch the one there spills 4 bytes)
        labels |= {*zip(SCRIPT.STEP_KERNELS, SCRIPT.LAUNCHES[preset_name])}
    for kernel, label in sorted(labels):
        launch = LaunchConfig.from_label(label)
        source = VARIANTS.patched_renderer((SCRIPT.PDL_EDITS | SCRIPT.BOUNDS)[edit])(program, launch)
        text = _kernel_text(source, kernel)
        assert text.count("griddepcontrol.wait") == 1
        wait = text.index("griddepcontrol.wait")
        body = text.index("{\n")  # past the parameter list, whose names start with tok_
        assert wait < text.index("tok_", body), f"{kernel}: a token is read before the wait"
        result = compile_cubin(source, f"pdl-{preset_name}.cu")
        unused = [w for w in result.warnings if "was set but never used" in w]
        assert len(result.warnings) == (len(unused) if edit in SCRIPT.BOUNDS else 0), result.log  # a bound leaves fields unread
        res = result.resources[kernel]
        assert res.clean and res.registers <= launch.max_registers, f"{preset_name} {kernel} {label}: {res}"


def test_the_prefetches_are_dropped_or_follow_the_wait():
    p = preset("kimi-linear")
    program = lower(variants.get(p.variant), p.shape, ReplayConfig())
    launch = LaunchConfig.from_label(SCRIPT.LAUNCHES["kimi-linear"][0])
    unedited = _kernel_text(VARIANTS.patched_renderer([])(program, launch), "replay_step")
    dropped = _kernel_text(VARIANTS.patched_renderer(SCRIPT.PDL_EDITS["wait before tokens"])(program, launch), "replay_step")
    moved = _kernel_text(VARIANTS.patched_renderer(SCRIPT.PDL_EDITS["wait after rows issued"])(program, launch), "replay_step")
    assert unedited.count("prefetch_l1(tok_") == 5 and "prefetch_l1(tok_" not in dropped
    assert moved.count("prefetch_l1(tok_") == 5 and moved.index("griddepcontrol.wait") < moved.index("prefetch_l1(tok_")
    assert moved.index("griddepcontrol.wait") < moved.index("arrival holds the fill"), "before the fill's barrier"
    assert dropped.index("arrival holds the fill") < dropped.index("griddepcontrol.wait"), "after it"


def test_the_edit_refuses_a_kernel_without_its_marker():
    with pytest.raises(SystemExit, match="PDL edit does not apply"):
        SCRIPT.PDL_EDIT[0]("extern \"C\" __global__ void __launch_bounds__(128) replay_step(float* x) {\n}\n")
