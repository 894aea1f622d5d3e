"""Generated CUDA without a GPU: every kernel of every built-in compiles with NVRTC for sm_90 with no
spills and no local memory; the source is deterministic and matches the golden files.

Golden files live in ``tests/golden/``; after an intended codegen change, regenerate them with
``REPLAYSSM_UPDATE_GOLDEN=1 pytest tests/test_cuda_codegen.py`` and review the diff.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.config import DESIGN_PRESETS, PRESETS
from replayssm_dsl.errors import LoweringError
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.launch import LaunchConfig, choose_launch
from replayssm_dsl.lowering.render_blocks import hoistable_inputs
from replayssm_dsl.lowering.render_cuda import render_program
from replayssm_dsl.lowering.record_keys import key_shift
from replayssm_dsl.lowering.render_replay import dynamic_shared_bytes

GOLDEN = Path(__file__).with_name("golden")
SHAPES = {name: PRESETS[name].shape for name in DESIGN_PRESETS}  # (the safe-gate preset: Kimi's shape again)
SHAPES["odd-grouped"] = ModelShape(6, 2, 80, 96)
SHAPES["odd-unaligned"] = ModelShape(3, 1, 60, 100)
CASES = [(v, s) for v in sorted(variants.BUILTINS) for s in SHAPES]
KERNELS = ["conventional_step", "snapshot_verify", "replay_step", "flush_for_verify", "verify",
           "commit", "flush", "load", "reset_fill", "materialize"]


def source(variant: str, shape: str, config=None, batch: int = 1) -> str:
    return render_program(lower(variants.get(variant), SHAPES[shape], config or ReplayConfig()),
                          choose_launch(SHAPES[shape], batch))


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


@pytest.mark.parametrize("preset,label", [("qwen3.5-4b", "8x16"), ("nemotron-nano-4b", "5x16"),
                                          ("nemotron-super-120b", "4x16"), ("kimi-linear", "8x16")])
def test_untuned_verify_takes_a_whole_head_per_cta_in_16_row_tiles(preset, label):
    shape = SHAPES[preset]
    assert choose_launch(shape, 256, "verify", ReplayConfig()).label == label
    assert choose_launch(shape, 256, "replay", ReplayConfig()) == choose_launch(shape, 256)  # the others' rule
    # off the tensor cores (a half-precision checkpoint): the others' rule
    assert choose_launch(shape, 256, "verify", ReplayConfig(state_dtype="bfloat16")) == choose_launch(shape, 256)


def test_untuned_verify_of_a_batch_under_two_ctas_per_sm_takes_16_row_ctas():
    shape = SHAPES["qwen3.5-4b"]  # 32 heads of 8 16-row tiles: 256 CTAs at B = 1, under 2 per SM
    assert choose_launch(shape, 1, "verify", ReplayConfig()).label == "4x4"


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


def test_source_is_deterministic_and_names_its_declaration():
    a, b = source("kda", "kimi-linear"), source("kda", "kimi-linear")
    assert a == b
    decl = variants.get("kda")
    assert a.startswith("// Generated by replayssm-dsl") and decl.fingerprint in a.splitlines()[1]
    for kernel in KERNELS:
        assert "void __launch_bounds__" in a and f" {kernel}(" in a


def kernel_body(text: str, kernel: str) -> str:
    """Kernel ``kernel``'s text, from its name to the next kernel (or the end)."""
    start = text.index(f" {kernel}(")
    end = text.find('extern "C"', start)
    return text[start:] if end < 0 else text[start:end]


@pytest.mark.parametrize("variant", sorted(variants.BUILTINS))
def test_every_token_kernel_prefetches_every_token_input_before_the_state_rows(variant):
    text = source(variant, "odd-grouped")
    tokens = [spec.name for spec in variants.get(variant).inputs if spec.kind == "token"]
    for kernel in ("conventional_step", "replay_step", "snapshot_verify", "verify"):  # (verify_few: a group, verify's kernels)
        body = kernel_body(text, kernel)
        first_row_load = min(body.index(mark) for mark in ("load_row(", "reinterpret_cast<const float4*>(checkpoint")
                             if mark in body)
        for name in tokens:  # asked of L1, or (verify's row inputs) copied to shared memory
            asked = [m.start() for m in re.finditer(rf"(prefetch_l1\(|stage_token_rows\(sh_\w+, )tok_{name} \+ ", body)]
            assert asked and asked[0] < first_row_load, (kernel, name)


