"""GPU tests: every launch shape the autotuner or the rule may pick gives the float64 plain
recurrence, and the autotuner's timings and table on the device.

Marked ``gpu``: skipped without CuPy and a CUDA device. The twin poisons every output with NaN before
the launch that should write it; FP32 state, tolerance 2e-4 of the largest reference magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpu_cases import ALL_DECLS, FP32_TOL, cuda_cache, make_twin, steps_verifies_and_flush
from replayssm_dsl import ModelShape, ReplayConfig
from replayssm_dsl.random_inputs import random_params
from twin import ReplayTwin

pytestmark = pytest.mark.gpu


def _launch_shapes():
    from replayssm_dsl.lowering.launch import LaunchConfig
    from replayssm_dsl.runtime.autotune import GROUPS, candidates
    every = tuple(c for group in GROUPS for c in candidates(group))
    # (and the write records in registers with eager records, 2-row chunks at 10 rows per warp, and
    # verify's scores on CUDA cores beside its rows on tensor cores, the score_twins of verify of few drafts)
    extra = (LaunchConfig(4, 10), LaunchConfig(8, 16), LaunchConfig(4, 4, eager_records=True, register_writes=True),
             LaunchConfig(4, 10, register_writes=True), LaunchConfig(8, 16, simt_scores=True),
             LaunchConfig(5, 16, max_registers=96, shared_fragments=4, simt_scores=True),
             LaunchConfig(8, 16, max_registers=80, shared_fragments=6, simt_scores=True))
    return list(dict.fromkeys(every + extra))


@pytest.mark.parametrize("launch", _launch_shapes(), ids=lambda c: c.label)
@pytest.mark.parametrize("name", ["gdn", "kda", "kda_safe_gate", "mamba2"])
def test_gpu_every_launch_shape_gives_the_oracle(name, launch):
    """Every launch shape the autotuner or the rule may pick (V = 80 leaves partial tiles)."""
    twin = ReplayTwin(cuda_cache(), ALL_DECLS[name], ModelShape(4, 2, 80, 128), ReplayConfig(window=4, max_drafts=3),
                      np.random.default_rng(21), slots=3, tol=FP32_TOL, launch=launch)
    steps_verifies_and_flush(twin)


@pytest.mark.parametrize("name", ["gdn", "kda", "kda_safe_gate", "mamba2"])
def test_gpu_five_warp_ctas_with_a_partial_last_tile_give_the_oracle(name):
    """5x16 (80-row CTAs, verify's shape for V = 80) at V = 128: each head's second CTA holds 48 rows,
    three warps with rows and two without; every kernel at that launch against the oracle."""
    from replayssm_dsl.lowering.launch import LaunchConfig
    twin = ReplayTwin(cuda_cache(), ALL_DECLS[name], ModelShape(4, 2, 128, 128), ReplayConfig(window=4, max_drafts=3),
                      np.random.default_rng(23), slots=3, tol=FP32_TOL, launch=LaunchConfig(5, 16))
    steps_verifies_and_flush(twin)


@pytest.mark.parametrize("register_writes", [False, True], ids=["staged", "register-writes"])
@pytest.mark.parametrize("name", ["gdn", "mamba2"])
def test_gpu_more_write_chunks_per_record_than_threads_gives_the_oracle(name, register_writes):
    """One warp of 40 rows at V = 65 (1-float chunks, a partial tile): a write record has more chunks
    than the CTA has threads, so ``stage_writes`` gives each thread several chunks of every record
    (with ``register_writes`` the replay step loads them one float at a time into registers instead)."""
    from replayssm_dsl.lowering.launch import LaunchConfig
    twin = ReplayTwin(cuda_cache(), ALL_DECLS[name], ModelShape(4, 2, 65, 64), ReplayConfig(window=4, max_drafts=3),
                      np.random.default_rng(22), slots=3, tol=FP32_TOL,
                      launch=LaunchConfig(1, 40, register_writes=register_writes))
    steps_verifies_and_flush(twin)


@pytest.mark.parametrize("name", ["gdn", "mamba2"])
def test_gpu_verify_of_few_drafts_runs_its_own_tuned_shape(name, tmp_path, monkeypatch):
    """With table entries for both verify groups, verify of T ≤ VERIFY_FEW_DRAFTS tokens launches from
    the verify_few shape (here register-capped: SIMT rows) and longer verifies from verify's (uncapped:
    rows on tensor cores); outputs and commits match the oracle either way."""
    import dataclasses
    import json

    from replayssm_dsl.lowering import lower
    from replayssm_dsl.lowering.launch import LaunchConfig
    from replayssm_dsl.lowering.render_verify_mma import tensor_core_verify
    from replayssm_dsl.runtime import autotune

    shape, config, rows = ModelShape(4, 2, 64, 128), ReplayConfig(window=8, max_drafts=4), 2
    program = lower(ALL_DECLS[name], shape, config)
    few, many = LaunchConfig(4, 8, max_registers=80), LaunchConfig(4, 16)
    assert not tensor_core_verify(program, few) and tensor_core_verify(program, many)
    table = tmp_path / "autotune.json"
    table.write_text(json.dumps({autotune.table_key(program, rows, "verify_few"): {"launch": dataclasses.asdict(few)},
                                 autotune.table_key(program, rows, "verify"): {"launch": dataclasses.asdict(many)}}))
    monkeypatch.setenv("REPLAYSSM_AUTOTUNE_CACHE", str(table))
    twin = make_twin(ALL_DECLS[name], shape, config, seed=5, slots=3)
    twin.load([0, 2])
    for i, (t, drafts) in enumerate([(2, [2, 1]), (3, [3, 2]), (1, [1, 1]), (4, [4, 3]), (2, [2, 2])]):
        twin.step([2, 0])
        toks = twin.verify([0, 2], drafts)
        assert toks[next(iter(toks))].shape[1] == t
        twin.commit([0, 2], toks, [drafts[0] - i % 2, i % 2])
        verify_shapes = {launch for launch, family in twin.cache._compiled if family == "verify"}
        assert few in verify_shapes and (many in verify_shapes) == (i >= 1), verify_shapes
    twin.check_materialize([0, 2])


def test_gpu_tune_step_times_verify_of_few_drafts_with_its_scores_on_cuda_cores_too(tmp_path, monkeypatch):
    """``tune_step`` for ``verify_few`` (two candidates whose verify scores on tensor cores): the first
    pass times both and then each again with ``/c``, and the table holds all four times and the
    confirmed pick among them."""
    import json

    from replayssm_dsl.lowering import lower
    from replayssm_dsl.lowering.launch import LaunchConfig
    from replayssm_dsl.runtime import autotune

    shape, config, rows = ModelShape(4, 2, 64, 128), ReplayConfig(window=4, max_drafts=4), 2
    monkeypatch.setattr(autotune, "CANDIDATES", (LaunchConfig(4, 16), LaunchConfig(8, 8)))
    monkeypatch.setitem(autotune.GROUP_EXTRAS, "verify_few", ())
    monkeypatch.setenv("REPLAYSSM_AUTOTUNE_CACHE", str(tmp_path / "autotune.json"))
    decl = ALL_DECLS["gdn"]
    params = random_params(decl, shape, np.random.default_rng(4))
    best, first_pass = autotune.tune_step(decl, shape, config, params, rows, reps=5, group="verify_few")
    assert {c.label for c in first_pass} == {"4x16", "8x8", "4x16/c", "8x8/c"}
    assert all(np.isfinite(t) and t > 0 for t in first_pass.values())
    entry = json.loads((tmp_path / "autotune.json").read_text())[autotune.table_key(lower(decl, shape, config), rows, "verify_few")]
    assert set(entry["ms"]) == {c.label for c in first_pass} and best.label in entry["confirmed_ms"]


def test_gpu_tune_step_confirms_its_fastest_and_tables_them(tmp_path, monkeypatch):
    """``tune_step`` on the GPU (four candidates, the conventional group): the table's entry names the
    finalist of least confirmed median, its first pass and its finalists' medians, the finalists being
    the first pass's three fastest; a cache built after it reads that launch back."""
    import json

    from replayssm_dsl.lowering import lower
    from replayssm_dsl.lowering.launch import LaunchConfig
    from replayssm_dsl.runtime import autotune

    shape, config, rows = ModelShape(4, 2, 64, 128), ReplayConfig(window=4, max_drafts=2), 2
    monkeypatch.setattr(autotune, "CANDIDATES", (LaunchConfig(4, 4), LaunchConfig(4, 8), LaunchConfig(8, 4), LaunchConfig(4, 16)))
    table = tmp_path / "autotune.json"
    monkeypatch.setenv("REPLAYSSM_AUTOTUNE_CACHE", str(table))
    decl = ALL_DECLS["gdn"]
    params = random_params(decl, shape, np.random.default_rng(3))
    best, first_pass = autotune.tune_step(decl, shape, config, params, rows, reps=5, group="conventional")
    entry = json.loads(table.read_text())[autotune.table_key(lower(decl, shape, config), rows, "conventional")]
    assert entry["ms"] == {c.label: t for c, t in first_pass.items()} and len(first_pass) == 4
    assert all(np.isfinite(t) and t > 0 for t in first_pass.values())
    assert set(entry["confirmed_ms"]) == {c.label for c in sorted(first_pass, key=first_pass.get)[:3]}
    assert entry["confirmed_ms"][best.label] == min(entry["confirmed_ms"].values())
    assert LaunchConfig(**entry["launch"]) == best == autotune.lookup(lower(decl, shape, config), rows, "conventional")


