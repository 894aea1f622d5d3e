"""Runtime layer: a small autotuner for the launch shape of the generated kernels, with a cached table.

Kernels come in three families with a launch shape each, each family compiled as its own module
(``group_kernels``): the replay group (step, flush, load, materialize, and the fill kernels), verify (``flush_for_verify``, ``verify``: more head-level work per tile, so they favour
larger tiles) and the conventional baselines (``conventional_step``, ``snapshot_verify``), so the
baseline is tuned as hard as what it is compared with. Verify has two groups: ``verify`` for more
than ``VERIFY_FEW_DRAFTS`` drafts and ``verify_few`` for at most that many, since its rows run on
tensor cores only under the uncapped shapes and those lose to the SIMT rows of a capped shape when
the drafts are few; ``verify_few`` also times its first pass's finalists with their scores on CUDA
cores (``score_twins``). ``tune_step`` times one group's decode step (the replay step in the mixed steady
state, whose median is taken over rotations of L steps, verify of ``max_drafts`` tokens, or of
``VERIFY_FEW_DRAFTS``, with its commit, or the conventional step; CUDA graph, median) on a scratch cache for each candidate ``LaunchConfig``, times
the three fastest again in interleaved rounds, and records the one of least median in a JSON table keyed by declaration fingerprint, shape, replay settings, batch
size and group (``REPLAYSSM_AUTOTUNE_CACHE``). Before timing, the candidates' modules are compiled at
once (``warm_kernel_cache``; ``replayssm bench`` does so for all its presets first). Caches consult the table before falling back to
``choose_launch``'s rule (``verify_few`` first falls back to the ``verify`` entry). Needs a GPU.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from replayssm_dsl import knobs
from replayssm_dsl.errors import LoweringError
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.lowering.record_keys import key_shift
from replayssm_dsl.lowering.render_replay import shared_rows_refusal
from replayssm_dsl.lowering.render_verify_mma import shared_fragments_refusal, tensor_core_scores, tensor_core_verify

from .benchmark import capture_graphs, mixed_steady_state, time_graphs, verify_and_commit, verify_inputs
from .cuda_module import CompiledProgram
from .parallel_compile import warm_kernel_cache

CANDIDATES = (LaunchConfig(4, 4), LaunchConfig(4, 2), LaunchConfig(4, 8), LaunchConfig(8, 8), LaunchConfig(4, 16),
              LaunchConfig(4, 4, max_registers=64), LaunchConfig(8, 4, max_registers=64),
              LaunchConfig(4, 10), LaunchConfig(8, 10),  # 40- and 80-row CTAs: no rows wasted at V = 80
              LaunchConfig(4, 10, max_registers=96),  # 5 CTAs per SM
              LaunchConfig(4, 8, max_registers=80), LaunchConfig(4, 10, max_registers=80),  # 6 CTAs per SM
              LaunchConfig(8, 8, max_registers=64),  # 4 CTAs of 8 warps per SM: 4x16's rows in flight, twice its warps
              # 128-row CTAs (a whole head at V = 128: its head-level work once, not once per V-tile),
              # 2 per SM; and 16-warp CTAs of 64 rows under a 64-register cap, 2 per SM (32 warps)
              LaunchConfig(8, 16), LaunchConfig(16, 8, max_registers=64), LaunchConfig(16, 4, max_registers=64))
# Options that change one group's kernels only, tried in that group alone: eager records (the replay
# step, small batches), shared rows and write records in registers (the replay step) and verify's rows in one pass through the drafts, or in passes of 4 rows (each
# timed only where it builds clean, and only where verify's rows run on SIMT lanes, see
# ``tensor_core_verify``).
GROUP_EXTRAS = {
    "replay": (LaunchConfig(4, 4, eager_records=True), LaunchConfig(8, 4, max_registers=64, eager_records=True),
               # each warp's last rows in shared memory (bulk copies, no registers): more rows in flight
               # per SM than registers hold; 320 at 4x16/r96/s8 and 4x10/r64/s4, 400 at 4x20/r96/s10,
               # against 256 at 8x8/r64 (KDA's records leave too little shared memory for the first two)
               LaunchConfig(4, 16, max_registers=96, shared_rows=8), LaunchConfig(4, 20, max_registers=96, shared_rows=10),
               LaunchConfig(4, 10, max_registers=64, shared_rows=4),
               # 3 CTAs of 8 warps per SM with the shared rows in dynamic shared memory: 384 rows at
               # 8x16/r80/s10 (GDN) and /s8 (Mamba-2; GDN and KDA spill there), 288 at 8x12/r80/s4 (KDA)
               LaunchConfig(8, 16, max_registers=80, shared_rows=10), LaunchConfig(8, 16, max_registers=80, shared_rows=8),
               LaunchConfig(8, 12, max_registers=80, shared_rows=4),
               # the write records in registers, not shared memory (KDA: 384 rows at 8x16/r80/s10/w, 3 CTAs
               # where its records leave room for 2 with the writes staged; 320 at 4x16/r96/s8/w); /s11 the
               # same 384 rows with one register row fewer per warp
               LaunchConfig(8, 16, max_registers=80, shared_rows=10, register_writes=True),
               LaunchConfig(8, 16, max_registers=80, shared_rows=11, register_writes=True),
               LaunchConfig(4, 16, max_registers=96, shared_rows=8, register_writes=True),
               # fewer register rows at the same 384 rows per SM (GDN builds clean to /s14, Mamba-2 at /s13/w);
               # /s12/w/v: KDA's with the token's values in registers (sh_value gone, sh_ed in sh_q: 768 bytes
               # under the 76,800 per CTA that 3 per SM need); 4x16/r96/s10: super's 320 rows, 2 register rows fewer
               LaunchConfig(8, 16, max_registers=80, shared_rows=12, register_writes=True, register_fields=True),
               LaunchConfig(8, 16, max_registers=80, shared_rows=13, register_writes=True),
               LaunchConfig(4, 16, max_registers=96, shared_rows=10)),
    "verify": (LaunchConfig(4, 10, verify_rows_per_pass=10), LaunchConfig(8, 10, verify_rows_per_pass=10),
               LaunchConfig(4, 16, verify_rows_per_pass=16),
               # 8x8/r64 with half the rows per pass: the default 8 spill 4-16 bytes at nano, super and
               # qwen3.5-4b (so the tuner skips it); 4 build clean for super and the two GDN shapes (nano's
               # spill 4 B, KDA's 16 B: skipped there); verify of T <= 2 had picked 8x8/r64
               LaunchConfig(8, 8, max_registers=64, verify_rows_per_pass=4),
               # 80-row CTAs of whole 16-row tiles: a whole head per CTA at V = 80 (nano), 3 CTAs of 5 warps
               # per SM under verify's 128 registers, 240 rows in flight against 8x16's 160 there
               LaunchConfig(5, 16),
               # verify on tensor cores under a register cap, the last chunks of each lane's second fragment
               # row through dynamic shared memory (shared_fragments): 4 CTAs of 5x16/r96 per SM (320 rows;
               # nano builds clean from 4 chunks), 5 of 4x16/r96 (320 rows against 4x16's 256; super from 2,
               # GDN from 4), 3 of 8x16/r80 (384 rows; GDN clean at 6 chunks, super at 7)
               LaunchConfig(5, 16, max_registers=96, shared_fragments=4),
               LaunchConfig(4, 16, max_registers=96, shared_fragments=2),
               LaunchConfig(4, 16, max_registers=96, shared_fragments=4),
               LaunchConfig(8, 16, max_registers=80, shared_fragments=6),
               LaunchConfig(8, 16, max_registers=80, shared_fragments=7)),
    "conventional": (),
}
GROUP_EXTRAS["verify_few"] = GROUP_EXTRAS["verify"]
VERIFY_FEW_DRAFTS = 2  # verify of at most this many drafts launches with the verify_few group's shape


GROUPS = tuple(GROUP_EXTRAS)
VERIFY_KERNELS = ("flush_for_verify", "verify")
CONVENTIONAL_KERNELS = ("conventional_step", "snapshot_verify")


def candidates(group: str) -> tuple[LaunchConfig, ...]:
    """The launch shapes ``tune_step`` times for ``group``."""
    return CANDIDATES + GROUP_EXTRAS[group]


def distinct_candidates(program, group: str) -> tuple[LaunchConfig, ...]:
    """``candidates(group)`` less those that render the same kernels as another for ``program`` (verify's
    rows per pass where verify's rows run on tensor cores, which take no passes) and those the lowering
    refuses (shared rows whose bytes the bulk copies cannot move: ``shared_rows_refusal``; more shared
    fragments than a lane holds: ``shared_fragments_refusal``), and verify's shared fragments where
    verify's rows do not run on tensor cores and its scores on CUDA cores where they would run there
    anyway (the options would change nothing)."""
    return tuple(c for c in candidates(group) if not (c.verify_rows_per_pass and tensor_core_verify(program, c))
                 and not (c.shared_fragments and not tensor_core_verify(program, c))
                 and not (c.simt_scores and not tensor_core_scores(program, dataclasses.replace(c, simt_scores=False)))
                 and shared_rows_refusal(program, c) is None and shared_fragments_refusal(program, c) is None)


def tuning_sources(program, group: str) -> list[str]:
    """The CUDA sources that ``tune_step``'s first pass loads for ``group``, for ``warm_kernel_cache``:
    the group's module (``group_kernels`` of its family) at each of ``distinct_candidates``, and for
    verify also the replay family's at those launches (its commit runs from there)."""
    families = (family_of(group), "replay") if family_of(group) == "verify" else (family_of(group),)
    launches = distinct_candidates(program, group)
    return list(dict.fromkeys(CompiledProgram(program, c, group_kernels(program, f)).source
                              for f in families for c in launches))


def score_twins(program, group: str, launches) -> tuple[LaunchConfig, ...]:
    """The launches ``tune_step`` times after its first pass: for ``verify_few``, each of ``launches``
    (the first pass's finalists) whose verify scores on tensor cores, again with its scores on CUDA
    cores (``simt_scores``: the SIMT trips' work follows the drafts' count, the 8-column products'
    does not); none for the other groups, where the option changes nothing or drafts are many."""
    if group != "verify_few":
        return ()
    return tuple(dataclasses.replace(c, simt_scores=True) for c in launches if tensor_core_scores(program, c))


def group_of(kernel: str, drafts: int | None = None) -> str:
    """The tuning group whose launch shape runs ``kernel`` (fill kernels have no tiles: any group);
    for verify's kernels ``drafts`` (the tokens' T) picks ``verify_few`` or ``verify``."""
    if kernel in CONVENTIONAL_KERNELS:
        return "conventional"
    if kernel in VERIFY_KERNELS:
        return "verify_few" if drafts is not None and drafts <= VERIFY_FEW_DRAFTS else "verify"
    return "replay"


def family_of(group: str) -> str:
    """The kernels' family of a tuning group: ``verify_few`` runs verify's kernels."""
    return "verify" if group == "verify_few" else group


def group_kernels(program, group: str) -> tuple[str, ...]:
    """The kernels one module of ``group``'s launch shape holds: those ``group_of`` puts in the group's
    family (the fill kernels, which have no tiles, go with the replay group). A module per group, so
    a shape that does not build or spills for one group's kernels is still open to another's."""
    return tuple(k.name for k in program.kernels if group_of(k.name) == family_of(group))


def drafts_timed(group: str, config) -> int | None:
    """The draft count ``tune_step`` times ``group``'s verify with (None for the other groups)."""
    if group == "verify":
        return config.max_drafts
    return min(VERIFY_FEW_DRAFTS, config.max_drafts) if group == "verify_few" else None


def group_spills(local_memory: dict | None, group: str) -> bool:
    """Whether a module whose ``local_memory()`` is given cannot serve ``group``: it does not build
    (``None``), or one of the group's own kernels spills. Other groups' kernels do not count (a
    group's module holds only its own: ``group_kernels``)."""
    return local_memory is None or any(group_of(kernel) == family_of(group) for kernel in local_memory)


TUNING_VERSION = 26
"""Part of every table key: raised when the generated kernels or the way a group is timed change, so
that shapes tuned before are tuned again rather than read (2: ``flush_for_verify`` folds in chunks,
the replay step is timed over whole rotations of L steps; 3: every timed launch waits behind a busy
kernel, so the host's enqueueing is not timed; 4: the replay step counts its arrival on the last warp
after the cumulate's barrier; 5: it reads the fill with the atomic that counts its arrival; 6: without a
delta rule its scores against the token's key are gone; 7: the write records lie W_VEC rows wide; 8:
verify may take 8x8/r64 with 4 rows per pass; 9: with a decay vector, verify scores 4 records per
trip where no register cap applies; 10: the replay step may keep rows in shared memory; 11: in
dynamic shared memory, past 48 KiB in all; 12: the replay step may load its write records into
registers; 13: verify keeps its write records in dynamic shared memory; 14: the replay step may
take ``8x16/r80/s11/w``; 15: the sources compile without warnings, and a key with bf16 records names
the fields kept raw; 16: verify may take ``5x16``; 17: verify's chain shortened; 18: verify on tensor
cores copies its row inputs before the state rows; 19: and loads its first drafts' scalar inputs and
the head's scalar parameters before them; 20: verify may run on tensor cores under a 96-register cap
with shared fragments; 21: and keeps them in dynamic shared memory, which lets ``8x16/r80`` take them;
22: the replay step's ``sh_ed`` lies in ``sh_q``, and it may take ``8x16/r80/s12/w/v`` (its token's row
fields in registers), ``8x16/r80/s13/w`` and ``4x16/r96/s10``; 23: the fastest three of the first pass
are timed again, interleaved, and the least median of those rounds is chosen; 24: verify of few drafts
also times its finalists with their scores on CUDA cores, ``/c``; 25: verify of a scalar decay without
a delta rule applies its drafts' decays to the state products' results, ``decay_in_products``; 26: a
key names the records' decay-scaled key shift where the lowering keeps scaled keys, so
``scaled_keys=False`` tunes apart)."""


def table_key(program, rows: int, group: str = "replay") -> str:
    s, c = program.shape, program.config
    records = c.record_dtype if c.record_dtype == "float32" else f"{c.record_dtype}:{'+'.join(c.raw_record_fields)}"
    shift = key_shift(program.declaration, c)  # records of decay-scaled keys render other kernels
    if shift is not None:
        records += f":scaled{shift:g}"
    return (f"v{TUNING_VERSION}|{program.declaration.fingerprint}|{s.heads},{s.key_heads},{s.v_dim},{s.k_dim}|"
            f"{c.window},{c.max_drafts},{c.state_dtype},{records}|{rows}" + ("" if group == "replay" else f"|{group}"))


def load_table() -> dict:
    path = knobs.autotune_cache()
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}  # valid JSON that is no table: no entry either


