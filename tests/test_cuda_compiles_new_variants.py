"""Lowering tests (NVRTC, no GPU): declarations that combine features no built-in combines
(``new_variants``) compile for sm_90 with no warning and no spill at the launches the CUDA cache takes.

A bounded vector decay with a plain write once left verify and the replay step a key (``ke``) that
nothing read: NVRTC warned. A vector decay with the delta rule, a skip and a gate passes 48 KiB of
static shared memory at verify's default launch for a large batch; the next shape builds clean.

May import: pytest, ``replayssm_dsl``, ``replayssm_dsl.lowering``, ``replayssm_dsl.runtime.nvrtc_compile``.
"""

from __future__ import annotations

import pytest

from codegen_cases import KERNELS
from new_variants import NEW_COMBINATIONS, declare_combination
from replayssm_dsl import ModelShape, ReplayConfig
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.launch import choose_launch, fallback_launches
from replayssm_dsl.lowering.render_cuda import render_program


# (id, family, batch) -> the launch the CUDA cache takes where ``choose_launch``'s passes 48 KiB of
# static shared memory: verify's whole head per CTA (8x16) holds a vector decay's and a delta rule's
# per-draft fields and the skip's and gate's row inputs
FALLS_BACK = {("kda-skip-gate", "verify", 256): "4x16"}


@pytest.mark.nvrtc
@pytest.mark.parametrize("batch", [1, 256])
@pytest.mark.parametrize("family", ["replay", "verify", "conventional"])
@pytest.mark.parametrize("combination", sorted(NEW_COMBINATIONS))
def test_a_new_combination_compiles_clean(combination, family, batch):
    """Each family's kernels at its default launch (``choose_launch``) for 32,16,128,128: clean, or,
    where ``FALLS_BACK`` says, too much shared data there and clean at the next of
    ``fallback_launches``, which the CUDA cache then takes."""
    from replayssm_dsl.runtime.autotune import group_kernels
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    shape, config = ModelShape(32, 16, 128, 128), ReplayConfig()
    program = lower(declare_combination(*NEW_COMBINATIONS[combination]), shape, config)
    launches, kernels = fallback_launches(shape, batch, family, config), group_kernels(program, family)
    assert launches[0] == choose_launch(shape, batch, family, config)
    expected = FALLS_BACK.get((combination, family, batch))
    if expected:
        with pytest.raises(RuntimeError, match="too much shared data"):
            compile_cubin(render_program(program, launches[0], kernels), f"{combination}-{family}.cu", "sm_90")
        assert launches[1].label == expected
    launch = launches[1] if expected else launches[0]
    result = compile_cubin(render_program(program, launch, kernels), f"{combination}-{family}.cu", "sm_90")
    assert sorted(result.resources) == sorted(kernels), result.log
    assert not result.warnings, result.log
    for name, res in result.resources.items():
        assert res.clean, f"{name} at {launch.label}: {res} (ptxas report:\n{result.log})"
