"""Generated CUDA without a GPU: every kernel of every built-in, at the default launches and at the
autotuner's options, compiles with NVRTC for sm_90 with no spills and no local memory, and ptxas
reports on every compile."""

from __future__ import annotations

import pytest

from codegen_cases import CASES, KERNELS, SHAPES, SHARED_ROW_LAUNCHES, source
from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.launch import LaunchConfig, choose_launch
from replayssm_dsl.lowering.render_cuda import render_program


@pytest.mark.nvrtc
@pytest.mark.parametrize("batch", [1, 256], ids=["small-batch-launch", "large-batch-launch"])
@pytest.mark.parametrize("variant,shape", CASES)
def test_every_kernel_compiles_for_sm90_without_spills(variant, shape, batch):
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    result = compile_cubin(source(variant, shape, batch=batch), f"{variant}-{shape}.cu", "sm_90")
    assert sorted(result.resources) == sorted(KERNELS), result.log
    assert not result.warnings, result.log
    for name, res in result.resources.items():
        assert res.clean, f"{name}: {res} (ptxas report:\n{result.log})"
        assert res.registers <= 128, f"{name}: {res.registers} registers"


@pytest.mark.nvrtc
@pytest.mark.parametrize("variant,shape", CASES)
def test_verify_family_default_launch_compiles_without_spills(variant, shape):
    """The untuned default of the verify family at a large batch (a whole head per CTA on tensor cores,
    where they apply) builds clean: its kernels are what a cache without a tuner's entry runs."""
    from replayssm_dsl.runtime.autotune import group_kernels
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    program = lower(variants.get(variant), SHAPES[shape], ReplayConfig())
    launch = choose_launch(SHAPES[shape], 256, "verify", program.config)
    result = compile_cubin(render_program(program, launch, group_kernels(program, "verify")), f"{variant}-{shape}.cu")
    assert result.resources and not result.warnings, result.log
    for name, res in result.resources.items():
        assert res.clean, f"{launch.label} {name}: {res} (ptxas report:\n{result.log})"


# Group options that may spill for a built-in shape (verify's 8x8/r64/p4: 16 B for KDA's decay vector,
# as 8x8/r64 itself spills, and 4 B for Mamba-2 at V = 80; the replay step's 4x20/r96/s10: 4 B for GDN;
# 8x16/r80/s8: 48 B for GDN and KDA, 16 B for Mamba-2 at V = 80; 8x12/r80/s4 and 8x16/r80/s10: 4 B for
# Mamba-2 at V = 80; 4x20/r96/s10: 4 B for KDA; with the write records in registers, 8x16/r80/s10/w: 8 B
# for GDN, 16 B for Mamba-2, 8x16/r80/s11/w: 8 B for Mamba-2, and 4x16/r96/s8/w: 4 B for Mamba-2; verify
# under a register cap with shared fragments, 4x16/r96/f2: 8 B for GDN, 12 B for Mamba-2 at V = 80, 20 B
# for KDA; 4x16/r96/f4 and 5x16/r96/f4: 20 B for KDA; 8x16/r80/f6: 8 B for Mamba-2, 32 B for KDA;
# 8x16/r80/f7: 4 B for GDN, 24 B for Mamba-2, 16 B for KDA; the token's row fields in registers,
# 8x16/r80/s12/w/v: 16 B for Mamba-2, whose three fields take 3 registers; 8x16/r80/s10/w: 8 B for KDA
# since its sh_ed lies in sh_q, where /s11/w builds clean): where they do, the tuner's group_spills
# rules them out for that group.
OPTIONS_THAT_MAY_SPILL = {("kda", "8x8/r64/p4"), ("mamba2", "8x8/r64/p4"), ("gdn", "4x20/r96/s10"),
                          ("gdn", "8x16/r80/s8"), ("kda", "8x16/r80/s8"), ("mamba2", "8x16/r80/s8"), ("mamba2", "8x12/r80/s4"),
                          ("mamba2", "8x16/r80/s10"), ("kda", "4x20/r96/s10"), ("gdn", "8x16/r80/s10/w"),
                          ("mamba2", "8x16/r80/s10/w"), ("mamba2", "8x16/r80/s11/w"), ("mamba2", "4x16/r96/s8/w"),
                          ("gdn", "4x16/r96/f2"), ("mamba2", "4x16/r96/f2"), ("kda", "4x16/r96/f2"), ("kda", "4x16/r96/f4"),
                          ("kda", "5x16/r96/f4"), ("mamba2", "8x16/r80/f6"), ("kda", "8x16/r80/f6"), ("gdn", "8x16/r80/f7"),
                          ("mamba2", "8x16/r80/f7"), ("kda", "8x16/r80/f7"), ("mamba2", "8x16/r80/s12/w/v"),
                          ("kda", "8x16/r80/s10/w")}