def lookup(program, rows: int, group: str = "replay") -> LaunchConfig | None:
    """The tuned launch shape, or None (no entry, or one this version cannot read: it is re-tuned)."""
    entry = load_table().get(table_key(program, rows, group))
    try:
        return LaunchConfig(**entry["launch"]) if entry else None
    except (KeyError, TypeError, ValueError):
        return None


CONFIRM_FINALISTS = 3  # candidates timed again after the first pass (the fastest of it)
CONFIRM_ROUNDS = 3  # interleaved rounds of the finalists, ``reps`` rotations each: the median round counts


def _timed_launch(decl, shape, config, params: dict, rows: int, group: str, launch, rng):
    """A function that times one candidate again (``reps`` -> median ms, ``tune_step``'s measurement)
    on a scratch cache of ``rows`` slots, its graph captured once; None where the group's kernels do
    not build or one of them spills."""
    import cupy as cp

    from replayssm_dsl.random_inputs import random_tokens

    from .cuda_cache import CudaReplayCache, device_tokens

    t = drafts_timed(group, config)  # verify's draft count (None: not a verify group)
    cache = CudaReplayCache(decl, shape, config, slots=rows, params=params, launch=launch)
    if group_spills(cache.module_for(group, rows).local_memory(), group):
        return None
    cache.buffers["checkpoint"][...] = 0.01
    batch = mixed_steady_state(cache, rows)
    toks = device_tokens(cp, decl, {k: v[:, None] for k, v in random_tokens(decl, shape, rng, (rows,)).items()})
    out = cp.empty((rows, 1, shape.heads, shape.v_dim), cp.float32)
    held = [cache, batch, toks, out]  # the graph's buffers: alive as long as the timer is
    if group == "replay":
        stream, graphs = capture_graphs(cp, lambda i: cache.launch_step(batch, toks, out), 1)
    elif t is not None:
        (drafts,), vb, outt = verify_inputs(cp, decl, shape, rng, batch, t)
        held += [drafts, vb, outt]
        stream, graphs = capture_graphs(cp, lambda i: verify_and_commit(cache, vb, drafts, outt, t), 1)
    else:
        stream, graphs = capture_graphs(cp, lambda i: cache._launch("conventional_step", rows, batch, toks, out=out), 1)

    def time_again(reps: int, held=held) -> float:
        return time_graphs(cp, stream, graphs, reps, rotation=config.window if group == "replay" else 1)
    return time_again


