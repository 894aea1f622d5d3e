"""Runtime layer: flash-linear-attention's conventional step, the benchmark's outside baseline (needs a
GPU, CuPy, and torch with fla; without them it says why and times nothing).

``fla_step`` times FLA's decode step for one token on the benchmark's shapes, captured in a torch CUDA
graph and timed the way ``runtime/benchmark.py`` times its own kernels (``_median_ms``: behind the busy
kernel, round-robin over input sets, median). FLA's step runs several ways (``fla_ways``): its public
``fused_recurrent_*`` (``gated_delta_rule``, ``kda``, ``simple_gla`` for the Mamba-2 shapes) with the
state in either of its two layouts (``FLA_LAYOUTS``), and for KDA also its in-place decode entry
(``fused_recurrent_kda_fwd`` with ``inplace_final_state``, a state pool indexed per row and a given
output, the path an engine's decode takes). Every way is timed and the fastest is the baseline, so FLA
is compared at its best. ``fla_call`` is the one call each way makes; ``tests/test_fla_fused_layouts.py``
checks it against FLA's naive recurrences.
"""

from __future__ import annotations

import importlib

from .benchmark import _median_ms

FLA_LAYOUTS = {"[K, V]": False, "[V, K]": True}  # FLA's state layouts: its default, and ``state_v_first`` (ours)
IN_PLACE = " in place"  # suffix of a way that calls FLA's in-place decode entry (KDA)
# variants that FLA serves with another's kernel: the safe gate is computed before FLA's KDA step, as Kimi's is
FLA_KERNEL_OF = {"kda_safe_gate": "kda"}


def fla_ways(variant: str) -> dict[str, tuple[bool, bool]]:
    """The ways FLA's step runs for ``variant``: name -> (state V-major, in place). Every layout through
    the public function; for KDA every layout through the in-place decode entry too (fla-core 0.6.0 has
    none for the gated delta rule or simple GLA)."""
    ways = {layout: (v_first, False) for layout, v_first in FLA_LAYOUTS.items()}
    if variant == "kda":
        ways.update({layout + IN_PLACE: (v_first, True) for layout, v_first in FLA_LAYOUTS.items()})
    return ways


def fla_call(variant: str, way: str, q, k, v, gate, beta, state, out=None, indices=None):
    """FLA's step for ``q, k, v [B, T, H(V), K or V]`` (gate ``[B, T, HV]``, KDA ``[B, T, HV, K]``; beta
    ``[B, T, HV]``) from ``state`` in the layout ``way`` names (``[B, HV, K, V]`` or ``[B, HV, V, K]``):
    ``(output, final state)``. The in-place way updates ``state[indices]`` itself (``indices [B]`` int32
    rows of the pool; one token per call, as FLA's continuous batching reads one state per row; contiguous
    tensors, which that entry does not copy) and writes ``out``; the final state it returns is the pool."""
    v_first, in_place = fla_ways(variant)[way]
    layout = {"state_v_first": True} if v_first else {}  # (default layout: no new keyword)
    if in_place:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
        return fused_recurrent_kda_fwd(q=q, k=k, v=v, g=gate, beta=beta, initial_state=state, inplace_final_state=True,
                                       ssm_state_indices=indices, use_qk_l2norm_in_kernel=True, out=out, **layout)
    if variant == "gdn":
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        return fused_recurrent_gated_delta_rule(q, k, v, g=gate, beta=beta, initial_state=state,
                                                output_final_state=True, use_qk_l2norm_in_kernel=True, **layout)
    if variant == "kda":
        from fla.ops.kda import fused_recurrent_kda
        return fused_recurrent_kda(q, k, v, g=gate, beta=beta, initial_state=state, output_final_state=True,
                                   use_qk_l2norm_in_kernel=True, **layout)
    from fla.ops.simple_gla import fused_recurrent_simple_gla
    return fused_recurrent_simple_gla(q, k, v, g=gate, initial_state=state, output_final_state=True, **layout)


def fla_step(variant: str, shape, batch: int, sets: int, reps: int, token_dtype: str = "float32"):
    """FLA's step, ms, and how it ran (None and the reason when fla is absent or refuses every way).
    With bf16 tokens its q, k and v are bf16 too (the gate and beta stay float32, as FLA computes them;
    the state is float32 either way)."""
    variant = FLA_KERNEL_OF.get(variant, variant)
    try:
        import torch
        for module in ("fla.ops.gated_delta_rule", "fla.ops.kda", "fla.ops.simple_gla"):  # that fla imports whole
            importlib.import_module(module)
    except Exception:
        return None, "fla not importable"
    dev, HV, V, K = "cuda", shape.heads, shape.v_dim, shape.k_dim
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*s):
        return torch.randn(*s, device=dev, generator=g) * 0.1

    ways = fla_ways(variant)
    states = {v_first: rnd(batch, HV, V, K) if v_first else rnd(batch, HV, K, V) for v_first in FLA_LAYOUTS.values()}
    indices = torch.arange(batch, device=dev, dtype=torch.int32)
    inputs = []
    for _ in range(sets):
        q, k, v = rnd(batch, 1, HV, K), rnd(batch, 1, HV, K), rnd(batch, 1, HV, V)
        if token_dtype == "bfloat16":
            q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
        gate_shape = (batch, 1, HV, K) if variant == "kda" else (batch, 1, HV)
        gate = -torch.rand(*gate_shape, device=dev, generator=g)
        beta = torch.rand(batch, 1, HV, device=dev, generator=g)
        inputs.append((q, k, v, gate, beta, torch.empty_like(v)))

    def call(i, way):
        q, k, v, gate, beta, out = inputs[i % sets]
        return fla_call(variant, way, q, k, v, gate, beta, states[ways[way][0]], out=out, indices=indices)

    import cupy as cp
    timed, failures = {}, []
    for way in ways:
        try:
            call(0, way)
        except Exception as exc:
            failures.append(f"{way}: {type(exc).__name__}: {exc}"[:200])
            continue
        launch, mode = _torch_graphs(torch, lambda i, way=way: call(i, way), sets)
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):  # the stream torch launches on
            timed[way] = (_median_ms(cp, launch, reps), mode)
    if not timed:
        return None, "fla call failed: " + "; ".join(failures)
    return fastest_way(timed)


def _torch_graphs(torch, call, sets: int):
    """``launch(i)`` replaying a torch CUDA graph of ``call(i)`` per input set, and ``"graph"``; where
    capture fails (some versions do not capture), ``call`` itself and ``"eager (the error)"``."""
    try:
        stream = torch.cuda.Stream()
        graphs = []
        with torch.cuda.stream(stream):
            for i in range(sets):
                call(i)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=stream):
                    call(i)
                graphs.append(graph)
        torch.cuda.synchronize()
    except Exception as exc:
        return call, f"eager ({type(exc).__name__})"
    return (lambda i: graphs[i % sets].replay()), "graph"


def fastest_way(timed: dict) -> tuple[float, str]:
    """``timed``: way (a layout, or a layout in place) -> (ms, how it ran). The fastest way's ms, and a
    mode naming how it ran, its way and the others' times."""
    best = min(timed, key=lambda way: timed[way][0])
    others = ", ".join(f"{way} {ms:.4f} ms" for way, (ms, _) in timed.items() if way != best)
    return timed[best][0], f"{timed[best][1]}, state {best}" + (f" (faster than {others})" if others else "")