@pytest.mark.nvrtc
@pytest.mark.parametrize("variant,shape", [("gdn", "qwen3.5-4b"), ("mamba2", "nemotron-nano-4b"), ("kda", "kimi-linear")])
def test_group_options_compile_without_spills(variant, shape):
    """The autotuner's group options render code the default launch never compiles (the step's eager
    record staging and shared rows, verify's rows in one pass or in passes of 4): each group's module
    (its own kernels, as the runtime compiles it) builds clean for the built-in shapes, where it builds
    at all (shared memory), but for ``OPTIONS_THAT_MAY_SPILL``."""
    from replayssm_dsl.runtime.autotune import GROUP_EXTRAS, group_kernels
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    program = lower(variants.get(variant), SHAPES[shape], ReplayConfig())
    built = 0
    for group in ("replay", "verify"):
        for launch in GROUP_EXTRAS[group]:
            src = render_program(program, launch, kernels=group_kernels(program, group))
            assert f"#define EAGER_RECORDS {int(launch.eager_records)}" in src
            assert f"#define VPASS {launch.verify_rows}" in src
            assert f"#define SRPW {launch.shared_rows}" in src and f"#define RREG {launch.register_rows}" in src
            try:
                result = compile_cubin(src, f"{variant}-{launch.label.replace('/', '-')}.cu")
            except RuntimeError as exc:
                assert "too much shared data" in str(exc), exc
                continue
            built += 1
            assert sorted(result.resources) == sorted(group_kernels(program, group))
            assert not result.warnings, result.log
            if (variant, launch.label) in OPTIONS_THAT_MAY_SPILL:  # where they spill, the tuner skips them
                continue
            for name, res in result.resources.items():
                assert res.clean, f"{launch.label} {name}: {res}"
    assert built >= 5


# The verify launches the tuner picks on tensor cores (benchmarks/results): their twins with the scores
# on CUDA cores, which verify of few drafts times when they are among its first pass's finalists.
TUNED_TENSOR_CORE_VERIFY = ("8x16", "4x16", "5x16", "5x16/r96/f4", "4x16/r96/f4", "8x16/r80/f6")
TWINS_THAT_MAY_SPILL = {("gdn", "8x16/r80/f6")}  # 4 B (its shape without /c builds clean)


@pytest.mark.nvrtc
@pytest.mark.parametrize("variant,shape", [("gdn", "qwen3.5-4b"), ("mamba2", "nemotron-nano-4b"), ("kda_safe_gate", "kimi-linear")])
def test_verify_with_its_scores_on_cuda_cores_compiles_without_spills(variant, shape):
    """``/c`` (``score_twins``): verify's module at each tuned tensor-core shape, its scores on CUDA
    cores, builds clean with no spills where the shape without ``/c`` does, but for
    ``TWINS_THAT_MAY_SPILL`` (the tuner skips a twin that spills, as any candidate), and is another
    kernel than without it."""
    from replayssm_dsl.runtime.autotune import group_kernels
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    program = lower(variants.get(variant), SHAPES[shape], ReplayConfig())
    kernels = group_kernels(program, "verify")
    for label in TUNED_TENSOR_CORE_VERIFY:
        base, twin = LaunchConfig.from_label(label), LaunchConfig.from_label(label + "/c")
        base_src, src = (render_program(program, launch, kernels=kernels) for launch in (base, twin))
        assert src != base_src and "mma_3xtf32_floats(c, lo.x" not in src, label
        if not all(res.clean for res in compile_cubin(base_src, f"{variant}-{label.replace('/', '-')}.cu").resources.values()):
            continue  # the shape spills without /c too: the tuner skips both
        result = compile_cubin(src, f"{variant}-{twin.label.replace('/', '-')}.cu")
        assert not result.warnings, result.log
        assert (variant, label) in TWINS_THAT_MAY_SPILL or all(res.clean for res in result.resources.values()), \
            f"{twin.label}: {result.resources} (ptxas report:\n{result.log})"


@pytest.mark.nvrtc
def test_a_source_compiled_again_still_gets_its_ptxas_report():
    """Where a CUDA driver is installed NVRTC may take the cubin from its cache and skip ptxas (and its
    report); ``compile_cubin`` compiles with ``--no-cache``, so a second compile reports too."""
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    src = source("gdn", "odd-grouped")
    first, second = compile_cubin(src), compile_cubin(src)
    assert sorted(first.resources) == sorted(second.resources) == sorted(KERNELS)
    assert first.resources == second.resources and first.cubin == second.cubin


@pytest.mark.nvrtc
@pytest.mark.parametrize("state_dtype", ["float16", "bfloat16"])
def test_half_precision_checkpoints_compile(state_dtype):
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    result = compile_cubin(source("gdn", "qwen3.5-4b", ReplayConfig(state_dtype=state_dtype)))
    assert all(r.clean for r in result.resources.values()) and not result.warnings, result.log


