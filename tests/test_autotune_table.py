"""The autotuner's table (no GPU needed to read and key it): one entry per program, batch size and
kernel group, so the conventional baselines get their own launch shape."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.config import PRESETS
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.lowering.render_cuda import render_program
from replayssm_dsl.runtime import autotune


@pytest.fixture
def program():
    return lower(variants.get("gdn"), PRESETS["qwen3.5-4b"].shape, ReplayConfig())


def test_groups_of_kernels(program):
    assert {autotune.group_of(k.name) for k in program.kernels} == set(autotune.GROUPS) - {"verify_few"}
    assert [k.name for k in program.kernels if autotune.group_of(k.name) == "conventional"] == \
        ["conventional_step", "snapshot_verify"]
    assert [k.name for k in program.kernels if autotune.group_of(k.name) == "verify"] == ["flush_for_verify", "verify"]


def test_the_table_key_tells_record_settings_apart():
    """Float32 records, and bf16 records with each choice of raw fields, tune apart (their kernels
    differ); one choice given in either order is one key."""
    decl, shape = variants.get("kda").with_token_dtype("bfloat16"), PRESETS["kimi-linear"].shape
    configs = [ReplayConfig()] + [ReplayConfig(record_dtype="bfloat16", raw_record_fields=f)
                                  for f in (("key", "decay"), ("key",), ("decay",))]
    keys = {autotune.table_key(lower(decl, shape, c), 256) for c in configs}
    assert len(keys) == 4
    both_ways = ReplayConfig(record_dtype="bfloat16", raw_record_fields=("decay", "key"))
    assert autotune.table_key(lower(decl, shape, both_ways), 256) in keys


KEYED_CONFIGS = [ReplayConfig(), ReplayConfig(scaled_keys=False), ReplayConfig(window=8), ReplayConfig(max_drafts=4),
                 ReplayConfig(state_dtype="float16"), ReplayConfig(state_dtype="bfloat16"),
                 ReplayConfig(record_dtype="bfloat16"), ReplayConfig(record_dtype="bfloat16", raw_record_fields=("key",))]


@pytest.mark.parametrize("name", sorted(variants.BUILTINS))
def test_programs_that_render_apart_tune_apart(name):
    """Wherever two configurations, shapes or token dtypes render other CUDA, their table keys differ
    (an entry tuned for one is never read for the other); the same source may share a key."""
    shapes = [ModelShape(8, 2, 64, 64), ModelShape(8, 4, 64, 64), ModelShape(8, 2, 64, 32)]
    source_of: dict[str, str] = {}  # key -> the source first rendered under it
    for decl in (variants.get(name), variants.get(name).with_token_dtype("bfloat16")):
        for shape in shapes:
            for config in KEYED_CONFIGS:
                program = lower(decl, shape, config)
                source, key = render_program(program), autotune.table_key(program, 256)
                assert source_of.setdefault(key, source) == source, \
                    f"{name}: {config} at {shape} renders other CUDA under the key {key}"
    other = lower(variants.get("mamba2" if name != "mamba2" else "gdn"), shapes[0], ReplayConfig())
    assert autotune.table_key(other, 256) not in source_of
    assert len({autotune.table_key(other, 256, g) for g in autotune.GROUPS}) == len(autotune.GROUPS)


def test_verify_of_few_drafts_has_its_own_group(program):
    """Verify's kernels go to ``verify_few`` at T ≤ VERIFY_FEW_DRAFTS (both kernels of one verify
    together), to ``verify`` above it or when T is not given; the draft count changes no other group."""
    few = autotune.VERIFY_FEW_DRAFTS
    for kernel in autotune.VERIFY_KERNELS:
        assert [autotune.group_of(kernel, t) for t in range(1, few + 2)] == ["verify_few"] * few + ["verify"]
        assert autotune.group_of(kernel) == "verify"
    for kernel in ("replay_step", "flush", "commit", "materialize"):
        assert autotune.group_of(kernel, 1) == "replay"
    assert autotune.group_of("snapshot_verify", 1) == "conventional"
    assert autotune.table_key(program, 256, "verify_few") != autotune.table_key(program, 256, "verify")
    assert autotune.candidates("verify_few") == autotune.candidates("verify")
    config = program.config
    assert autotune.drafts_timed("verify", config) == config.max_drafts
    assert autotune.drafts_timed("verify_few", config) == min(few, config.max_drafts)
    assert autotune.drafts_timed("verify_few", ReplayConfig(max_drafts=1)) == 1
    assert autotune.drafts_timed("replay", config) is None and autotune.drafts_timed("conventional", config) is None
    assert autotune.group_spills({"verify": 8}, "verify_few") and not autotune.group_spills({"verify": 8}, "replay")


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
    monkeypatch.setenv("REPLAYSSM_AUTOTUNE_CACHE", str(broken))
    for text in ("{not json", "[1, 2]", "null", "7"):  # not JSON, or JSON that is no table
        broken.write_text(text)
        assert autotune.lookup(program, 256) is None, text


def test_group_options_are_tried_in_their_group_only():
    """Eager records change only the replay step, one-pass verify only verify: each is tuned where it
    matters, and a label names every option so a table entry reads back as what was timed."""
    replay, verify, conventional = (autotune.candidates(g) for g in ("replay", "verify", "conventional"))
    assert any(c.eager_records for c in replay) and not any(c.eager_records for c in verify + conventional)
    assert any(c.verify_rows_per_pass for c in verify) and not any(c.verify_rows_per_pass for c in replay + conventional)
    assert set(autotune.CANDIDATES) <= set(replay) & set(verify) & set(conventional)
    labels = [c.label for g in autotune.GROUPS for c in autotune.candidates(g)]
    shared = len(autotune.CANDIDATES) * (len(autotune.GROUPS) - 1) + len(autotune.GROUP_EXTRAS["verify_few"])
    assert len(labels) == len(set(labels)) + shared  # verify_few tries verify's options
    assert LaunchConfig(8, 4, max_registers=64, eager_records=True).label == "8x4/r64/e"
    assert LaunchConfig(8, 10, verify_rows_per_pass=10).label == "8x10/p10"


def test_a_group_is_refused_only_for_its_own_kernels_spills():
    """A group launches only from the module of its own launch shape, so another group's spilling
    kernel in that module does not rule the shape out; the group's own kernels (the fill kernels and
    the rest of the replay group included) and a module that does not build do."""
    assert not autotune.group_spills({}, "replay")
    assert not autotune.group_spills({"verify": 8}, "replay")
    assert not autotune.group_spills({"verify": 8, "snapshot_verify": 4}, "replay")
    assert autotune.group_spills({"verify": 8}, "verify")
    assert autotune.group_spills({"flush_for_verify": 4}, "verify")
    assert autotune.group_spills({"flush": 4}, "replay")
    assert autotune.group_spills({"materialize": 4}, "replay")
    assert autotune.group_spills({"snapshot_verify": 4}, "conventional")
    assert not autotune.group_spills({"replay_step": 4}, "conventional")
    for group in autotune.GROUPS:
        assert autotune.group_spills(None, group)


@pytest.mark.nvrtc
@pytest.mark.parametrize("launch", [LaunchConfig(8, 8, max_registers=64), LaunchConfig(8, 16),
                                    LaunchConfig(16, 8, max_registers=64), LaunchConfig(16, 4, max_registers=64)],
                         ids=lambda c: c.label)
def test_wide_ctas_build_the_replay_group_clean(program, launch):
    """8x8/r64 (4 CTAs of 8 warps per SM), 8x16 (a whole head of V = 128 per CTA, 2 per SM) and the
    16-warp shapes under a 64-register cap are candidates for the GDN replay step although verify
    spills at some of them: the replay group's module builds clean."""
    from replayssm_dsl.lowering.render_cuda import render_program
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    assert launch in autotune.CANDIDATES
    result = compile_cubin(render_program(program, launch, kernels=autotune.group_kernels(program, "replay")),
                           f"gdn-{launch.label.replace('/', '-')}.cu")
    assert not result.warnings, result.log
    replay_group = {name: res for name, res in result.resources.items() if autotune.group_of(name) == "replay"}
    assert {"replay_step", "flush", "materialize"} <= set(replay_group)
    for name, res in replay_group.items():
        assert res.clean and res.registers <= launch.max_registers, f"{name}: {res}"