def test_drafts_prefetch_spreads_each_drafts_lines_over_consecutive_lanes():
    capped = LaunchConfig(4, 8, max_registers=80)  # verify's SIMT rows: its row inputs are prefetched, not copied
    body = kernel_body(render_program(lower(variants.get("gdn"), SHAPES["odd-grouped"], ReplayConfig()), capped), "verify")
    prefetches = [line.strip() for line in body.splitlines() if "prefetch_l1(" in line]
    key = next(line for line in prefetches if "tok_k +" in line)
    assert "lane < t_tok * ((K + 31) / 32)" in key and "(b * t_tok + lane / ((K + 31) / 32))" in key
    assert "(lane % ((K + 31) / 32)) * 32" in key
    value = next(line for line in prefetches if "tok_v +" in line)
    assert "lane < t_tok * ((BV + 31) / 32)" in value and "v0 +" in value
    gate = next(line for line in prefetches if "tok_b +" in line)
    assert "lane < t_tok)" in gate and "(b * t_tok + lane)" in gate


@pytest.mark.parametrize("variant", sorted(variants.BUILTINS))
def test_verify_loads_each_warps_first_draft_before_the_state_rows(variant):
    """Verify on tensor cores: each warp's first draft's token inputs that its head-level fields read
    (over K: key, query, a decay vector; scalars: decay, strength), the head's parameters over K
    that the vector fields read and its scalar parameters that any of its fields read are loaded
    before the state rows; the fields take draft j = warp from those registers and read the
    parameters nowhere else. The steps, the snapshot baseline and
    verify's SIMT rows (under a register cap) hoist nothing."""
    decl = variants.get(variant)
    names = hoistable_inputs(decl)
    kinds = {(decl.input(n).kind, decl.input(n).size) for n in names}
    assert ("token", "K") in kinds, "every built-in reads a key and a query over K"
    text = source(variant, "odd-grouped")
    body = kernel_body(text, "verify")
    first_row_load = body.index("reinterpret_cast<const float4*>(checkpoint")
    for name in names:
        kind, size = decl.input(name).kind, decl.input(name).size
        if kind == "param":  # a scalar, or a vector over K (KDA's dt_bias)
            load = f"const float pre_{name} = par_{name}[(size_t)" if size == "" else f"pre_{name}[i] = (e < K) ? par_{name}["
            assert body.index(load) < first_row_load, name
            assert body.count(f"par_{name}[") == 1, f"{name} is read once, before the rows"
            assert (f" = pre_{name};" if size == "" else f"? pre_{name}[i] : 0.f;") in body, name
        elif size == "":
            assert body.index(f"const float pre_{name} = warp < t ? tok_{name}[((size_t)(b * t_tok + warp)") < first_row_load, name
            assert f"(j == warp ? pre_{name} : tok_{name}[((size_t)(b * t_tok + j)" in body, name
        else:
            assert body.index(f"pre_{name}[i] = (warp < t && e < K) ? tok_{name}[") < first_row_load, name
            assert f"(j == warp ? pre_{name}[i] : tok_{name}[" in body, name
    scalars = {s.name: s.kind for s in decl.inputs if s.size == ""}
    for name, kind in scalars.items():  # one not hoisted is one verify does not read
        if name not in names:
            assert (f"par_{name}[" if kind == "param" else f"tok_{name}[") not in body, name
    for kernel in ("conventional_step", "replay_step", "snapshot_verify"):
        assert "pre_" not in kernel_body(text, kernel), kernel
    capped = render_program(lower(variants.get(variant), SHAPES["odd-grouped"], ReplayConfig()),
                            LaunchConfig(4, 8, max_registers=80))
    assert "pre_" not in kernel_body(capped, "verify")


@pytest.mark.parametrize("variant", sorted(variants.BUILTINS))
def test_step_kernels_split_the_tokens_fields_across_warps(variant):
    text = source(variant, "odd-grouped")
    for kernel in ("conventional_step", "replay_step"):
        body = kernel_body(text, kernel)
        assert "for (int j = warp; j < t; j += WARPS)" not in body, kernel
        for warp, field in ((0, "query"), (1, "key"), (2, "")):  # warp 2: decay and strength, as declared
            assert f"if (warp == {warp} % WARPS) {{  // the one token's {field}" in body, (kernel, field)
    for kernel in ("snapshot_verify", "verify"):  # drafts: one warp per draft
        assert "for (int j = warp; j < t; j += WARPS)" in kernel_body(text, kernel)


