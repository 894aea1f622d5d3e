"""GPU tests: the generated CUDA kernels against the float64 plain recurrence (and the CPU executor).

Marked ``gpu``: skipped without CuPy and a CUDA device. Every output array is poisoned with NaN
before the launch that should write it; NaN never passes. Tolerances (relative to the largest
reference magnitude): FP32 state 2e-4; FP16 state 2e-3 and BF16 state 2e-2 against the FP32 CPU
executor that rounds the checkpoint at the same points.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_cases import ALL_DECLS, FP32_TOL, cuda_cache, decl_names, make_twin
from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.random_inputs import random_params, random_state, random_tokens
from twin import ReplayTwin, assert_buffers_kept, assert_close, buffers_snapshot, to_host

pytestmark = pytest.mark.gpu
GPU_SHAPES = [ModelShape(2, 1, 16, 32), ModelShape(4, 2, 80, 96), ModelShape(2, 2, 60, 64), ModelShape(3, 1, 8, 6)]
GPU_CONFIGS = [ReplayConfig(window=4, max_drafts=3), ReplayConfig(window=16, max_drafts=8)]
GPU_SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))


@GPU_SETTINGS
@given(name=decl_names, shape=st.sampled_from(GPU_SHAPES), config=st.sampled_from(GPU_CONFIGS),
       seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 40), flush_every=st.sampled_from((0, 3, 7)))
def test_gpu_steps_flush_materialize_match_oracle(name, shape, config, seed, steps, flush_every):
    twin = make_twin(ALL_DECLS[name], shape, config, seed, slots=3)
    twin.load([2, 0])
    for i in range(steps):
        twin.step([0, -1, 2] if i % 2 else [2, 0])
        if flush_every and i % flush_every == 0:
            twin.cache.flush([0])
        if i % 9 == 0:
            twin.check_materialize([0, 2])
    twin.check_materialize([0, 2])


@pytest.mark.parametrize("name", sorted(ALL_DECLS))
def test_gpu_verify_every_draft_count_and_every_accepted_count(name):
    """verify(t) for t = 1..8 and commit(a) for every a in 0..t, interleaved with steps, back to back."""
    twin = make_twin(ALL_DECLS[name], ModelShape(4, 2, 80, 96), ReplayConfig(window=16, max_drafts=8), 7, slots=2)
    twin.load([0, 1])
    for t in range(1, 9):
        for a in range(t + 1):
            toks = twin.verify([1, 0], [t, max(1, t - 1)])
            twin.commit([1, 0], toks, [a, min(a, max(1, t - 1))])
            if (t + a) % 3 == 0:
                twin.step([0, 1])
    twin.check_materialize([0, 1])


@pytest.mark.parametrize("name", ["gdn", "kda", "kda_safe_gate", "mamba2", "custom"])
def test_gpu_mixed_batch_at_every_fill_leaves_other_slots_untouched(name):
    config = ReplayConfig(window=16, max_drafts=8)
    shape = ModelShape(4, 2, 80, 96)
    fills = list(range(config.capacity + 1))
    twin = make_twin(ALL_DECLS[name], shape, config, 11, slots=len(fills) + 2)
    slots = list(range(len(fills)))
    twin.load(slots + [len(fills) + 1])
    for slot, fill in zip(slots, fills):
        for _ in range(min(fill, config.window - 1)):
            twin.step([slot])
        while twin.cache.fills()[slot] < fill:
            t = min(fill - int(twin.cache.fills()[slot]), config.max_drafts)
            twin.commit([slot], twin.verify([slot], [t]), [t])
    bystander = len(fills) + 1
    before = {k: to_host(v) for k, v in twin.cache.buffers.items()}
    rng = np.random.default_rng(3)
    order = list(rng.permutation(slots))
    batch = order[:10] + [-1] + order[10:] + [-1, -1]
    twin.step(batch)
    twin.commit(batch, twin.verify(batch, [int(x) for x in rng.integers(1, 9, len(batch))]),
                [1] * len(batch))
    twin.step(batch)
    twin.check_materialize(slots)
    after = {k: to_host(v) for k, v in twin.cache.buffers.items()}
    for key in ("checkpoint", "rec_write", "rec_decay", "rec_key", "fill"):
        if key in before:
            assert np.array_equal(before[key][bystander], after[key][bystander]), f"{key} of an idle slot changed"
    assert after["fill"].max() < 2 ** 16, "replay_step left a CTA count in a fill word (the next step would not move it)"


@pytest.mark.parametrize("label", [None, "8x16/r80/s12/w/v", "4x16/r96/s8"], ids=["default", "8x16-shared-rows", "4x16-shared-rows"])
@pytest.mark.parametrize("name", ["gdn", "kda", "kda_safe_gate", "mamba2"])
def test_gpu_long_run_stays_within_tolerance(name, label):
    """2,000 steps (125 flushes per slot at L = 16) with speculative rounds mixed in; also at the tuned
    launches' kinds of shape (rows in shared memory, write records in registers), V = 128 there so
    every warp holds rows."""
    from replayssm_dsl.lowering.launch import LaunchConfig
    shape = ModelShape(4, 2, 128 if label else 64, 128)
    twin = ReplayTwin(cuda_cache(), ALL_DECLS[name], shape, ReplayConfig(window=16, max_drafts=8),
                      np.random.default_rng(5), slots=4, tol=FP32_TOL,
                      launch=LaunchConfig.from_label(label) if label else None)
    twin.load([0, 1, 2, 3])
    for i in range(4):  # stagger the fills
        for _ in range(i * 4):
            twin.step([i])
    for i in range(2000):
        twin.step([3, 1, 0, 2])
        if i % 97 == 0:
            toks = twin.verify([0, 1, 2, 3], [8, 4, 2, 1])
            twin.commit([0, 1, 2, 3], toks, [3, 4, 0, 1])
    twin.check_materialize([0, 1, 2, 3])
    assert twin.max_err <= FP32_TOL


@pytest.mark.parametrize("name", ["gdn", "kda", "mamba2", "custom"])
def test_gpu_baselines_match_oracle(name):
    from replayssm_dsl.reference import plain_recurrence
    decl, shape = ALL_DECLS[name], ModelShape(4, 2, 80, 96)
    rng = np.random.default_rng(2)
    params = random_params(decl, shape, rng)
    cache = cuda_cache()(decl, shape, ReplayConfig(window=16, max_drafts=8), slots=3, params=params)
    S0 = random_state(shape, rng, (2,))
    cache.load_conventional([2, 0], S0)
    toks = random_tokens(decl, shape, rng, (2, 6))
    for j in range(6):
        out = cache.conventional_step([2, 0], {k: v[:, j] for k, v in toks.items()},
                                      out=cache.poisoned((2, 1, shape.heads, shape.v_dim)))
        for b in range(2):
            o, _ = plain_recurrence(decl, shape, {k: v[b, :j + 1] for k, v in toks.items()}, params, S0[b])
            assert_close(out[b], o[-1], FP32_TOL, f"conventional step {j}")
    cache.load_conventional([1], S0[:1])
    vt = random_tokens(decl, shape, rng, (1, 5))
    out, snaps = cache.snapshot_verify([1], vt, [5], out=cache.poisoned((1, 5, shape.heads, shape.v_dim)))
    o, _ = plain_recurrence(decl, shape, {k: v[0] for k, v in vt.items()}, params, S0[0])
    assert_close(out[0], o, FP32_TOL, "snapshot verify outputs")
    for j in range(5):
        _, S = plain_recurrence(decl, shape, {k: v[0, :j + 1] for k, v in vt.items()}, params, S0[0])
        assert_close(snaps[0, j], S, FP32_TOL, f"snapshot {j}")


@pytest.mark.parametrize("state_dtype,tol", [("float16", 2e-3), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("name", ["gdn", "mamba2", "kda"])
def test_gpu_half_precision_checkpoints_match_cpu_rounding(name, state_dtype, tol):
    from replayssm_dsl.runtime.cpu_cache import CpuReplayCache
    decl, shape = ALL_DECLS[name], ModelShape(2, 1, 64, 64)
    config = ReplayConfig(window=4, max_drafts=4, state_dtype=state_dtype)
    rng = np.random.default_rng(9)
    params = random_params(decl, shape, rng)
    gpu = cuda_cache()(decl, shape, config, slots=2, params=params)
    cpu = CpuReplayCache(decl, shape, config, slots=2, params=params, precision="float32")
    S0 = random_state(shape, rng, (2,))
    gpu.load([0, 1], S0.astype(np.float32))
    cpu.load([0, 1], S0)
    for i in range(30):
        toks = random_tokens(decl, shape, rng, (2,))
        g = gpu.step([0, 1], {k: v.astype(np.float32) for k, v in toks.items()},
                     out=gpu.poisoned((2, 1, shape.heads, shape.v_dim)))
        assert_close(g, cpu.step([0, 1], toks), tol, f"{state_dtype} step {i}")
    assert_close(gpu.materialize([0, 1]), cpu.materialize([0, 1]), tol, f"{state_dtype} materialize")


def test_gpu_cuda_graph_replays_a_decode_step_like_eager():
    """A decode step captured in a CUDA graph (device-resident batch, no host sync) replays like
    eager launches on a twin cache, through many flushes."""
    import cupy as cp
    decl, shape, config = ALL_DECLS["gdn"], ModelShape(4, 2, 64, 128), ReplayConfig(window=4, max_drafts=2)
    rng = np.random.default_rng(4)
    params = random_params(decl, shape, rng)
    graphed = cuda_cache()(decl, shape, config, slots=4, params=params)
    eager = cuda_cache()(decl, shape, config, slots=4, params=params)
    S0 = random_state(shape, rng, (4,)).astype(np.float32)
    graphed.load([0, 1, 2, 3], S0)
    eager.load([0, 1, 2, 3], S0)
    slots = np.array([2, 0, -1, 3, 1], np.int32)
    batch = {k: cp.asarray(v) for k, v in graphed._batch(slots).items()}
    toks = {k: cp.asarray(v[:, None].astype(np.float32)) for k, v in random_tokens(decl, shape, rng, (5,)).items()}
    out = cp.full((5, 1, shape.heads, shape.v_dim), np.nan, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    graphed.stream = stream
    cp.cuda.Device().synchronize()
    graphed.launch_step(batch, toks, out)  # compile and load outside the capture
    eager.step(slots, {k: v[:, 0] for k, v in toks.items()})
    with stream:
        stream.begin_capture()
        graphed.launch_step(batch, toks, out)
        graph = stream.end_capture()
    cp.cuda.Device().synchronize()  # the loads ran on the null stream, which a non-blocking one does not wait for
    for i in range(13):
        new = random_tokens(decl, shape, rng, (5,))
        with stream:  # the refills on the graph's stream, so the replay cannot start before them
            for k, v in new.items():
                toks[k][...] = cp.asarray(v[:, None].astype(np.float32))
            out[...] = np.nan
        graph.launch(stream)
        stream.synchronize()
        want = eager.step(slots, {k: v[:, 0] for k, v in toks.items()})
        live = slots >= 0
        assert_close(out[live, 0], want[live], 1e-6, f"graph replay {i}")
    assert np.array_equal(graphed.fills(), eager.fills())


def _two_loaded_caches(name: str, seed: int, launch=None):
    """A CUDA cache (at ``launch``, if given) and an eager twin of it (2 slots, window 4, T_max 2,
    ``[2, 2, 64, 64]`` heads), both loaded with the same random checkpoints, for the tests that feed
    device batch arrays."""
    decl, shape, config = ALL_DECLS[name], ModelShape(4, 2, 64, 64), ReplayConfig(window=4, max_drafts=2)
    rng = np.random.default_rng(seed)
    params = random_params(decl, shape, rng)
    cache = cuda_cache()(decl, shape, config, slots=2, params=params, launch=launch)
    twin = cuda_cache()(decl, shape, config, slots=2, params=params)
    S0 = random_state(shape, rng, (2,)).astype(np.float32)
    cache.load([0, 1], S0)
    twin.load([0, 1], S0)
    return decl, shape, config, cache, twin, rng


def _device_batch(cp, slots, src, dst, drafts=(1, 1), accepted=(0, 0)) -> dict:
    """The batch arrays of two rows as device int32 arrays (the graph path: no host checks)."""
    return {name: cp.asarray(values, cp.int32) for name, values in
            (("slot", slots), ("src_page", src), ("dst_page", dst), ("drafts", drafts), ("accepted", accepted))}


def _step_tokens(cp, decl, shape, rng) -> dict:
    """Fresh random tokens of one step for two rows, on the device: ``[2, 1, ...]``."""
    return {k: cp.asarray(v[:, None].astype(np.float32)) for k, v in random_tokens(decl, shape, rng, (2,)).items()}


@pytest.mark.parametrize("bf16_tokens", [False, True])
def test_gpu_a_token_the_kernels_cannot_take_fails_before_verify_folds(bf16_tokens):
    """A device token of a dtype the kernels do not read (float64) raises InputError naming it before
    any launch: verify would otherwise fold the full buffers into the checkpoint (flush_for_verify)
    and then stop, leaving the fill counting records already folded in."""
    import cupy as cp
    from replayssm_dsl.errors import InputError
    decl = variants.get("gdn").with_token_dtype("bfloat16") if bf16_tokens else variants.get("gdn")
    shape, config = ModelShape(4, 2, 16, 32), ReplayConfig(window=4, max_drafts=3)
    rng = np.random.default_rng(21)
    cache = cuda_cache()(decl, shape, config, slots=2, params=random_params(decl, shape, rng))
    cache.load([0, 1], random_state(shape, rng, (2,)).astype(np.float32))
    for _ in range(3):  # fill 3 (a step at fill 3 would flush: window 4)
        cache.step([0, 1], random_tokens(decl, shape, rng, (2,)))
    toks = random_tokens(decl, shape, rng, (2, 3))
    cache.verify([0, 1], toks, [3, 3])
    cache.commit([3, 3])  # fill 6: the next verify of 3 must fold (6 + 3 > 7)
    before = buffers_snapshot(cache)
    bad = {k: cp.asarray(v) for k, v in random_tokens(decl, shape, rng, (2, 3)).items()}  # float64
    with pytest.raises(InputError, match=r"tokens\['q'\]"):
        cache.verify([0, 1], bad, [3, 3])
    assert_buffers_kept(cp, cache, before, "after a refused verify")


@pytest.mark.parametrize("name", ["gdn", "mamba2"])
def test_gpu_a_row_input_view_at_an_offset_is_refused_before_any_launch(name):
    """Verify on tensor cores copies each draft's row inputs in 16-byte chunks: a contiguous view at
    a 4-byte offset raises InputError naming the input before any launch (every buffer keeps its
    bytes), where the copy would fault and end the CUDA context; the same values in an array of
    their own then verify as an eager twin does."""
    import cupy as cp
    from replayssm_dsl.errors import InputError
    decl, shape, config, cache, twin, rng = _two_loaded_caches(name, seed=23)
    toks = {k: cp.asarray(v.astype(np.float32)) for k, v in random_tokens(decl, shape, rng, (2, 2)).items()}
    row_input = next(spec.name for spec in decl.inputs if spec.kind == "token" and spec.size == "V")
    offset = cp.empty(toks[row_input].size + 1, cp.float32)[1:].reshape(toks[row_input].shape)
    offset[...] = toks[row_input]
    before = buffers_snapshot(cache)
    with pytest.raises(InputError, match=rf"tokens\['{row_input}'\]: must start at a 16-byte aligned address"):
        cache.verify([0, 1], dict(toks, **{row_input: offset}), [2, 2])
    assert_buffers_kept(cp, cache, before, "after a refused verify")
    out = cache.verify([0, 1], toks, [2, 2], out=cp.full((2, 2, shape.heads, shape.v_dim), np.nan, cp.float32))
    assert_close(out, twin.verify([0, 1], toks, [2, 2]), 1e-6, "verify after the refusal")


@pytest.mark.parametrize("name", ["gdn", "kda", "mamba2"])
def test_gpu_rows_outside_the_cache_touch_nothing(name):
    """Device batch arrays are not checked on the host (graph path): a slot or page from another, larger
    cache must make the kernels skip the row. Every buffer keeps its bytes, the row's output stays
    poisoned, and the valid rows of the same batch still match an eager twin."""
    import cupy as cp
    decl, shape, config, cache, twin, rng = _two_loaded_caches(name, seed=12)
    bad = [(5, 1, 1), (1, 7, 1), (1, 1, 9), (1, 2, 1), (1, 1, 2), (1, -1, 1), (1, 1, -1),
           (2, 0, 0)]  # slot, src page, dst page: one of them outside [0, 2) (the last row is reused below)
    for step in range(6):  # through a flush (window 4)
        for slot, src, dst in bad:
            batch = _device_batch(cp, [0, slot], [0, src], [0, dst])
            before = buffers_snapshot(cache)
            toks = _step_tokens(cp, decl, shape, rng)
            out = cp.full((2, 1, shape.heads, shape.v_dim), np.nan, cp.float32)
            cache.launch_step(dict(batch, slot=cp.asarray([-1, slot], cp.int32)), toks, out)
            assert_buffers_kept(cp, cache, before, f"for row {(slot, src, dst)}")
            assert bool(cp.isnan(out).all()), "a skipped row wrote its output"
        cache.launch_step(batch, toks, out)  # row 0 valid, row 1 out of range
        want = twin.step([0], {k: v[:1, 0] for k, v in toks.items()})
        assert_close(out[:1, 0], want, 1e-6, f"valid row beside an out-of-range one, step {step}")
        assert bool(cp.isnan(out[1]).all())
    assert np.array_equal(cache.fills(), twin.fills())
    # draft counts the buffers cannot hold (0, or more than max_drafts), and accepted > drafted
    T = config.max_drafts + 1
    toks = {k: cp.asarray(v.astype(np.float32)) for k, v in random_tokens(decl, shape, rng, (2, T)).items()}
    for drafts, accepted in (([0, 1], [0, 0]), ([T, 1], [0, 0]), ([2, 1], [3, 0])):
        batch = _device_batch(cp, [0, 1], [0, 1], [0, 1], drafts, accepted)
        before = buffers_snapshot(cache)
        out = cp.full((2, T, shape.heads, shape.v_dim), np.nan, cp.float32)
        cache.launch_verify(dict(batch, slot=cp.asarray([0, -1], cp.int32)), toks, out)
        cache.launch_commit(dict(batch, slot=cp.asarray([0, -1], cp.int32)))
        if drafts[0] != 2:  # a verify of 0 or T_max + 1 drafts touches nothing
            assert bool(cp.isnan(out).all())
            assert_buffers_kept(cp, cache, before, f"for drafts {drafts}")
        else:  # a valid verify, then a commit of more than it drafted: the fill stays put
            assert np.array_equal(cache.fills(), to_host(before["fill"]))


@pytest.mark.parametrize("label", [None, "4x16/r96/s8", "4x16/r96/s8/w"], ids=["registers", "shared-rows", "register-writes"])
@pytest.mark.parametrize("name", ["gdn", "kda", "mamba2"])
def test_gpu_a_fill_no_kernel_writes_touches_nothing(name, label):
    """A corrupted fill (past capacity, negative, or all ones in the low 16 bits) makes the replay step
    skip the slot's row: with the row alone every buffer keeps its bytes, the fill included; beside a
    valid row through a flush, the slot's buffers keep theirs, its output stays poisoned and the other
    row still matches an eager twin (the CPU twin of this is test_cpu_row_checks). Also with shared
    rows, whose bulk copies the skipping CTA waits for before it exits, and with the write records
    loaded straight into registers."""
    import cupy as cp
    from replayssm_dsl.lowering.launch import LaunchConfig
    launch = LaunchConfig.from_label(label) if label else None
    decl, shape, config, cache, twin, rng = _two_loaded_caches(name, seed=13, launch=launch)
    batch = _device_batch(cp, [0, 1], [0, 1], [0, 1])
    slot_one = [key for key in ("checkpoint", "rec_write", "rec_decay", "rec_key", "fill") if key in cache.buffers]
    for bad_fill in (config.capacity + 1, -1, 2**16 - 1):
        cache.buffers["fill"][1] = bad_fill
        for step in range(5):  # slot 0 goes through a flush (window 4)
            toks = _step_tokens(cp, decl, shape, rng)
            out = cp.full((2, 1, shape.heads, shape.v_dim), np.nan, cp.float32)
            before = buffers_snapshot(cache)
            cache.launch_step(dict(batch, slot=cp.asarray([-1, 1], cp.int32)), toks, out)
            assert_buffers_kept(cp, cache, before, f"at fill {bad_fill}")
            assert bool(cp.isnan(out).all()), f"a row at fill {bad_fill} wrote its output"
            cache.launch_step(batch, toks, out)  # row 0 valid, row 1 at the corrupt fill
            for key in slot_one:
                assert cp.array_equal(before[key][1], cache.buffers[key][1], equal_nan=True), \
                    f"{key} of the slot at fill {bad_fill} changed beside a valid row, step {step}"
            want = twin.step([0], {k: v[:1, 0] for k, v in toks.items()})
            assert_close(out[:1, 0], want, 1e-6, f"valid row beside one at fill {bad_fill}, step {step}")
            assert bool(cp.isnan(out[1]).all())
    assert cache.fills()[0] == twin.fills()[0]


def test_gpu_torch_tensors_and_stream_without_copies():
    torch = pytest.importorskip("torch")
    decl, shape = ALL_DECLS["mamba2"], ModelShape(4, 2, 16, 32)
    rng = np.random.default_rng(8)
    params = random_params(decl, shape, rng)
    cache = cuda_cache()(decl, shape, ReplayConfig(window=4, max_drafts=2), slots=2, params=params)
    from replayssm_dsl.runtime.cpu_cache import CpuReplayCache
    ref = CpuReplayCache(decl, shape, ReplayConfig(window=4, max_drafts=2), slots=2, params=params)
    S0 = random_state(shape, rng, (2,))
    cache.load([0, 1], torch.tensor(S0, dtype=torch.float32, device="cuda"))
    ref.load([0, 1], S0)
    stream = torch.cuda.Stream()
    cache.stream = stream
    for i in range(9):
        toks = random_tokens(decl, shape, rng, (2,))
        with torch.cuda.stream(stream):
            tt = {k: torch.tensor(v, dtype=torch.float32, device="cuda") for k, v in toks.items()}
            out = torch.full((2, 1, shape.heads, shape.v_dim), float("nan"), device="cuda")
            cache.step([1, 0], tt, out=out)
        stream.synchronize()
        assert_close(out[:, 0].cpu().numpy(), ref.step([1, 0], toks), FP32_TOL, f"torch step {i}")


@pytest.mark.parametrize("name", ["gdn", "mamba2"])
def test_gpu_host_tensors_in_and_host_outputs_refused(name):
    """CPU torch tensors as tokens are copied over and give the NumPy tokens' outputs; an ``out=`` on the
    host is refused naming it before any launch (a device copy of it would take the outputs and the
    array keep none); the baselines' state exists only once a baseline has run."""
    import cupy as cp
    torch = pytest.importorskip("torch")
    from replayssm_dsl.errors import InputError
    decl, shape, config, cache, twin, rng = _two_loaded_caches(name, seed=31)
    assert "state" not in cache.buffers, "a cache that only replays allocated the baselines' state"
    toks = random_tokens(decl, shape, rng, (2,))
    before = buffers_snapshot(cache)
    with pytest.raises(InputError, match=r"out: must be a device array \(CuPy or a torch CUDA tensor\)"):
        cache.step([0, 1], toks, out=np.full((2, 1, shape.heads, shape.v_dim), np.nan, np.float32))
    assert_buffers_kept(cp, cache, before, "after a refused step")
    got = cache.step([0, 1], {k: torch.tensor(v) for k, v in toks.items()},
                     out=cache.poisoned((2, 1, shape.heads, shape.v_dim)))
    assert_close(to_host(got), to_host(twin.step([0, 1], toks)), 1e-6, "step from CPU torch tokens")
    as_returned = cache.poisoned((2, shape.heads, shape.v_dim))  # out= of the shape step returns
    cache.step([0, 1], toks, out=as_returned)
    assert_close(to_host(as_returned), to_host(twin.step([0, 1], toks)), 1e-6, "step into out= [B, HV, V]")
    out = cache.conventional_step([0, 1], toks, out=cache.poisoned((2, 1, shape.heads, shape.v_dim)))
    assert cache.buffers["state"].shape == (2, shape.heads, shape.v_dim, shape.k_dim)
    assert np.isfinite(to_host(out)).all(), "the conventional step from the zero state wrote no output"