def test_each_family_compiles_as_its_own_module(program):
    """group_kernels splits a program's kernels into the families' modules: every kernel in exactly
    one, the fill kernels with the replay group, verify_few with verify's kernels."""
    families = {group: autotune.group_kernels(program, group) for group in ("replay", "verify", "conventional")}
    every = [name for names in families.values() for name in names]
    assert sorted(every) == sorted(k.name for k in program.kernels)
    assert {"replay_step", "flush", "commit", "reset_fill"} <= set(families["replay"])
    assert set(families["verify"]) == {"flush_for_verify", "verify"}
    assert autotune.group_kernels(program, "verify_few") == families["verify"]


@pytest.mark.nvrtc
def test_a_shape_whose_verify_spills_still_serves_the_replay_group():
    """KDA at 8x20: verify spills, the replay group's module builds clean, so the replay group may take
    the shape (each group's kernels compile as a module of their own and the tuner skips a shape only
    for the group whose kernels spill or do not fit)."""
    from replayssm_dsl.lowering.render_cuda import render_program
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    program = lower(variants.get("kda"), PRESETS["kimi-linear"].shape, ReplayConfig())
    launch = LaunchConfig(8, 20)
    replay = compile_cubin(render_program(program, launch, kernels=autotune.group_kernels(program, "replay")))
    assert all(res.clean for res in replay.resources.values()) and not replay.warnings, replay.resources
    verify = compile_cubin(render_program(program, launch, kernels=autotune.group_kernels(program, "verify")))
    assert not verify.resources["verify"].clean and not verify.warnings, verify.resources["verify"]


