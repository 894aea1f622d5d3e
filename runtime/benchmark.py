"""Runtime layer: the GPU benchmark behind ``replayssm bench`` (needs a GPU, CuPy; torch + fla optional).

For each preset shape and batch size it times, in one run and the same way (CUDA graphs of whole
decode steps, replayed round-robin over several input sets, CUDA events, median):
the generated conventional step; the replay step in the mixed steady state (slot ``b`` at fill
``b mod L``, so ``1/L`` of the batch flushes at every step and the phases rotate; the median over
whole rotations of ``L`` steps of their mean, so that a batch smaller than ``L`` is timed right); the flush alone;
verify ``T ∈ {2, 4, 8}`` with its commit (accepting none, so the fills stay put); verify ``T = 8`` in
a speculative steady state (row ``b`` accepts ``b mod 9`` drafts, so the fills move and the rows
whose buffer would overflow fold first, as in an engine); the snapshot-verify baseline; FLA's ``fused_recurrent_*``
for the same shape (captured in a torch CUDA graph when ``fla`` imports); and the memory floors (a
state-sized copy and read, timed eagerly). Every timed launch is queued behind a short busy kernel
(``hold_gpu``), so the events measure the GPU's time and not the host's enqueueing. ``--kernels`` times a subset (and tunes only the launch
groups it needs), for quick side-by-side runs of one change. Writes ``results.json``, ``results.md`` and
``speedup.png`` (when matplotlib is present) and prints the table.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path

import numpy as np

from replayssm_dsl import ReplayConfig, knobs, variants
from replayssm_dsl.bfloat16 import bfloat16_bits
from replayssm_dsl.config import PRESETS, RAW_RECORD_FIELDS
from replayssm_dsl.errors import InputError
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.buffer_rules import verify_flushes
from replayssm_dsl.lowering.record_keys import key_shift
from replayssm_dsl.lowering.traffic import Traffic, kernel_traffic, replay_step_amortized, verify_mixed
from replayssm_dsl.random_inputs import random_params, random_tokens

INPUT_SETS = 4
TIMING_WARMUP = 3  # untimed launches before each timed series


def median_of_rotations(times, rotation: int = 1) -> float:
    """The median, over whole rotations of ``rotation`` consecutive launches, of their mean time.

    The replay step's batch passes through every phase of its buffer in ``L`` steps (each slot flushes
    once and ends at the fill it started from), so its mean step is the mean over a rotation. With a
    batch smaller than ``L`` the steps alternate between ones with and without a flush, and a plain
    median would pick one of the two."""
    times = np.asarray(times, dtype=np.float64)
    whole = len(times) // rotation * rotation
    if whole == 0:
        raise ValueError(f"times: {len(times)} launches, fewer than one rotation of {rotation}")
    return float(np.median(times[:whole].reshape(-1, rotation).mean(axis=1)))


SPIN_NS = 100_000  # longer than the host takes to enqueue an event, a launch (graph, eager or torch) and an event
# (the device machine's host took up to 55 us for an eager CuPy copy and its events, so 40 us was not enough)

_SPIN_SOURCE = r'''
extern "C" __global__ void spin(unsigned long long ns) {  // one thread: busy until ns have passed
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}'''
_spin_kernels = {}


def hold_gpu(cp, stream) -> None:
    """Enqueue ``SPIN_NS`` of busy GPU work on ``stream``. Timed launches
    come right after it, so the start event is recorded when the GPU reaches it, with the launch already
    queued behind it: the time is the GPU's, not the host's enqueueing of the launch (which an engine's
    graph of many layers does not pay per layer)."""
    device = cp.cuda.Device().id
    if device not in _spin_kernels:
        _spin_kernels[device] = cp.RawKernel(_SPIN_SOURCE, "spin")
    with stream:
        _spin_kernels[device]((1,), (1,), (np.uint64(SPIN_NS),))


def warn_if_enqueue_outlasts_hold(enqueue_s) -> None:
    """Warn when the host took longer to enqueue a timed launch than ``hold_gpu`` holds the GPU (median
    over the launches): then the GPU idles before the launch, and that idling is in the times."""
    median_us = float(np.median(enqueue_s)) * 1e6
    if median_us > 0.8 * SPIN_NS / 1e3:
        warnings.warn(f"host enqueue took {median_us:.1f} us per timed launch (median), near or over the "
                      f"{SPIN_NS / 1e3:.0f} us busy kernel: these times include the host's enqueueing; "
                      "raise runtime.benchmark.SPIN_NS", RuntimeWarning, stacklevel=3)


def _median_ms(cp, launch, reps: int, warmup: int = TIMING_WARMUP, rotation: int = 1) -> float:
    """CUDA-event time of ``launch(i)``, ms: the median of ``reps`` rotations (``median_of_rotations``),
    each launch queued behind ``hold_gpu`` so that only GPU time is measured."""
    stream = cp.cuda.get_current_stream()
    for i in range(warmup):
        launch(i)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times, enqueue = [], []
    for i in range(reps * rotation):
        hold_gpu(cp, stream)
        t0 = time.perf_counter()
        start.record(stream)
        launch(i)
        end.record(stream)
        enqueue.append(time.perf_counter() - t0)
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    warn_if_enqueue_outlasts_hold(enqueue)
    return median_of_rotations(times, rotation)


def mixed_steady_state(cache, rows: int) -> dict:
    """Put slot b at buffer fill b mod L (so 1/L of a batch of ``rows`` flushes at every step) and return
    the batch's device arrays (slot b in row b)."""
    cp = cache.cp
    cache.buffers["fill"][...] = cp.arange(rows, dtype=cp.int32) % cache.config.window
    return {k: cp.asarray(v) for k, v in cache._batch(np.arange(rows, dtype=np.int32)).items()}


