"""Runtime layer: flash-linear-attention's conventional step, the benchmark's outside baseline (needs a
GPU, CuPy, and torch with fla; without them it says why and times nothing).

``fla_step`` times FLA's ``fused_recurrent_*`` (``gated_delta_rule``, ``kda``, ``simple_gla`` for the
Mamba-2 shapes) for one decode token on the benchmark's shapes, captured in a torch CUDA graph and
timed the way ``runtime/benchmark.py`` times its own kernels (``_median_ms``: behind the busy kernel,
round-robin over input sets, median). FLA takes the state in two layouts (``FLA_LAYOUTS``); both are
timed and the faster is the baseline, so it is compared at its best.
"""

from __future__ import annotations

from .benchmark import _median_ms

FLA_LAYOUTS = {"[K, V]": False, "[V, K]": True}  # FLA's state layouts: its default, and ``state_v_first`` (ours)


def fla_step(variant: str, shape, batch: int, sets: int, reps: int, token_dtype: str = "float32"):
    """FLA's step, ms, and how it ran (None and the reason when fla is absent or refuses every
    layout). State ``[B, HV, K, V]`` by default, ``[B, HV, V, K]`` with ``state_v_first``. With bf16
    tokens its q, k and v are bf16 too (the gate and beta stay float32, as FLA computes them; the
    state is float32 either way)."""
    try:
        import torch
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        from fla.ops.kda import fused_recurrent_kda
        from fla.ops.simple_gla import fused_recurrent_simple_gla
    except Exception:
        return None, "fla not importable"
    dev, HV, V, K = "cuda", shape.heads, shape.v_dim, shape.k_dim
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*s):
        return torch.randn(*s, device=dev, generator=g) * 0.1

    states = {layout: rnd(batch, HV, V, K) if v_first else rnd(batch, HV, K, V) for layout, v_first in FLA_LAYOUTS.items()}
    inputs = []
    for _ in range(sets):
        q, k, v = rnd(batch, 1, HV, K), rnd(batch, 1, HV, K), rnd(batch, 1, HV, V)
        if token_dtype == "bfloat16":
            q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
        gate_shape = (batch, 1, HV, K) if variant == "kda" else (batch, 1, HV)
        gate = -torch.rand(*gate_shape, device=dev, generator=g)
        beta = torch.rand(batch, 1, HV, device=dev, generator=g)
        inputs.append((q, k, v, gate, beta))

    def call(i, layout):
        q, k, v, gate, beta = inputs[i % sets]
        state = states[layout]
        v_first = {"state_v_first": True} if FLA_LAYOUTS[layout] else {}  # (default layout: no new keyword)
        if variant == "gdn":
            return fused_recurrent_gated_delta_rule(q, k, v, g=gate, beta=beta, initial_state=state,
                                                    output_final_state=True, use_qk_l2norm_in_kernel=True, **v_first)
        if variant == "kda":
            return fused_recurrent_kda(q, k, v, g=gate, beta=beta, initial_state=state, output_final_state=True,
                                       use_qk_l2norm_in_kernel=True, **v_first)
        return fused_recurrent_simple_gla(q, k, v, g=gate, initial_state=state, output_final_state=True, **v_first)

    import cupy as cp
    timed, failures = {}, []
    for layout in FLA_LAYOUTS:
        try:
            call(0, layout)
        except Exception as exc:
            failures.append(f"{layout}: {type(exc).__name__}: {exc}"[:200])
            continue
        launch, mode = _torch_graphs(torch, lambda i, layout=layout: call(i, layout), sets)
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):  # the stream torch launches on
            timed[layout] = (_median_ms(cp, launch, reps), mode)
    if not timed:
        return None, "fla call failed: " + "; ".join(failures)
    return fastest_layout(timed)


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


def fastest_layout(timed: dict) -> tuple[float, str]:
    """``timed``: layout -> (ms, how it ran). The fastest layout's ms, and a mode naming how it ran,
    its layout and the others' times."""
    best = min(timed, key=lambda layout: timed[layout][0])
    others = ", ".join(f"{layout} {ms:.4f} ms" for layout, (ms, _) in timed.items() if layout != best)
    return timed[best][0], f"{timed[best][1]}, state {best}" + (f" (faster than {others})" if others else "")