def test_verify_rows_per_pass():
    assert LaunchConfig(4, 16).verify_rows == 8, "by default 8 rows per pass (16 in one pass spill for some declarations)"
    assert LaunchConfig(4, 4).verify_rows == 4
    assert LaunchConfig(8, 10, verify_rows_per_pass=10).verify_rows == 10


def test_a_tuned_entry_round_trips_every_option(program, tmp_path, monkeypatch):
    import dataclasses
    table = tmp_path / "autotune.json"
    monkeypatch.setenv("REPLAYSSM_AUTOTUNE_CACHE", str(table))
    for launch in (LaunchConfig(4, 4, eager_records=True), LaunchConfig(4, 16, verify_rows_per_pass=16)):
        table.write_text(json.dumps({autotune.table_key(program, 1): {"launch": dataclasses.asdict(launch)}}))
        assert autotune.lookup(program, 1) == launch


def test_an_entry_this_version_cannot_read_is_no_entry(program, tmp_path, monkeypatch):
    table = tmp_path / "autotune.json"
    monkeypatch.setenv("REPLAYSSM_AUTOTUNE_CACHE", str(table))
    for launch in ({"warps": 4, "rows_per_warp": 8, "from_a_newer_version": 1}, {"warps": 0}, "4x8"):
        table.write_text(json.dumps({autotune.table_key(program, 8): {"launch": launch}}))
        assert autotune.lookup(program, 8) is None, launch
    table.write_text(json.dumps({autotune.table_key(program, 8): {"ms": {}}}))
    assert autotune.lookup(program, 8) is None


@pytest.mark.parametrize("bad", [{"warps": 0}, {"rows_per_warp": -1}, {"verify_rows_per_pass": -8}, {"max_registers": 64.0},
                                 {"shared_rows": 4}, {"shared_rows": -1}, {"shared_rows": 2.0}])