def finalists(timings: dict, count: int = CONFIRM_FINALISTS) -> list:
    """The ``count`` fastest candidates of a first pass, fastest first."""
    return sorted(timings, key=timings.get)[:count]


def confirmed_best(rounds: list[dict]):
    """The finalist with the least median over interleaved ``rounds`` (each: launch -> ms), and the
    medians. Candidates within a few per cent of each other trade places between single timings
    (at B = 1 the launch shapes of the replay step lie within 2-5 %), so the choice is confirmed."""
    medians = {c: float(np.median([r[c] for r in rounds])) for c in rounds[0]}
    return min(medians, key=medians.get), medians


def tune_step(decl, shape, config, params: dict, rows: int, reps: int = 20,
              group: str = "replay") -> tuple[LaunchConfig, dict]:
    """Time every candidate on a scratch cache of ``rows`` slots (the decode step of ``group``) and the
    ``score_twins`` of the fastest, then the ``CONFIRM_FINALISTS`` fastest of all again in
    ``CONFIRM_ROUNDS`` interleaved rounds; store and return the finalist of least median (and the
    first pass's times, the twins' among them)."""
    if group not in GROUPS:
        raise ValueError(f"group: expected one of {GROUPS}, got {group!r}")
    rng = np.random.default_rng(0)
    program = lower(decl, shape, config)
    warm_kernel_cache(tuning_sources(program, group))  # every candidate compiled at once, not as each loads
    timings, kept = {}, {}  # kept: the timers of the fastest so far (their caches and graphs held)

    def time_candidate(launch):
        nonlocal kept
        time_again = _timed_launch(decl, shape, config, params, rows, group, launch, rng)
        if time_again is not None:
            timings[launch] = time_again(reps)
            kept[launch] = time_again
            kept = {c: kept[c] for c in finalists({c: timings[c] for c in kept})}
    for launch in distinct_candidates(program, group):
        time_candidate(launch)
    for launch in score_twins(program, group, tuple(kept)):
        time_candidate(launch)
    if not timings:
        raise LoweringError(f"no launch candidate of {[c.label for c in candidates(group)]} builds the {group} "
                            f"kernels without spills for {decl.name!r} at {shape}")
    rounds = [{c: time_again(reps) for c, time_again in kept.items()} for _ in range(CONFIRM_ROUNDS)]
    best, medians = confirmed_best(rounds)
    table = load_table()
    table[table_key(program, rows, group)] = {
        "launch": dataclasses.asdict(best),
        "ms": {c.label: t for c, t in timings.items()},
        "confirmed_ms": {c.label: t for c, t in medians.items()}}
    path = knobs.autotune_cache()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
    tmp.replace(path)
    return best, timings