@pytest.mark.parametrize("variant", sorted(variants.BUILTINS))
@pytest.mark.parametrize("batch", [1, 256], ids=["simt-verify", "tensor-core-verify"])
def test_only_delta_rules_score_records_against_the_tokens_key(variant, batch):
    """The scores against the token's key (``sk``) feed the delta rule's correction alone: a variant
    without one neither computes nor declares them, in the replay step or in verify (SIMT or tensor
    cores, by launch shape); a delta rule does both."""
    text = source(variant, "odd-grouped", batch=batch)
    for kernel in ("replay_step", "verify"):
        scores_key = re.search(r"\bsh_sk\b", kernel_body(text, kernel)) is not None
        assert scores_key == variants.get(variant).is_delta, kernel


@pytest.mark.parametrize("variant", sorted(variants.BUILTINS))
def test_verify_scores_its_own_records_per_trip(variant):
    """With a decay vector the replay step's score trips take 2 records (at 4 ptxas spills its capped
    shapes); verify's own constant takes 4, halving its trips and reductions, but under a register
    cap, where 4 spills verify, it stays 2. Without a decay vector both take 4. Each kernel's score
    loops name only its own constant (verify scores on SIMT lanes under a cap, with a decay vector
    of plain record keys or at ``/c``; on tensor cores otherwise: ``mma_scores``)."""
    vector = variants.get(variant).decay_form == "vector"
    program = lower(variants.get(variant), SHAPES["kimi-linear"], ReplayConfig())
    scaled = key_shift(program.declaration, program.config) is not None
    for launch, capped in ((LaunchConfig(4, 16), False), (LaunchConfig(8, 8), False), (LaunchConfig(4, 4), False),
                           (LaunchConfig(8, 8, 64), True), (LaunchConfig(4, 10, 96), True),
                           (LaunchConfig(8, 16, simt_scores=True), False)):
        text = render_program(program, launch)
        assert f"#define SCORE_RECORDS {2 if vector else 4}" in text, launch.label
        assert f"#define VERIFY_SCORE_RECORDS {2 if vector and capped else 4}" in text, launch.label
        replay, verify = kernel_body(text, "replay_step"), kernel_body(text, "verify")
        assert "for (int u = 0; u < SCORE_RECORDS; ++u)" in replay and "VERIFY_SCORE_RECORDS" not in replay
        assert re.search(r"(?<!VERIFY_)SCORE_RECORDS", verify) is None, launch.label
        simt_scores = (vector and not scaled) or capped or launch.simt_scores
        assert ("for (int u = 0; u < VERIFY_SCORE_RECORDS; ++u)" in verify) == simt_scores, launch.label
        assert ("mma_3xtf32_floats(c, lo.x" in verify) == (not simt_scores), launch.label


