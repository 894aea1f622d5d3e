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
* each step alone (the benchmark's way) and behind the producer as a plain launch, both unedited and
  edited (``PDL_EDIT``: the wait, no token prefetches), and the edited one behind the producer as a
  programmatic dependent (``--eager``: that pair also launched eagerly, both ways);
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
from experiment_variants import patched_renderer, scratch_cache  # noqa: E402
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


def _wait_before_tokens(text: str) -> str:
    """A step kernel's text with its token prefetches dropped (they would read before the wait) and the
    wait before its first token read."""
    if text.count(FIRST_TOKEN_READ) != 1:
        raise SystemExit(f"PDL edit does not apply: {FIRST_TOKEN_READ.strip()!r} is not in the kernel once")
    text = PREFETCH.sub("", text)
    return text.replace(FIRST_TOKEN_READ, WAIT + FIRST_TOKEN_READ, 1)


PDL_EDIT = [in_kernel(kernel, _wait_before_tokens) for kernel in STEP_KERNELS]


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
            eager: bool = False) -> dict:
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
        short = kernel.split("_")[0]
        rotation = L if kernel == "replay_step" else 1
        for edits, key in (([], f"{short} unedited"), (PDL_EDIT, short)):
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
            res[key] = time_graphs(cp, *capture_graphs(cp, step, len(sets)), reps, rotation)
            res[f"producer + {key}"] = time_graphs(cp, *capture_graphs(cp, pair, len(sets)), reps, rotation)
        check_pdl(cp, cache, kernel, pdl, produce, step, sets, out)
        pdl.kernels = {kernel}
        res[f"producer + {short} (PDL)"] = time_graphs(cp, *capture_graphs(cp, pair, len(sets)), reps, rotation)
        if eager:  # a graph's capture could drop the programmatic edge: the same pair eager, both ways
            with cp.cuda.Stream(non_blocking=True):
                res[f"producer + {short} (PDL, eager)"] = _median_ms(cp, pair, reps, rotation=rotation)
                pdl.kernels = set()
                res[f"producer + {short} (eager)"] = _median_ms(cp, pair, reps, rotation=rotation)
        pdl.kernels = set()
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


def derived(res: dict) -> dict:
    """Each step's time behind the producer (the pair less the producer) and the ratios the targets read."""
    p = res["producer"]
    d = {f"{k} behind{way}": res[f"producer + {k}{way}"] - p
         for k in ("conventional", "replay") for way in (" unedited", "", " (PDL)")}
    d["conv/replay alone"] = res["conventional"] / res["replay"]
    d["conv/replay behind, both PDL"] = d["conventional behind (PDL)"] / d["replay behind (PDL)"]
    if "producer + fla" in res:
        d["fla behind"] = res["producer + fla"] - p
        d["fla/replay alone"] = res["fla"] / res["replay"]
        d["fla/replay behind (replay PDL)"] = d["fla behind"] / d["replay behind (PDL)"]
    d["replay/conv behind, both PDL"] = d["replay behind (PDL)"] / d["conventional behind (PDL)"]
    return d


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="kimi-linear,qwen3.5-4b")
    parser.add_argument("--batches", default="1,256")
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--eager", action="store_true", help="also each pair launched eagerly, PDL and plain")
    args = parser.parse_args()
    import cupy as cp

    pdl = PdlLauncher(cp)
    producer = cp.RawKernel(PRODUCER_SOURCE, "produce_tokens")
    table = []
    for name in args.presets.split(","):
        for rows in (int(b) for b in args.batches.split(",")):
            launches = B1_LAUNCHES[name] if rows == 1 else LAUNCHES[name]
            res = measure(cp, name, rows, launches, pdl, producer, args.reps, args.eager)
            res.update(derived(res))
            print(name, rows, {k: (round(v, 5) if isinstance(v, float) else v) for k, v in res.items()}, flush=True)
            table.append((name, rows, res))
    keys = [k for k in table[0][2] if not k.endswith("mode")]
    print("\n| preset | B | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for name, rows, res in table:
        print(f"| {name} | {rows} | " + " | ".join(f"{res[k]:.4f}" if k in res else "-" for k in keys) + " |")


if __name__ == "__main__":
    main()