def test_launch_config_refuses_what_no_kernel_can_run(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        LaunchConfig(**bad)


def test_every_candidate_launch_is_named_by_its_label():
    """``LaunchConfig.from_label`` reads back every launch the tuner can pick, and any mix of options."""
    launches = set(autotune.CANDIDATES) | {launch for extras in autotune.GROUP_EXTRAS.values() for launch in extras}
    launches.add(LaunchConfig(16, 2, max_registers=72, eager_records=True, verify_rows_per_pass=2, shared_rows=1,
                              register_writes=True, register_fields=True, shared_fragments=3, simt_scores=True))
    launches |= {dataclasses.replace(c, simt_scores=True) for c in autotune.candidates("verify_few")}  # score_twins
    assert LaunchConfig.from_label("8x16/r80/s10/w").register_writes
    assert LaunchConfig.from_label("8x16/r80/s12/w/v").register_fields
    for launch in launches:
        assert LaunchConfig.from_label(launch.label) == launch, launch.label


@pytest.mark.parametrize("bad", ["8", "8x", "x8", "8x8/r", "8x8/q4", "8x8/r64/r80", "8x8/e2", "8x8/p", "4x4/r6.5", "0x8",
                                 "8x0", "08x8", "8x8/r064", "8x8/r128", "8x8/p0", "8x8/p4/r64", "\u0664x8", "+8x8", " 8x8",
                                 "8x8/s0", "8x8/s8", "8x8/s4/r64", "8x8/s4/p4", "8x8/w/s4", "8x8/ww", "8x8/w1", "8x8/w/e",
                                 "8x8/f0", "8x8/f", "8x8/f2/w", "8x8/f2/s4", "8x8/f02", "8x8/v/w", "8x8/vv", "8x8/f2/v",
                                 "8x8/c/f2", "8x8/cc", "8x8/c1", "8x8/c/r64"])
def test_a_label_that_names_no_launch_is_refused(bad):
    with pytest.raises(ValueError, match=re.escape(f"launch label {bad!r}")):
        LaunchConfig.from_label(bad)


def test_tensor_core_verify_drops_the_rows_per_pass_options_and_takes_shared_fragments():
    """Verify's rows on tensor cores take no passes through the drafts: the tuner does not time a
    ``/p`` option there (the same kernel twice); where verify's rows run on SIMT lanes it does. Shared
    fragments (``/f``) put verify's rows on tensor cores under a register cap, and are not timed where
    verify cannot run there (the same SIMT kernel as without)."""
    from replayssm_dsl.lowering.render_verify_mma import tensor_core_verify
    tensor = lower(variants.get("gdn"), ModelShape(4, 2, 64, 128), ReplayConfig(window=16, max_drafts=8))
    simt = lower(variants.get("gdn"), ModelShape(4, 2, 64, 100), ReplayConfig(window=16, max_drafts=8))  # K % 16 != 0
    assert tensor_core_verify(tensor, LaunchConfig(4, 16)) and not tensor_core_verify(simt, LaunchConfig(4, 16))
    assert not tensor_core_verify(tensor, LaunchConfig(4, 10, max_registers=96)), "a register cap keeps the SIMT rows"
    capped = LaunchConfig(8, 8, max_registers=64, verify_rows_per_pass=4)  # a register cap: SIMT rows, passes count
    assert {c for c in autotune.distinct_candidates(tensor, "verify") if c.verify_rows_per_pass} == {capped}
    fragments = {c for c in autotune.candidates("verify") if c.shared_fragments}
    assert fragments and all(c.max_registers < 128 for c in fragments)
    assert all(tensor_core_verify(tensor, c) for c in fragments), "shared fragments put verify on tensor cores under a cap"
    assert fragments <= set(autotune.distinct_candidates(tensor, "verify"))
    assert autotune.distinct_candidates(simt, "verify") == tuple(c for c in autotune.candidates("verify")
                                                                  if c not in fragments), "where they change nothing"
    assert autotune.distinct_candidates(tensor, "replay") == autotune.candidates("replay")
    small_k = lower(variants.get("gdn"), ModelShape(4, 2, 64, 32), ReplayConfig(window=16, max_drafts=8))  # 2 chunks a lane
    kept = {c.shared_fragments for c in autotune.distinct_candidates(small_k, "verify") if c.shared_fragments}
    assert kept == {f for f in (c.shared_fragments for c in fragments) if f <= 2}, "more chunks than a lane holds are not timed"


def test_verify_of_few_drafts_times_its_finalists_with_their_scores_on_cuda_cores(monkeypatch):
    """``score_twins``: verify of few drafts times each first-pass finalist whose scores run on tensor
    cores again with ``/c`` (its scores on CUDA cores); none where the scores run on CUDA cores anyway
    (a decay vector of plain record keys, verify's rows off the tensor cores), none for the other
    groups, and the first pass never times a ``/c`` that would render the kernel it already has."""
    from replayssm_dsl.lowering.render_verify_mma import tensor_core_scores
    config = ReplayConfig(window=16, max_drafts=8)
    gdn, kda = (lower(variants.get(name), ModelShape(4, 2, 64, 128), config) for name in ("gdn", "kda"))
    safe = lower(variants.get("kda_safe_gate"), ModelShape(4, 2, 64, 128), config)  # decay-scaled record keys
    whole, capped, fragments = LaunchConfig(8, 16), LaunchConfig(4, 10, max_registers=96), LaunchConfig(8, 16, max_registers=80, shared_fragments=6)
    assert tensor_core_scores(gdn, whole) and tensor_core_scores(safe, whole) and tensor_core_scores(gdn, fragments)
    assert not tensor_core_scores(kda, whole), "a decay vector of plain keys does not factor out of the product"
    assert not tensor_core_scores(gdn, capped), "SIMT rows score on CUDA cores"
    assert not tensor_core_scores(gdn, LaunchConfig(8, 16, simt_scores=True))
    finalists = (whole, capped, fragments)
    assert autotune.score_twins(gdn, "verify_few", finalists) == (LaunchConfig(8, 16, simt_scores=True),
                                                                  dataclasses.replace(fragments, simt_scores=True))
    assert autotune.score_twins(safe, "verify_few", finalists) == autotune.score_twins(gdn, "verify_few", finalists)
    assert autotune.score_twins(kda, "verify_few", finalists) == ()
    for group in ("replay", "verify", "conventional"):
        assert autotune.score_twins(gdn, group, finalists) == ()
    on_cuda_cores = (LaunchConfig(8, 16, simt_scores=True), LaunchConfig(4, 10, max_registers=96, simt_scores=True))
    monkeypatch.setattr(autotune, "CANDIDATES", (whole,) + on_cuda_cores)
    assert autotune.distinct_candidates(gdn, "verify_few")[:2] == (whole, on_cuda_cores[0])
    assert on_cuda_cores[1] not in autotune.distinct_candidates(gdn, "verify_few"), "SIMT rows: the same kernel"
    assert not any(c.simt_scores for c in autotune.distinct_candidates(kda, "verify_few")), "the same kernel"


@pytest.mark.parametrize("k_dim,state_dtype", [(6, "float32"), (100, "bfloat16"), (36, "float16")])
def test_shared_rows_need_rows_of_whole_16_byte_units(k_dim, state_dtype):
    """The bulk copies of shared rows move 16-byte units: a state row of another size gets a
    ``LoweringError`` naming ``shared_rows``, and the tuner does not time those options there."""
    from replayssm_dsl.errors import LoweringError
    from replayssm_dsl.lowering.render_cuda import render_program
    program = lower(variants.get("gdn"), ModelShape(4, 2, 64, k_dim), ReplayConfig(window=4, max_drafts=2, state_dtype=state_dtype))
    shared = [c for c in autotune.candidates("replay") if c.shared_rows]
    assert shared, "the replay group has shared-row options"
    with pytest.raises(LoweringError, match="shared_rows"):
        render_program(program, shared[0])
    assert autotune.distinct_candidates(program, "replay") == tuple(c for c in autotune.candidates("replay") if not c.shared_rows)
    render_program(program, LaunchConfig(4, 16, max_registers=96))  # the same launch without shared rows renders


def test_an_entry_tuned_by_an_earlier_version_is_tuned_again(program, tmp_path, monkeypatch):
    """Keys carry ``TUNING_VERSION``: an entry written under an earlier one (other kernels, or another
    way of timing them) is not read."""
    table = tmp_path / "autotune.json"
    monkeypatch.setenv("REPLAYSSM_AUTOTUNE_CACHE", str(table))
    key = autotune.table_key(program, 64)
    assert key.startswith(f"v{autotune.TUNING_VERSION}|")
    earlier = key.replace(f"v{autotune.TUNING_VERSION}|", f"v{autotune.TUNING_VERSION - 1}|", 1)
    table.write_text(json.dumps({earlier: {"launch": {"warps": 4, "rows_per_warp": 16}}}))
    assert autotune.lookup(program, 64) is None
    table.write_text(json.dumps({key: {"launch": {"warps": 4, "rows_per_warp": 16}}}))
    assert autotune.lookup(program, 64) == LaunchConfig(4, 16)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.001, 10.0, allow_nan=False), min_size=1, max_size=12, unique=True), st.integers(1, 5))
