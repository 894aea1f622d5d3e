"""Time the step kernels behind a producer of their tokens, launched as programmatic dependents.

A measurement script for the GPU machine (not part of the library). In an engine the decode step of a
layer runs right after the kernel that produces its tokens (the projections), and what the step reads
first, the slot, the fill, the checkpoint rows and the records, does not depend on those tokens. With
programmatic dependent launch (PDL: the step launched with ``programmaticStreamSerializationAllowed``,
a ``griddepcontrol.wait`` before its first token read, the producer's CTAs calling
``griddepcontrol.launch_dependents``) the step's CTAs can start, and load their state rows, while the
producer still runs; the wait holds each thread until the producer has finished and its writes are
visible.

For each preset and batch size, at the launches the tuner picked (``B1_LAUNCHES`` at B = 1,
``launch_overhead.LAUNCHES``, B = 256's, otherwise), this times, with CUDA graphs behind the
benchmark's busy kernel (``capture_graphs`` / ``time_graphs``):

* the producer alone: a grid-stride copy of the step's token bytes from a source set into the arrays the
  step reads;
* each step alone (the benchmark's way) and behind the producer as a plain launch, unedited and with
  each of ``PDL_EDITS`` (the wait right before the first token read, the token prefetches dropped;
  or, in the replay step, the wait once the state rows' loads are issued, before the fill's barrier,
  the prefetches right after it), and each edited step behind the producer as a programmatic
  dependent (``--eager``: that pair also launched eagerly, both ways; ``--bounds``: also the replay
  step's ``BOUNDS``, e.g. without its head-level phases, whose results are wrong and not checked);
* FLA's step alone and behind the producer (FLA's Triton kernels have no wait, so a plain launch).

A step's time behind the producer is the pair's time less the producer's. Before timing, every
preset's PDL launch is checked against the plain one: the tokens are poisoned (NaN) before the
producer writes them, so a thread that read a token early would give a NaN; outputs, fills,
checkpoints and records must match bit for bit.

Usage: ``python scripts/experiment_pdl.py --presets kimi-linear,qwen3.5-4b --batches 1,256``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import re
import sys
from pathlib import Path

import numpy as np

from replayssm_dsl.config import preset
from replayssm_dsl.lowering.launch import LaunchConfig, grid_of
from replayssm_dsl.random_inputs import random_tokens
from replayssm_dsl.runtime import cuda_module
from replayssm_dsl.runtime.benchmark import _median_ms, capture_graphs, mixed_steady_state, preset_setup, time_graphs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment_variants import NO_HEAD_PHASES, patched_renderer, scratch_cache  # noqa: E402
from launch_overhead import LAUNCHES  # noqa: E402
from source_edits import in_kernel  # noqa: E402

STEP_KERNELS = ("replay_step", "conventional_step")
B1_LAUNCHES = {  # preset: (replay step, conventional step), the launches the tuner picked at B = 1 (the b5dc7a8 run)
    "nemotron-nano-4b": ("4x8", "4x8/r80"),
    "nemotron-super-120b": ("4x8/r80", "4x8"),
    "qwen3.5-4b": ("4x8/r80", "4x8/r80"),
    "qwen3.5-122b": ("4x8/r80", "4x8/r80"),
    "kimi-linear": ("8x4/r64", "4x8/r80"),
}
FIRST_TOKEN_READ = "    if (warp == 0 % WARPS) {  // the one token's query\n"
PREFETCH = re.compile(r"^    if \(warp == \d+ % WARPS.*prefetch_l1\(tok_.*\n", re.M)
WAIT = '    asm volatile("griddepcontrol.wait;" ::: "memory");  // the tokens: written by the kernel before\n'

PRODUCER_SOURCE = r'''
extern "C" __global__ void produce_tokens(const float4* __restrict__ src, float4* __restrict__ dst, long n4) {
    asm volatile("griddepcontrol.launch_dependents;");  // the step behind may start on the SMs left
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}'''


def wait_at(marker_of: dict, keep_prefetches: bool):
    """An edit of a step kernel's text: the wait before its line ``marker_of[kernel]``, and its token
    prefetches dropped (they would read before the wait) or moved to right after the wait."""
    def edit_for(kernel: str):
        def edit(text: str) -> str:
            marker = marker_of[kernel]
            if text.count(marker) != 1:
                raise SystemExit(f"PDL edit does not apply: {marker.strip()!r} is not in {kernel} once")
            prefetches = "".join(PREFETCH.findall(text)) if keep_prefetches else ""
            text = PREFETCH.sub("", text)
            return text.replace(marker, WAIT + prefetches + marker, 1)
        return in_kernel(kernel, edit)
    return [edit_for(kernel) for kernel in STEP_KERNELS]


FILL_BARRIER = "    __syncthreads();  // thread 0's arrival holds the fill\n"  # the replay step's rows are in flight by then
PDL_EDITS = {  # label: the edit of both step kernels
    "wait before tokens": wait_at(dict.fromkeys(STEP_KERNELS, FIRST_TOKEN_READ), keep_prefetches=False),
    "wait after rows issued": wait_at({"replay_step": FILL_BARRIER, "conventional_step": FIRST_TOKEN_READ},
                                      keep_prefetches=True),
}
PDL_EDIT = PDL_EDITS["wait before tokens"]
UNEDITED = "unedited"
BOUNDS = {  # label: a bound (results wrong, time right), timed with --bounds beside the edits, not checked;
    # for B = 1's launches (at nano's B = 256 launch this one spills 4 bytes)
    "wait before tokens, no head-level phases (bound)": PDL_EDIT + NO_HEAD_PHASES,
}


class PdlLauncher:
    """``CompiledProgram.launch_kernel`` replaced: kernels in ``self.kernels`` launch through
    ``cuLaunchKernelEx`` as programmatic dependents of the launch before them on the stream."""

    def __init__(self, cp):
        from cuda.bindings import driver
        self.cp, self.driver, self.kernels = cp, driver, set()
        self.original = cuda_module.CompiledProgram.launch_kernel
        launcher = self

        def launch_kernel(program, name, rows, args, stream=None):
            if name not in launcher.kernels:
                return launcher.original(program, name, rows, args, stream)
            grid, block = grid_of(program.program.kernel(name), program.program, program.launch, rows)
            stream = cuda_module.as_cupy_stream(stream)
            with stream if stream is not None else contextlib.nullcontext():
                launcher.launch(program.kernel(name), grid, block, program.dynamic_shared[name], args)
        cuda_module.CompiledProgram.launch_kernel = launch_kernel

    def launch(self, kernel, grid, block, shared: int, args) -> None:
        drv = self.driver
        config = drv.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = (tuple(grid) + (1, 1))[:3]
        config.blockDimX, config.blockDimY, config.blockDimZ = (tuple(block) + (1, 1))[:3]
        config.sharedMemBytes = shared
        config.hStream = drv.CUstream(self.cp.cuda.get_current_stream().ptr)
        attribute = drv.CUlaunchAttribute()
        attribute.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attribute.value.programmaticStreamSerializationAllowed = 1
        config.attrs = [attribute]
        config.numAttrs = 1
        values, types = [], []
        for arg in args:
            if isinstance(arg, self.cp.ndarray):
                values.append(arg.data.ptr)
                types.append(ctypes.c_void_p)
            else:
                if isinstance(arg, (float, np.floating)) or not -2**31 <= int(arg) < 2**31:
                    raise TypeError(f"kernel argument {arg!r} is not a 32-bit integer")
                values.append(int(arg))
                types.append(ctypes.c_int)
        err, = drv.cuLaunchKernelEx(config, drv.CUfunction(getattr(kernel, "kernel", kernel).ptr), (tuple(values), tuple(types)), 0)
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernelEx: {err}")


def token_sets(cp, decl, shape, rng, rows: int, sets: int):
    """Per set: the step's token arrays as views of one flat float32 buffer (each field 16-byte aligned),
    and a source buffer of the same size the producer copies from (fresh random values)."""
    out = []
    for _ in range(sets):
        fields = {k: v[:, None].astype(np.float32) for k, v in random_tokens(decl, shape, rng, (rows,)).items()}
        sizes = {k: -(-v.size // 4) * 4 for k, v in fields.items()}
        flat = np.zeros(sum(sizes.values()), np.float32)
        offset, views = 0, {}
        dest = cp.empty(flat.size, cp.float32)
        for k, v in fields.items():
            flat[offset:offset + v.size] = v.ravel()
            views[k] = dest[offset:offset + v.size].reshape(v.shape)
            offset += sizes[k]
        out.append((cp.asarray(flat), dest, views))
    return out


def measure(cp, name: str, rows: int, launches: tuple[str, str], pdl: PdlLauncher, producer, reps: int,
            eager: bool = False, bounds: bool = False) -> dict:
    decl, shape, config, rng, params = preset_setup(name)
    sets = token_sets(cp, decl, shape, rng, rows, 4)
    out = cp.empty((rows, 1, shape.heads, shape.v_dim), cp.float32)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    L = config.window

    def produce(i):
        src, dest, _ = sets[i % len(sets)]
        producer((sms * 4,), (256,), (src, dest, np.int64(src.size // 4)))

    res = {"producer": time_graphs(cp, *capture_graphs(cp, produce, len(sets)), reps)}
    for kernel, label in zip(STEP_KERNELS, launches):
        rotation = L if kernel == "replay_step" else 1
        versions = {UNEDITED: [], **PDL_EDITS, **(BOUNDS if bounds and kernel == "replay_step" else {})}
        for version, edits in versions.items():
            cuda_module.render_program = patched_renderer(edits)
            cache = scratch_cache(decl, shape, config, rows, params, LaunchConfig.from_label(label))
            batch = mixed_steady_state(cache, rows)

            def step(i, cache=cache, batch=batch):
                tokens = sets[i % len(sets)][2]
                if kernel == "replay_step":
                    cache.launch_step(batch, tokens, out)
                else:
                    cache._launch(kernel, rows, batch, tokens, out=out)

            def pair(i, step=step):
                produce(i)
                step(i)
            times = {"alone": time_graphs(cp, *capture_graphs(cp, step, len(sets)), reps, rotation),
                     "behind": time_graphs(cp, *capture_graphs(cp, pair, len(sets)), reps, rotation)}
            if edits:
                if version not in BOUNDS:
                    check_pdl(cp, cache, kernel, pdl, produce, step, sets, out)
                pdl.kernels = {kernel}
                times["behind, PDL"] = time_graphs(cp, *capture_graphs(cp, pair, len(sets)), reps, rotation)
                if eager:  # a graph's capture could drop the programmatic edge: the same pair eager, both ways
                    with cp.cuda.Stream(non_blocking=True):
                        times["behind, PDL, eager"] = _median_ms(cp, pair, reps, rotation=rotation)
                        pdl.kernels = set()
                        times["behind, eager"] = _median_ms(cp, pair, reps, rotation=rotation)
                pdl.kernels = set()
            res[(kernel, version, label)] = times
            del cache, step, pair
            cp.get_default_memory_pool().free_all_blocks()
    cuda_module.render_program = patched_renderer([])
    res.update(fla_times(cp, name, shape, rows, produce, reps))
    return res


def check_pdl(cp, cache, kernel, pdl, produce, step, sets, out) -> None:
    """The PDL launch against the plain one from the same cache state, tokens poisoned before the
    producer writes them: outputs and every buffer equal bit for bit, over L steps (every fill)."""
    names = [n for n in ("fill", "checkpoint", "state", "rec_write", "rec_key", "rec_decay") if n in cache.buffers]
    start = {n: cache.buffers[n].copy() for n in names}
    cp.cuda.Device().synchronize()  # the copies (current stream) before the check's own stream reads them
    results = []
    with cp.cuda.Stream(non_blocking=True):
        for kernels in (set(), {kernel}):
            results.append(_steps_from(cp, cache, kernels, pdl, produce, step, sets, out, start))
    (plain, plain_bufs), (dep, dep_bufs) = results
    for i, (a, b) in enumerate(zip(plain, dep)):
        if not np.isfinite(a).all():
            raise SystemExit(f"{kernel}: the plain launch gave a non-finite output at step {i}")
        if not np.array_equal(a, b):
            raise SystemExit(f"{kernel}: the PDL launch's output differs from the plain one's at step {i}")
    for n in names:
        if not np.array_equal(plain_bufs[n], dep_bufs[n], equal_nan=True):
            raise SystemExit(f"{kernel}: the PDL launch's {n} differs from the plain one's")


def _steps_from(cp, cache, kernels, pdl, produce, step, sets, out, start) -> tuple[list, dict]:
    """L steps from the buffers ``start``, ``kernels`` launched as programmatic dependents, the tokens
    and the output poisoned before each: the outputs and the buffers after."""
    for n, value in start.items():
        cache.buffers[n][...] = value
    pdl.kernels = kernels
    outs = []
    for i in range(cache.config.window):
        sets[i % len(sets)][1].fill(np.nan)
        out.fill(np.nan)
        produce(i)
        step(i)
        outs.append(out.get())
    pdl.kernels = set()
    return outs, {n: cache.buffers[n].get() for n in start}


def fla_times(cp, name: str, shape, rows: int, produce, reps: int) -> dict:
    """FLA's step (its V-major public function) alone and behind the producer, in torch graphs on
    one stream; {} without torch and fla."""
    try:
        import torch
        from replayssm_dsl.runtime.bench_fla import _torch_graphs, fla_call
    except ImportError:
        return {}
    variant = preset(name).variant
    HV, V, K = shape.heads, shape.v_dim, shape.k_dim
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*s):
        return torch.randn(*s, device="cuda", generator=g) * 0.1
    state = rnd(rows, HV, V, K)
    gate_shape = (rows, 1, HV, K) if variant == "kda" else (rows, 1, HV)
    inputs = [(rnd(rows, 1, HV, K), rnd(rows, 1, HV, K), rnd(rows, 1, HV, V),
               -torch.rand(*gate_shape, device="cuda", generator=g), torch.rand(rows, 1, HV, device="cuda", generator=g))
              for _ in range(4)]

    def fla(i):
        return fla_call(variant, "[V, K]", *inputs[i % 4], state)

    def behind(i):
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            produce(i)
        return fla(i)
    res = {}
    for label, call in (("fla", fla), ("producer + fla", behind)):
        launch, mode = _torch_graphs(torch, call, 4)
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            res[label] = _median_ms(cp, launch, reps)
        if mode != "graph":
            res[label + " mode"] = mode
    return res


def step_rows(name: str, rows: int, res: dict) -> list[str]:
    """Table rows: each step version's time alone, and behind the producer less the producer's."""
    p, lines = res["producer"], []
    for key, times in res.items():
        if isinstance(key, tuple):
            kernel, version, label = key
            behind = [f"{times[w] - p:.4f}" if w in times else "-" for w in ("behind", "behind, PDL")]
            lines.append(f"| {name} | {rows} | {kernel} `{label}` | {version} | {times['alone']:.4f} | " + " | ".join(behind) + " |")
    if "fla" in res:
        lines.append(f"| {name} | {rows} | FLA (`[V, K]`) | as shipped | {res['fla']:.4f} | {res['producer + fla'] - p:.4f} | - |")
    return lines


def ratio_rows(name: str, rows: int, res: dict) -> list[str]:
    """Per PDL edit: the ratios the targets read, alone (unedited kernels) and behind the producer
    (the edited kernels as programmatic dependents; FLA plainly)."""
    p = res["producer"]
    step = {(k, v): t for (k, v, _), t in ((key, t) for key, t in res.items() if isinstance(key, tuple))}
    conv0, replay0 = step[("conventional_step", UNEDITED)]["alone"], step[("replay_step", UNEDITED)]["alone"]
    fla_alone, fla_behind = res.get("fla"), res.get("producer + fla", p) - p
    lines = []
    for version in PDL_EDITS:
        conv = step[("conventional_step", version)]["behind, PDL"] - p
        replay = step[("replay_step", version)]["behind, PDL"] - p
        fla = f"{fla_alone / replay0:.3f} | {fla_behind / replay:.3f}" if fla_alone else "- | -"
        lines.append(f"| {name} | {rows} | {version} | {conv0 / replay0:.3f} | {conv / replay:.3f} | {fla} | "
                     f"{replay0 / conv0:.3f} | {replay / conv:.3f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="kimi-linear,qwen3.5-4b")
    parser.add_argument("--batches", default="1,256")
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--eager", action="store_true", help="also each pair launched eagerly, PDL and plain")
    parser.add_argument("--bounds", action="store_true", help="also the replay step's BOUNDS (not checked)")
    args = parser.parse_args()
    import cupy as cp

    pdl = PdlLauncher(cp)
    producer = cp.RawKernel(PRODUCER_SOURCE, "produce_tokens")
    steps, ratios = [], []
    for name in args.presets.split(","):
        for rows in (int(b) for b in args.batches.split(",")):
            launches = B1_LAUNCHES[name] if rows == 1 else LAUNCHES[name]
            res = measure(cp, name, rows, launches, pdl, producer, args.reps, args.eager, args.bounds)
            print(name, rows, res, flush=True)
            steps += [f"| {name} | {rows} | producer | - | {res['producer']:.4f} | - | - |"] + step_rows(name, rows, res)
            ratios += ratio_rows(name, rows, res)
    print("\nms; behind: the pair's time less the producer's")
    print("| preset | B | kernel | version | alone | behind, plain | behind, PDL |\n|---|---|---|---|---|---|---|")
    print("\n".join(steps))
    print("\n| preset | B | PDL edit | conv/replay alone | conv/replay behind | FLA/replay alone | FLA/replay behind |"
          " replay/conv alone | replay/conv behind |\n|---|---|---|---|---|---|---|---|---|")
    print("\n".join(ratios))


if __name__ == "__main__":
    main()