@pytest.mark.parametrize("variant,shape", [("gdn", "qwen3.5-4b"), ("mamba2", "nemotron-nano-4b"), ("kda", "kimi-linear")])
def test_golden_sources(variant, shape):
    path = GOLDEN / f"{variant}-{shape}.cu"
    text = source(variant, shape)
    if os.environ.get("REPLAYSSM_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with REPLAYSSM_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"generated source differs from {path}; review and regenerate"


def test_dump_directory_receives_the_source(tmp_path, monkeypatch):
    from replayssm_dsl.runtime.cuda_module import CompiledProgram
    monkeypatch.setenv("REPLAYSSM_DUMP_DIR", str(tmp_path / "dump"))
    compiled = CompiledProgram(lower(variants.get("gla"), SHAPES["odd-grouped"], ReplayConfig()))
    assert compiled.dumped is not None and compiled.dumped.read_text() == compiled.source
    assert compiled.dumped.name.startswith("gla-") and compiled.hash.startswith(compiled.dumped.stem.split("-")[1])


@pytest.mark.parametrize("label", ["4x4", "8x16", "8x16/r80/s10/w", "4x16/r96/s8"])
@pytest.mark.parametrize("variant,shape", [("kda", "kimi-linear"), ("mamba2", "nemotron-nano-4b")])
def test_every_kernel_that_declares_dynamic_shared_memory_launches_with_it(variant, shape, label):
    """The runtime's bytes of dynamic shared memory per kernel (``CompiledProgram.dynamic_shared``)
    are nonzero exactly where the kernel's source declares it: verify (its write records, NREC ·
    W_PITCH floats) at every launch, the replay step (WARPS · SRPW · K state elements) at shared-row
    launches; no GPU needed."""
    from replayssm_dsl.lowering.launch import write_record_layout
    from replayssm_dsl.lowering.render_cuda import render_kernel
    from replayssm_dsl.runtime.cuda_module import CompiledProgram
    program, launch = lower(variants.get(variant), SHAPES[shape], ReplayConfig()), LaunchConfig.from_label(label)
    compiled = CompiledProgram(program, launch)
    pitch = write_record_layout(launch.rows_per_warp, launch.rows_per_cta, program.shape.v_dim)[1]
    want = {"verify": (program.config.capacity + 1) * pitch * 4,
            "replay_step": launch.warps * launch.shared_rows * program.shape.k_dim * 4}
    for kernel in program.kernels:
        declares = "extern __shared__" in render_kernel(kernel, program, launch)
        assert compiled.dynamic_shared[kernel.name] == want.get(kernel.name, 0), kernel.name
        assert declares == bool(compiled.dynamic_shared[kernel.name]), kernel.name


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


SHARED_ROW_LAUNCHES = [LaunchConfig(4, 16, max_registers=96, shared_rows=8), LaunchConfig(4, 20, max_registers=96, shared_rows=10),
                       LaunchConfig(4, 10, max_registers=64, shared_rows=4)]


@pytest.mark.parametrize("launch", SHARED_ROW_LAUNCHES, ids=lambda c: c.label)
def test_shared_rows_change_the_replay_step_and_its_folds_alone(launch):
    """Shared rows are the replay step's (a bulk copy per warp on an mbarrier, waited for before the
    rows and before any early exit); the fold kernels of such a launch fold a few rows at a time;
    every other kernel renders as at the same launch without shared rows."""
    import dataclasses

    from replayssm_dsl.lowering.render_cuda import render_kernel
    program = lower(variants.get("gdn"), SHAPES["qwen3.5-4b"], ReplayConfig())
    plain = dataclasses.replace(launch, shared_rows=0)
    for kernel in program.kernels:
        with_rows, without = render_kernel(kernel, program, launch), render_kernel(kernel, program, plain)
        if kernel.name == "replay_step":
            assert with_rows.count("shared_rows_copy(") == 1 and "float s[RREG][KE];" in with_rows
            waits = with_rows.count("shared_rows_wait(")
            assert waits == 2, "one before the rows, one on the early exit of a corrupt fill"
            # the fused fold's last chunk of shared rows may reach past RPW (10 rows in chunks of 4)
            assert "(r0 + r < RPW ? wv[r0 + r] : 0.f)" in with_rows
        elif kernel.name in ("flush", "materialize"):
            assert "FOLD_ROWS" in with_rows and "FOLD_ROWS" not in without
        else:
            assert with_rows == without, kernel.name


@pytest.mark.parametrize("launch", [LaunchConfig(8, 16, max_registers=80, shared_rows=10, register_writes=True),
                                    LaunchConfig(4, 4, eager_records=True, register_writes=True)], ids=lambda c: c.label)
@pytest.mark.parametrize("variant", ["gdn", "kda"])
def test_register_writes_change_the_replay_step_alone(variant, launch):
    """``/w``: the replay step loads its write records into registers as soon as the fill is known (no
    ``sh_w``; with eager records every record, then the lanes past the fill cleared); every other
    kernel, verify included, renders as at the same launch without it."""
    import dataclasses

    from replayssm_dsl.lowering.render_cuda import render_kernel
    program = lower(variants.get(variant), SHAPES["qwen3.5-4b" if variant == "gdn" else "kimi-linear"], ReplayConfig())
    staged = dataclasses.replace(launch, register_writes=False)
    for kernel in program.kernels:
        in_registers, without = render_kernel(kernel, program, launch), render_kernel(kernel, program, staged)
        if kernel.name == "replay_step":
            assert "sh_w[" not in in_registers and "stage_writes(" not in in_registers
            assert "load_record_rows(" not in in_registers and "load_record_rows(" in without
            loads = in_registers.count("load_record_rows_global(wv, ")
            assert loads == 2, "one with the eager records, one once the fill is known"
            assert in_registers.index("load_record_rows_global(") < in_registers.index("cp_async_wait();\n    __syncthreads();")
            assert "wv[r] = lane < n ? wv[r] : 0.f;" in in_registers
        else:
            assert in_registers == without, kernel.name


@pytest.mark.parametrize("variant", ["gdn", "kda", "mamba2"])
def test_register_fields_change_the_replay_step_alone(variant):
    """``/v``: the replay step loads its token's row fields (value; Mamba-2's skip and gate too) into
    the registers of the lanes that finish each row, where the rows read them, and declares no shared
    array for them; every other kernel renders as at the same launch without it."""
    import dataclasses

    from replayssm_dsl.lowering.render_cuda import render_kernel
    shape = {"gdn": "qwen3.5-4b", "kda": "kimi-linear", "mamba2": "nemotron-nano-4b"}[variant]
    program = lower(variants.get(variant), SHAPES[shape], ReplayConfig())
    launch = LaunchConfig(8, 16, max_registers=80, shared_rows=12, register_writes=True, register_fields=True)
    roles = ["value", "skip", "gate"] if variant == "mamba2" else ["value"]
    for kernel in program.kernels:
        in_registers = render_kernel(kernel, program, launch)
        without = render_kernel(kernel, program, dataclasses.replace(launch, register_fields=False))
        if kernel.name != "replay_step":
            assert in_registers == without, kernel.name
            continue
        for role in roles:
            assert f"sh_{role}" not in in_registers and f"__shared__ float sh_{role}[1 * BV];" in without
            assert f"float rf_{role}[(RPW + ROWS_REDUCED - 1) / ROWS_REDUCED];" in in_registers
            # loaded before the head-level phases' barriers, read by the lane that finishes the row
            assert in_registers.index(f"rf_{role}[c / ROWS_REDUCED] = ") < in_registers.index("cp_async_wait();\n    __syncthreads();")
        assert "(rf_value[c / ROWS_REDUCED] - pk)" in in_registers or "sh_beta[j] * rf_value[c / ROWS_REDUCED]" in in_registers


def test_the_replay_steps_fold_decays_lie_in_the_query_after_the_scores():
    """A decay vector's fold scale ``sh_ed`` (the replay step's) is ``sh_q``: the scores read the query
    last, a barrier before the rows, and the fold writes ``sh_ed`` after the rows; the flush kernels keep
    an array of their own."""
    from replayssm_dsl.lowering.render_cuda import render_kernel
    program = lower(variants.get("kda"), SHAPES["kimi-linear"], ReplayConfig())
    step = render_kernel(program.kernel("replay_step"), program, LaunchConfig(8, 16))
    assert "float* const sh_ed = sh_q;" in step and "__shared__ float sh_ed[K];" not in step
    last_query_read = step.rindex("sh_q[")
    assert step.index("__syncthreads();", last_query_read) < step.index("sh_ed[e] = ")
    assert "__shared__ float sh_ed[K];" in render_kernel(program.kernel("flush"), program, LaunchConfig(8, 16))


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


def test_shared_fragments_move_the_last_chunks_of_verifys_fragments_through_shared_memory():
    """Verify under a register cap with shared fragments runs on tensor cores: each lane's last N chunks
    of its second fragment row skip the register loads, go to shared memory by cp.async in a group of
    their own that the fields' wait leaves in flight, and come back before the products. More chunks
    than a lane holds is refused, naming the launch."""
    program = lower(variants.get("gdn"), SHAPES["qwen3.5-4b"], ReplayConfig())
    src = render_program(program, LaunchConfig(4, 16, max_registers=96, shared_fragments=4))
    verify = src[src.index("void __launch_bounds__(128, 5) verify("):]
    verify = verify[:verify.index('extern "C"')]
    assert "if (mt == MT - 1 && h == 1 && m >= K / 16 - 4) continue;" in verify
    issue, wait, back, products = (verify.index(s) for s in (
        "float4* const sh_fragments = reinterpret_cast<float4*>(dynamic_shared + (NREC * W_PITCH * sizeof(float) + 15) / 16 * 16);",
        "cp_async_wait_all_but_last();", "const float4 x = sh_fragments[c * THREADS + tid];", "float cq[MT][4], cqs[MT][4]"))
    assert verify.index("stage_writes(sh_w") < issue < wait < back < products
    assert verify.count("cp_async_commit();") == 2 and "cp_async_wait();" in verify[wait:back]
    # in dynamic shared memory after the write records: a float4 per chunk and thread more than without
    launches = {f: LaunchConfig(4, 16, max_registers=96, shared_fragments=f) for f in (0, 4)}
    records, with_fragments = (dynamic_shared_bytes(program.kernel("verify"), program, launches[f]) for f in (0, 4))
    assert with_fragments == -(-records // 16) * 16 + 4 * 16 * 128
    capped = render_program(program, LaunchConfig(4, 16, max_registers=96))  # without: the SIMT rows
    assert "sh_fragments" not in capped and "mma_3xtf32" not in capped[capped.index(") verify("):capped.index(") commit(")]
    with pytest.raises(LoweringError, match=r"shared_fragments: launch 4x16/r96/f9 moves 9 chunks .* at K = 128 a lane holds 8"):
        render_program(program, LaunchConfig(4, 16, max_registers=96, shared_fragments=9))
