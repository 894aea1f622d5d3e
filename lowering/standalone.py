"""Lowering layer: a self-contained export of a program's kernels for engines that do not run Python.

``write_standalone(program, folder)`` writes three files:

- ``<name>.cu``: the generated kernels plus one ``extern "C"`` launcher per kernel that takes a
  ``<name>_buffers`` struct (device pointers, and the slot and page counts the kernels check rows
  against), the batch rows, the token count per row and a stream;
- ``<name>.h``: the struct and launchers, every argument documented (dtype, shape, layout);
- ``manifest.json``: kernels, argument order, sizes, grid rules, launch shape, declaration hash.

Build it with ``nvcc -arch=sm_90 -shared -Xcompiler -fPIC <name>.cu -o lib<name>.so``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .ir import Program
from .record_inputs import raw_record_inputs
from .launch import FILL_THREADS, LaunchConfig, kernel_arguments, v_tiles
from .render_cuda import STATE_C_TYPES, render_program
from .render_replay import dynamic_shared_bytes

ARGUMENT_DOCS = {
    "checkpoint": ("state dtype", "[pages, HV, V, K]", "replay checkpoints, K contiguous"),
    "state": ("state dtype", "[pages, HV, V, K]", "conventional (baseline) states"),
    "snapshots": ("state dtype", "[B, T, HV, V, K]", "snapshot_verify's per-draft states"),
    "initial": ("float", "[B, HV, V, K]", "states handed to load"),
    "materialized": ("float", "[B, HV, V, K]", "materialize's output"),
    "rec_decay": ("float", "[slots, HV, cap(, K)]", "cumulative log-decays of the records (unused without decay)"),
    "rec_write": ("float", "[slots, HV, cap, V]", "record writes"),
    "rec_key": ("float", "[slots, KEY_HEADS, cap, K]", "record keys (decay-scaled, e^(KEY_SHIFT - G_i) k_i, where the source defines KEY_SHIFT)"),
    "fill": ("int32", "[slots]", "records per slot; the device-side truth"),
    "slots": ("int32", "[B]", "slot per batch row, -1 = padded row (touches nothing)"),
    "src_page": ("int32", "[B]", "checkpoint page read"),
    "dst_page": ("int32", "[B]", "checkpoint page a flush or load writes"),
    "drafts": ("int32", "[B]", "drafts per row (verify, commit, snapshot_verify)"),
    "accepted": ("int32", "[B]", "accepted drafts per row (commit)"),
    "out": ("float", "[B, T, HV, V]", "outputs (T = t_tok)"),
    "num_slots": ("int", "scalar", "slots the fill and record buffers hold; rows with slots outside [0, num_slots) touch nothing"),
    "num_pages": ("int", "scalar", "checkpoint pages; rows with pages outside [0, num_pages) touch nothing"),
}
CALL_ARGS = ("rows", "t_tok")  # launcher parameters; every other kernel argument is a field of the buffers struct


def export_name(program: Program) -> str:
    return f"replayssm_{program.declaration.name}"


def _struct_fields(program: Program) -> list[tuple[str, str]]:
    return [(ctype, name) for ctype, name in kernel_arguments(program) if name not in CALL_ARGS]


def _doc(program: Program, name: str) -> tuple[str, str, str]:
    record = next((b for b in program.buffers if b.name == name and b.role == "record"), None)
    if record is not None and record.dtype == "bfloat16":  # a record field kept as its bf16 input
        return "bf16 (raw bits)", ARGUMENT_DOCS[name][1], record.doc
    if name in ARGUMENT_DOCS:
        return ARGUMENT_DOCS[name]
    spec = program.declaration.input(name[4:])
    kind = "token input" if spec.kind == "token" else "parameter"
    shape = spec.shape_text(verify=True).replace("B, T", "B, t_tok") if spec.kind == "token" else spec.shape_text()
    dtype = "bf16 (raw bits)" if spec.dtype == "bfloat16" else "float"
    return dtype, shape, f"{kind} {spec.name!r}"


def render_header(program: Program, launch: LaunchConfig) -> str:
    name, decl, shape, cfg = export_name(program), program.declaration, program.shape, program.config
    def c_type(ctype: str) -> str:
        return ctype.replace("const ", "").replace("STATE_T", f"{name}_state_t")

    struct = "".join("    {} {};  /* {} {}: {} */\n".format(c_type(ctype), arg, *_doc(program, arg))
                     for ctype, arg in _struct_fields(program))
    state_t = STATE_C_TYPES[cfg.state_dtype]
    lines = [
        f"/* {name}.h: ReplaySSM decode kernels for {decl.name!r} (declaration {decl.fingerprint}).",
        f" * HV={shape.heads} H={shape.key_heads} V={shape.v_dim} K={shape.k_dim}, window L={cfg.window}, "
        f"max drafts T={cfg.max_drafts}, capacity {cfg.capacity}, state {cfg.state_dtype}.",
        " * Every pointer is device memory, C-contiguous, 16-byte aligned, in the layout given. Every kernel",
        " * reads slots, src_page and dst_page (verify-like kernels and commit also drafts and accepted) and",
        " * skips a row whose values fall outside the buffers (num_slots, num_pages, capacity); pass any valid",
        " * pointer for the other buffers a kernel does not use. Launchers return cudaGetLastError() after the",
        " * launch and run on `stream`. A decode step is <prefix>_replay_step (it moves the fill too); a speculative step is",
        " * <prefix>_flush_for_verify, <prefix>_verify, then <prefix>_commit once accepted counts are known,",
        " * all three with the same t_tok (the drafts' T; a row drafting more is skipped by all three).",
        " * <prefix>_snapshot_verify takes its drafts' T too; the other kernels take t_tok = 1. */",
        f"#ifndef {name.upper()}_H", f"#define {name.upper()}_H", "#include <cuda_runtime.h>",
        f"typedef {state_t} {name}_state_t;  /* float32, or the raw bits of fp16/bf16 */",
        f"typedef struct {{\n{struct}}} {name}_buffers;",
        '#ifdef __cplusplus\nextern "C" {\n#endif',
    ]
    for kernel in program.kernels:
        lines.append(f"/* {kernel.doc} */")
        lines.append(f"cudaError_t {name}_{kernel.name}(const {name}_buffers* buffers, int rows, int t_tok, "
                     "cudaStream_t stream);")
    lines += ['#ifdef __cplusplus\n}\n#endif', "#endif", ""]
    return "\n".join(lines)


def render_launchers(program: Program, launch: LaunchConfig) -> str:
    name = export_name(program)
    tiles = v_tiles(program, launch)
    args = ", ".join(arg if arg in CALL_ARGS else f"buffers->{arg}" for _, arg in kernel_arguments(program))
    out = [f'#include "{name}.h"']
    for kernel in program.kernels:
        if kernel.grid == ("B",):
            grid, block = f"dim3((rows + {FILL_THREADS - 1}) / {FILL_THREADS})", f"dim3({FILL_THREADS})"
        else:
            grid, block = f"dim3({tiles}, {program.shape.heads}, rows)", f"dim3({launch.threads})"
        shared = dynamic_shared_bytes(kernel, program, launch)
        allow = ("" if not shared else  # the kernel may take more than 48 KiB of shared memory in all
                 f"    const cudaError_t allowed = cudaFuncSetAttribute({kernel.name}, "
                 f"cudaFuncAttributeMaxDynamicSharedMemorySize, {shared});\n"
                 "    if (allowed != cudaSuccess) return allowed;\n")
        out.append(f'extern "C" cudaError_t {name}_{kernel.name}(const {name}_buffers* buffers, int rows, int t_tok, '
                   f"cudaStream_t stream) {{\n    if (rows <= 0) return cudaSuccess;\n{allow}"
                   f"    {kernel.name}<<<{grid}, {block}, {shared}, stream>>>({args});\n"
                   "    return cudaGetLastError();\n}")
    return "\n".join(out) + "\n"


def manifest(program: Program, launch: LaunchConfig) -> dict:
    shape, cfg = program.shape, program.config
    tiles = v_tiles(program, launch)
    return {
        "name": export_name(program),
        "declaration": program.declaration.name,
        "declaration_hash": program.declaration.fingerprint,
        "sizes": dict(program.sizes),
        "state_dtype": cfg.state_dtype,
        "record_dtype": cfg.record_dtype,
        "raw_record_fields": sorted(raw_record_inputs(program.declaration, cfg)),  # kept as bf16 token bits
        "launch": {"warps": launch.warps, "rows_per_warp": launch.rows_per_warp, "threads": launch.threads,
                   "max_registers": launch.max_registers, "label": launch.label},
        "argument_order": [{"name": arg} if arg in CALL_ARGS else
                           {"name": arg, "dtype": _doc(program, arg)[0], "shape": _doc(program, arg)[1]}
                           for _, arg in kernel_arguments(program)],
        "kernels": [{"name": k.name, "doc": k.doc,
                     "grid": ["ceil(rows/128)"] if k.grid == ("B",) else [tiles, shape.heads, "rows"],
                     "block": [FILL_THREADS] if k.grid == ("B",) else [launch.threads],
                     "dynamic_shared_bytes": dynamic_shared_bytes(k, program, launch),
                     "launcher": f"{export_name(program)}_{k.name}"} for k in program.kernels],
    }


def write_standalone(program: Program, folder: Path, launch: LaunchConfig | None = None) -> list[Path]:
    launch = launch or LaunchConfig()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = export_name(program)
    header, source, meta = folder / f"{name}.h", folder / f"{name}.cu", folder / "manifest.json"
    header.write_text(render_header(program, launch))
    source.write_text(render_program(program, launch) + "\n" + render_launchers(program, launch))
    meta.write_text(json.dumps(manifest(program, launch), indent=1))
    return [source, header, meta]