def verify_inputs(cp, decl, shape, rng, batch: dict, t: int, sets: int = 1) -> tuple[list, dict, object]:
    """Verify with ``t`` drafts as the benchmark times it: ``sets`` device token sets ``[rows, t, ...]``,
    the batch (device arrays of ``rows`` rows) with ``drafts`` = t and ``accepted`` = 0, so its commit
    leaves the fills where they are, and an output ``[rows, t, HV, V]``."""
    from .cuda_cache import device_tokens

    rows = int(batch["slot"].shape[0])
    tokens = [device_tokens(cp, decl, random_tokens(decl, shape, rng, (rows, t))) for _ in range(sets)]
    drafted = dict(batch, drafts=cp.full(rows, t, cp.int32), accepted=cp.zeros(rows, cp.int32))
    return tokens, drafted, cp.empty((rows, t, shape.heads, shape.v_dim), cp.float32)


def speculative_accepts(rows: int, drafts: int) -> np.ndarray:
    """Accepted drafts per row in the speculative steady state: row b accepts b mod (T + 1), so every
    count from 0 to T is present (mean T / 2) and the rows' fills drift apart."""
    return (np.arange(rows) % (drafts + 1)).astype(np.int32)


def speculative_fold_share(fills, accepts, drafts: int, config, skip: int, rounds: int) -> float:
    """The share of verify rows that fold their buffer first (``flush_for_verify``) over rounds
    ``skip .. skip + rounds`` of verify + commit from ``fills``, by the buffer rules on the host
    (``verify_flushes``, elementwise over the rows), and commit sets the fill to (0 if folded else n) + a."""
    fills = np.array(fills, dtype=np.int64)
    folds = 0
    for r in range(skip + rounds):
        fold = verify_flushes(fills, drafts, config.window, config.max_drafts)
        folds += int(fold.sum()) if r >= skip else 0
        fills = np.where(fold, 0, fills) + accepts
    return folds / (len(fills) * rounds)


def time_speculative(cp, cache, batch: dict, tokens: list, out, t: int, reps: int) -> tuple[float, float]:
    """Verify of ``t`` drafts with commits that accept (``speculative_accepts``) from the mixed steady
    state's fills (row b at b mod L), over the two token sets ``tokens``: the fills move and some rows
    fold first. The share that folds varies from round to round (at B = 256 from 11 to 26 %), so the
    time is the median over rotations of L rounds of their mean, as for the replay step. Returns that
    time (ms) and the share of rows that folded over the timed rounds (``speculative_fold_share``, from
    the same fills and accepts). The fills are put back after."""
    rows, window = int(batch["slot"].shape[0]), cache.config.window
    start, accepts = np.arange(rows, dtype=np.int32) % window, speculative_accepts(rows, t)
    batch = dict(batch, accepted=cp.asarray(accepts))
    cache.buffers["fill"][...] = cp.asarray(start)
    stream, graphs = capture_graphs(cp, lambda i: verify_and_commit(cache, batch, tokens[i], out, t), 2)
    ms = time_graphs(cp, stream, graphs, reps, rotation=window)
    cache.buffers["fill"][...] = cp.asarray(start)  # back to the mixed steady state's fills
    # before the timed rounds: one untimed launch per graph (capture_graphs) and the warm-up replays
    untimed = len(graphs) + TIMING_WARMUP
    return ms, speculative_fold_share(start, accepts, t, cache.config, skip=untimed, rounds=reps * window)