def test_finalists_are_the_fastest_of_the_first_pass(times, count):
    timings = {LaunchConfig(4, r): t for r, t in zip(range(1, 13), times)}
    chosen = autotune.finalists(timings, count)
    assert len(chosen) == min(count, len(times))
    assert [timings[c] for c in chosen] == sorted(times)[:count]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.data())
def test_the_confirmed_launch_has_the_least_median_over_the_rounds(launches, rounds, data):
    """Whatever order a first pass left them in, the finalist chosen is the one whose median over the
    interleaved rounds is least, and every finalist's median is reported."""
    shapes = [LaunchConfig(8, r) for r in range(1, launches + 1)]
    times = st.floats(0.001, 10.0, allow_nan=False)
    timed = [{c: data.draw(times) for c in shapes} for _ in range(rounds)]
    best, medians = autotune.confirmed_best(timed)
    assert set(medians) == set(shapes)
    for c in shapes:
        assert medians[c] == pytest.approx(float(np.median([r[c] for r in timed])))
    assert medians[best] == min(medians.values())


def test_a_first_pass_winner_can_lose_the_confirmation():
    first, second = LaunchConfig(4, 8), LaunchConfig(8, 4)
    rounds = [{first: 6.5, second: 6.2}, {first: 6.4, second: 6.3}, {first: 5.9, second: 6.25}]
    assert autotune.confirmed_best(rounds)[0] == second