@pytest.mark.parametrize("label", [None, "4x8", "8x8"], ids=["small-batch-default", "4x8", "8x8"])
@pytest.mark.parametrize("name", ["gdn", "kda", "mamba2"])
def test_gpu_keys_longer_than_128_match_oracle(name, label):
    """K = 144: each lane holds two pieces of every row along K (``key_chunks``), at the launch shapes
    ``choose_launch`` takes there (``4x4`` for few rows, ``4x8`` for the steps and ``8x8`` for verify
    at large batches), through steps, flushes, verify of 1–8 drafts and commits."""
    from replayssm_dsl.lowering.launch import LaunchConfig
    shape = ModelShape(2, 1, 128, 144)
    twin = ReplayTwin(cuda_cache(), ALL_DECLS[name], shape, ReplayConfig(window=16, max_drafts=8),
                      np.random.default_rng(13), slots=3, tol=FP32_TOL,
                      launch=LaunchConfig.from_label(label) if label else None)
    twin.load([0, 1, 2])
    for i in range(3):  # stagger the fills
        for _ in range(i * 5):
            twin.step([i])
    for i in range(60):
        twin.step([2, 0, 1])
        if i % 9 == 0:
            toks = twin.verify([0, 1, 2], [8, 3, 1 + i % 4])
            twin.commit([0, 1, 2], toks, [i // 9, 3, 1])
    twin.check_materialize([0, 1, 2])
    assert twin.max_err <= FP32_TOL