def verify_and_commit(cache, batch: dict, tokens: dict, out, t: int) -> None:
    cache.launch_verify(batch, tokens, out)
    cache.launch_commit(batch, t)


def capture_graphs(cp, build, sets: int):
    """Capture ``build(i)`` (a sequence of launches on input set ``i``) into one graph per set."""
    stream = cp.cuda.Stream(non_blocking=True)
    graphs = []
    with stream:
        for i in range(sets):
            build(i)  # warm: compile, load
            stream.synchronize()
            stream.begin_capture()
            build(i)
            graphs.append(stream.end_capture())
    return stream, graphs


def time_graphs(cp, stream, graphs, reps: int, rotation: int = 1) -> float:
    """Replay the graphs round-robin (one launch each): the median of ``reps`` rotations, ms."""
    with stream:
        return _median_ms(cp, lambda i: graphs[i % len(graphs)].launch(stream), reps, rotation=rotation)


def _floors(cp, nbytes: int, reps: int) -> tuple[float, float]:
    """Eager copy (read + write) and read of a state-sized buffer, ms."""
    n = nbytes // 4
    a, b = cp.ones(n, cp.float32), cp.empty(n, cp.float32)
    read = cp.RawKernel(r'''
extern "C" __global__ void read_floor(const float4* __restrict__ x, long n4, float* out) {
    float acc = 0.f;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
        float4 v = x[i]; acc += v.x + v.y + v.z + v.w;
    }
    if (acc == 12345.f) out[0] = acc;
}''', "read_floor")
    sink = cp.zeros(1, cp.float32)
    copy_ms = _median_ms(cp, lambda i: cp.copyto(b, a), reps)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    read_ms = _median_ms(cp, lambda i: read((sms * 8,), (512,), (a, np.int64(n // 4), sink)), reps)
    return copy_ms, read_ms


KERNELS = ("replay", "flush", "conventional", "verify", "speculative", "snapshot", "fla", "floors")
"""What ``--kernels`` can choose; the default times all of them."""
# the tuning groups each needs; verify's commit is a fill kernel (a thread per row, no tile shape),
# so verify does not need the replay group although commit loads from its module
_GROUPS = {"replay": ("replay",), "flush": ("replay",), "conventional": ("conventional",),
           "verify": ("verify", "verify_few"), "speculative": ("verify",), "snapshot": ("conventional",)}
_GROUP_ORDER = ("replay", "verify", "verify_few", "conventional")  # as the launch column lists them


def tuned_groups(kernels) -> list[str]:
    """The launch groups that timing ``kernels`` tunes, in ``_GROUP_ORDER``."""
    wanted = {g for k in kernels for g in _GROUPS.get(k, ())}
    return [g for g in _GROUP_ORDER if g in wanted]


def preset_setup(name: str, token_dtype: str = "float32", record_dtype: str = "float32",
                 raw_record_fields: tuple = RAW_RECORD_FIELDS):
    """A preset's declaration (its token inputs arriving as ``token_dtype``), shape, replay settings
    (L = 16, T_max = 8, ``record_dtype``, ``raw_record_fields``), seeded generator and parameters, as the benchmark (and the
    measurement scripts) set them up."""
    p = PRESETS[name]
    decl, shape = variants.get(p.variant), p.shape
    config = ReplayConfig(window=16, max_drafts=8, record_dtype=record_dtype, raw_record_fields=raw_record_fields)
    if token_dtype != "float32":
        decl = decl.with_token_dtype(token_dtype)
    rng = np.random.default_rng(0)
    return decl, shape, config, rng, random_params(decl, shape, rng)


def tuner_sources(presets, kernels, token_dtype: str = "float32", record_dtype: str = "float32",
                  raw_record_fields: tuple = RAW_RECORD_FIELDS) -> list[str]:
    """The modules that the tuner will load for ``presets`` (every candidate of the groups that
    ``kernels`` need, ``tuning_sources``), every preset's, to compile in one pool."""
    from .autotune import tuning_sources

    groups = tuned_groups(kernels)
    sources = []
    for name in presets:
        decl, shape, config, _, _ = preset_setup(name, token_dtype, record_dtype, raw_record_fields)
        program = lower(decl, shape, config)
        sources += [source for g in groups for source in tuning_sources(program, g)]
    return list(dict.fromkeys(sources))


def parse_kernels(text: str) -> tuple[str, ...]:
    """``--kernels``: comma-separated names from ``KERNELS``; a clear error names an unknown one."""
    names = tuple(k for k in text.split(",") if k)
    unknown = [k for k in names if k not in KERNELS]
    if unknown or not names:
        raise InputError(f"--kernels: {', '.join(unknown) or 'nothing'} not among {', '.join(KERNELS)}")
    return names


def bench_one(cp, preset_name: str, batch: int, reps: int, kernels=KERNELS,  # noqa: C901 - one measurement
              token_dtype: str = "float32", record_dtype: str = "float32",
              raw_record_fields: tuple = RAW_RECORD_FIELDS) -> dict:
    from .autotune import VERIFY_FEW_DRAFTS, tune_step
    from .cuda_cache import CudaReplayCache, device_tokens

    p = PRESETS[preset_name]
    decl, shape, config, rng, params = preset_setup(preset_name, token_dtype, record_dtype, raw_record_fields)
    tuned = {g: tune_step(decl, shape, config, params, batch, group=g) for g in tuned_groups(kernels)}
    cache = CudaReplayCache(decl, shape, config, slots=batch, params=params)
    HV, V, K = shape.heads, shape.v_dim, shape.k_dim
    cache.buffers["checkpoint"][...] = cp.asarray(rng.standard_normal((1, HV, V, K), np.float32) * 0.1)
    cache.baseline_state()[...] = cache.buffers["checkpoint"]
    cache.buffers["rec_write"][...] = 0.01
    key = 0.05 * math.exp(key_shift(decl, config) or 0.0)  # decay-scaled keys e^{C - G} k: k = 0.05 at G = 0
    cache.buffers["rec_key"][...] = key if cache.buffers["rec_key"].dtype == cp.float32 else int(bfloat16_bits([0.05])[0])
    batch_dev = mixed_steady_state(cache, batch)
    one = [device_tokens(cp, decl, {k: v[:, None] for k, v in random_tokens(decl, shape, rng, (batch,)).items()})
           for _ in range(INPUT_SETS)]
    out1 = cp.empty((batch, 1, HV, V), cp.float32)
    prefix = {"replay": "", "verify": "ver ", "verify_few": f"ver{VERIFY_FEW_DRAFTS} ", "conventional": "conv "}
    res = {"preset": preset_name, "variant": p.variant, "B": batch, "token_dtype": token_dtype, "record_dtype": record_dtype,
           **({"raw_record_fields": list(raw_record_fields)} if record_dtype != "float32" else {}),
           "launch": "; ".join(prefix[g] + launch.label for g, (launch, _) in tuned.items())}
    for g, (_, timings) in tuned.items():
        res[("" if g == "replay" else g + "_") + "tuning_ms"] = {k.label: v for k, v in timings.items()}

    if "replay" in kernels:
        stream, graphs = capture_graphs(cp, lambda i: cache.launch_step(batch_dev, one[i], out1), INPUT_SETS)
        res["replay_step"] = time_graphs(cp, stream, graphs, reps, rotation=config.window)
    if "conventional" in kernels:
        stream, graphs = capture_graphs(cp, lambda i: cache._launch("conventional_step", batch, batch_dev, one[i], out=out1),
                                        INPUT_SETS)
        res["conventional_step"] = time_graphs(cp, stream, graphs, reps)
    if "flush" in kernels:
        stream, graphs = capture_graphs(cp, lambda i: cache._launch("flush", batch, batch_dev), 1)
        res["flush"] = time_graphs(cp, stream, graphs, reps)
    for t in (2, 4, 8) if "verify" in kernels else ():
        toks, vb, outt = verify_inputs(cp, decl, shape, rng, batch_dev, t, sets=2)
        stream, graphs = capture_graphs(cp, lambda i, toks=toks, vb=vb, outt=outt, t=t:
                                        verify_and_commit(cache, vb, toks[i], outt, t), 2)
        res[f"verify_T{t}"] = time_graphs(cp, stream, graphs, reps)
    if "speculative" in kernels:  # verify T = T_max with commits that accept: the fills move, some rows fold
        t = config.max_drafts
        toks, vb, outt = verify_inputs(cp, decl, shape, rng, batch_dev, t, sets=2)
        res[f"verify_spec_T{t}"], res["spec_fold_share"] = time_speculative(cp, cache, vb, toks, outt, t, reps)
    if "snapshot" in kernels:
        t = 8
        snaps = cp.empty((batch, t, HV, V, K), cp.float32)
        vb = dict(batch_dev, drafts=cp.full(batch, t, cp.int32))
        stoks = device_tokens(cp, decl, random_tokens(decl, shape, rng, (batch, t)))
        outt = cp.empty((batch, t, HV, V), cp.float32)
        stream, graphs = capture_graphs(cp, lambda i: cache._launch("snapshot_verify", batch, vb, stoks, out=outt,
                                                                    snapshots=snaps), 1)
        res["snapshot_verify_T8"] = time_graphs(cp, stream, graphs, max(5, reps // 4))
        del snaps
    state_bytes = batch * HV * V * K * 4
    if "floors" in kernels:
        res["copy_floor"], res["read_floor"] = _floors(cp, state_bytes, reps)
        program = cache.program
        amort = replay_step_amortized(program)
        rates = (state_bytes / res["read_floor"], 2 * state_bytes / res["copy_floor"])  # bytes per ms
        heads = batch * HV
        res["replay_floor"] = floor_ms(amort, heads, *rates, with_io=False)
        res["verify_floor"] = floor_ms(verify_mixed(program, 8), heads, *rates, with_io=True)
        res["traffic_ratio"] = kernel_traffic(program, "conventional_step", 0).total / amort.total
    if "fla" in kernels:
        from .bench_fla import fla_step  # (torch and fla, where they import, only when FLA is timed)
        res["fla_step"], res["fla_mode"] = fla_step(p.variant, shape, batch, INPUT_SETS, reps, token_dtype)
    res["state_MB"] = state_bytes / 1e6
    cache = None  # its buffers back to the pool before the next preset
    cp.get_default_memory_pool().free_all_blocks()
    return res


def floor_ms(traffic: Traffic, heads: int, read_bw: float, copy_bw: float, with_io: bool) -> float:
    """The time ``traffic`` (bytes per value head) takes for ``heads`` heads at the measured bandwidths
    (bytes per ms): a byte read at the state-sized read's rate, a byte written at what a copy pays for
    its byte pair. The replay step's floor counts state and records only (docs/design.md's traffic model);
    verify's counts its tokens and outputs too (``with_io``)."""
    reads = traffic.state_read + traffic.record_read + (traffic.token_read if with_io else 0.0)
    writes = traffic.state_write + traffic.record_write + (traffic.output_write if with_io else 0.0)
    return heads * reads / read_bw + heads * writes * 2 / copy_bw


def _ratio(r: dict, a: str, b: str) -> float:
    """r[a] / r[b], NaN where either was not timed (``--kernels``) or FLA was absent."""
    return r[a] / r[b] if r.get(a) and r.get(b) else float("nan")


COLUMNS = [("B", "B", "{:d}"), ("launch", "launch", "{}"), ("conv", "conventional_step", "{:.3f}"), ("replay", "replay_step", "{:.3f}"),
           ("flush", "flush", "{:.3f}"), ("ver2", "verify_T2", "{:.3f}"), ("ver4", "verify_T4", "{:.3f}"),
           ("ver8", "verify_T8", "{:.3f}"), ("spec8", "verify_spec_T8", "{:.3f}"), ("snap8", "snapshot_verify_T8", "{:.3f}"), ("fla", "fla_step", "{:.3f}"),
           ("copy", "copy_floor", "{:.3f}"), ("read", "read_floor", "{:.3f}"), ("rfloor", "replay_floor", "{:.3f}"),
           ("vfloor", "verify_floor", "{:.3f}")]


RATIOS = [("replay/rfloor", "replay_step", "replay_floor"), ("conv/copy", "conventional_step", "copy_floor"),
          ("conv/replay", "conventional_step", "replay_step"), ("fla/replay", "fla_step", "replay_step"),
          ("ver8/conv", "verify_T8", "conventional_step"), ("snap8/ver8", "snapshot_verify_T8", "verify_T8"),
          ("ver8/vfloor", "verify_T8", "verify_floor"),
          # the most a replay step at its floor could be faster than FLA's step
          ("fla/rfloor", "fla_step", "replay_floor")]


def markdown(results: list[dict]) -> str:
    lines = ["All times ms per decode step of one layer (median over CUDA-graph replays; floors eager; every timed",
             "launch queued behind a busy kernel, so the host's enqueueing is not timed).",
             "`rfloor` = replay step's floor from the traffic model at the measured read/copy bandwidths;",
             "`vfloor` = verify T = 8's (with its fold, at the mixed fills; its tokens and outputs counted too);",
             "`fla/rfloor` = the most a replay step at its floor could be faster than FLA's step.", ""]
    for preset_name in dict.fromkeys(r["preset"] for r in results):
        rows = [r for r in results if r["preset"] == preset_name]
        lines += [f"### {preset_name} ({rows[0]['variant']})", "",
                  "| " + " | ".join([c for c, _, _ in COLUMNS] + [name for name, _, _ in RATIOS]) + " |",
                  "|" + "---|" * (len(COLUMNS) + len(RATIOS))]
        for r in rows:
            cells = [fmt.format(r[k]) if r.get(k) is not None else "n/a" for _, k, fmt in COLUMNS]
            ratios = [_ratio(r, a, b) for _, a, b in RATIOS]
            lines.append("| " + " | ".join(cells + ["n/a" if np.isnan(x) else f"{x:.2f}" for x in ratios]) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> bool:
    """The replay step's speedup over the conventional step against B, a line per preset; False (no
    plot) without matplotlib or when ``--kernels`` left out either step."""
    results = [r for r in results if r.get("replay_step") and r.get("conventional_step")]
    if not results:
        return False
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for preset_name in dict.fromkeys(r["preset"] for r in results):
        rows = [r for r in results if r["preset"] == preset_name]
        ax.plot([r["B"] for r in rows], [r["conventional_step"] / r["replay_step"] for r in rows], marker="o", label=preset_name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("speedup of replay step over conventional step")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(args) -> int:
    kernels = parse_kernels(args.kernels)
    from .cuda_module import require_gpu
    from .parallel_compile import warm_kernel_cache
    cp = require_gpu("replayssm bench")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    presets = [p for p in args.presets.split(",") if p]
    if args.quick:
        batches = [b for b in batches if b in (1, 32, 256)] or batches
    reps = 20 if args.quick else 60
    t0 = time.time()
    workers = knobs.compile_workers()
    if workers > 1:  # every candidate compiled at once: the tuner's loads below find them in CuPy's cache
        sources = tuner_sources(presets, kernels, args.token_dtype, args.record_dtype, args.raw_record_fields)
        failed = warm_kernel_cache(sources, workers)
        print(f"compiled {len(sources)} modules for the tuner on {workers} threads in {time.time() - t0:.0f}s"
              + (f" ({len(failed)} failed: their loads report why)" if failed else ""), flush=True)
    results = []
    for preset_name in presets:
        for batch in batches:
            r = bench_one(cp, preset_name, batch, reps, kernels, args.token_dtype, args.record_dtype, args.raw_record_fields)
            results.append(r)
            # rewritten after every row: a run cut short keeps what it measured
            (out / "results.json").write_text(json.dumps(results, indent=1))
            times = "  ".join(f"{name} {r[key]:.3f}" for name, key, _ in COLUMNS[2:] if r.get(key))
            print(f"{preset_name:<20} B={batch:<4} launch {r['launch']}  {times}  ({time.time() - t0:.0f}s)", flush=True)
    write_table_and_plot(results, out)
    return 0


def write_table_and_plot(results: list[dict], out: Path) -> None:
    """``results.md`` and ``speedup.png`` (with matplotlib) in ``out``; the table printed last."""
    table = markdown(results)
    (out / "results.md").write_text(table)
    plotted = plot(results, out / "speedup.png")
    print(table)
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}" + (f", {out / 'speedup.png'}" if plotted else
                                                                    " (no plot: no matplotlib, or no replay and conventional step)"))