def test_gpu_a_verify_that_fits_no_launch_is_refused_and_the_steps_go_on():
    """GDN at K = 256 with L = 16 and T = 8: verify's static shared memory passes 48 KiB at every one of
    ``fallback_launches``, so the first verify raises a ``LoweringError`` naming the family, before any
    kernel runs: no verify waits for a commit, and steps (with a flush) and materialize still give the
    oracle. A smaller capacity (L = 8, T = 4) builds and serves every kernel."""
    from replayssm_dsl.errors import LoweringError
    shape = ModelShape(2, 1, 32, 256)
    twin = ReplayTwin(cuda_cache(), ALL_DECLS["gdn"], shape, ReplayConfig(), np.random.default_rng(24), slots=2,
                      tol=FP32_TOL)
    twin.load([0, 1])
    twin.step([0, 1])
    with pytest.raises(LoweringError, match=r"builds the verify kernels for 'gdn'.*48 KiB"):
        twin.verify([0, 1], [2, 2])
    assert twin.cache.pending_verify is None
    for _ in range(ReplayConfig().window + 2):
        twin.step([1, 0])
    twin.check_materialize([0, 1])
    small = ReplayTwin(cuda_cache(), ALL_DECLS["gdn"], shape, ReplayConfig(window=8, max_drafts=4),
                       np.random.default_rng(25), slots=3, tol=FP32_TOL)
    steps_verifies_and_flush(small)