@pytest.mark.nvrtc
def test_emitted_per_kernel_sources_each_compile_alone(tmp_path):
    from replayssm_dsl.runtime.cli import main
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    assert main(["emit", "kda", "--preset", "kimi-linear", "-o", str(tmp_path)]) == 0
    files = sorted(tmp_path.glob("kda-kimi-linear-*.cu"))
    assert len(files) == len(KERNELS)
    for path in files:
        result = compile_cubin(path.read_text(), path.name)
        assert list(result.resources) == [path.stem.split("kimi-linear-")[1]] and not result.warnings, result.log


@pytest.mark.nvrtc
@pytest.mark.parametrize("variant,v_dim,launch", [("gdn", 65, LaunchConfig(1, 40)), ("gdn", 66, LaunchConfig(1, 66)),
                                                  ("mamba2", 65, LaunchConfig(2, 33))],
                         ids=["gdn-V65-1x40", "gdn-V66-1x66", "mamba2-V65-2x33"])
def test_more_write_chunks_per_record_than_threads_compile(variant, v_dim, launch):
    """Past 32·W_VEC rows per warp a write record has more chunks than the CTA has threads
    (``stage_writes`` then gives each thread several chunks of every record): such launches, far from
    any the tuner times, still build (spills allowed)."""
    from replayssm_dsl.lowering.launch import write_record_layout
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    shape = ModelShape(4, 2, v_dim, 64)
    w_vec, _ = write_record_layout(launch.rows_per_warp, launch.rows_per_cta, v_dim)
    assert launch.rows_per_cta // w_vec > launch.threads
    result = compile_cubin(render_program(lower(variants.get(variant), shape, ReplayConfig()), launch))
    assert "replay_step" in result.resources and "verify" in result.resources and not result.warnings, result.log


@pytest.mark.nvrtc
@pytest.mark.parametrize("launch", SHARED_ROW_LAUNCHES + [LaunchConfig(4, 16, max_registers=96, shared_rows=8, register_writes=True)],
                         ids=lambda c: c.label)
@pytest.mark.parametrize("variant", ["gdn", "kda", "mamba2"])
def test_shared_rows_compile_at_a_partial_tile(variant, launch):
    """V = 60 and K = 64: the last tile's bulk copies stop at V inside a warp's shared rows; the replay
    group's kernels build (spills allowed at this shape, where the tuner would skip a launch that
    spills; the built-in shapes build clean: ``test_group_options_compile_without_spills``)."""
    from replayssm_dsl.runtime.autotune import group_kernels
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    program = lower(variants.get(variant), ModelShape(4, 2, 60, 64), ReplayConfig(window=4, max_drafts=3))
    result = compile_cubin(render_program(program, launch, kernels=group_kernels(program, "replay")), "shared-rows.cu", "sm_90")
    assert sorted(result.resources) == sorted(group_kernels(program, "replay")) and not result.warnings, result.log


# verify's spill at K = 144, 8x8, in bytes, where it has one: GLA's 4 (clean at 8x4 and 4x4, which
# the CUDA cache then takes, see ``_fitting_launch``), the safe gate's scaled keys 32 at every shape
VERIFY_SPILLS_PAST_K128 = {"gla": 4, "kda_safe_gate": 32}


@pytest.mark.nvrtc
@pytest.mark.parametrize("variant", sorted(variants.BUILTINS))
def test_default_launches_past_k_128_compile_without_spills(variant):
    """At K = 144 a lane holds two pieces of each row along K: ``choose_launch`` gives a warp half the
    rows (``4x8`` for the steps, ``8x8`` for verify on tensor cores at a large batch, ``4x4`` for few
    rows), where the 16-row shapes of K <= 128 spill 50–700 bytes, and each family builds clean there
    (verify of two built-ins aside: ``VERIFY_SPILLS_PAST_K128``, no more than that)."""
    from replayssm_dsl.runtime.autotune import group_kernels
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    shape, config = ModelShape(32, 16, 128, 144), ReplayConfig()
    program = lower(variants.get(variant), shape, config)
    expected = {("replay", 256): "4x8", ("verify", 256): "8x8", ("replay", 1): "4x4"}
    for (family, batch), label in expected.items():
        launch = choose_launch(shape, batch, family, config)
        assert launch.label == label, (family, batch, launch.label)
        result = compile_cubin(render_program(program, launch, group_kernels(program, family)),
                               f"{variant}-K144-{family}-{label}.cu")
        assert result.resources and not result.warnings, result.log
        for name, res in result.resources.items():
            allowed = VERIFY_SPILLS_PAST_K128.get(variant, 0) if name == "verify" else 0
            assert res.spill_stores <= allowed and res.spill_loads <= allowed, f"{family} at {label}: {name}: {res}"
            assert res.clean or allowed, f"{family} at {label}: {name}: {res}"
