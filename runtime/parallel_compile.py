"""Runtime layer: compile many generated modules at once, on a pool of threads, into CuPy's on-disk
kernel cache, so that the ``RawModule`` loads that follow find their cubins there.

NVRTC compiles one module on one core, and a module of the generated kernels takes about 0.2–1 s. The
autotuner compiles every launch candidate of a group (some 70 modules per preset over its four
groups, 370 for the five presets of ``replayssm bench``), one after another, on a fresh machine. CuPy keeps
each cubin in ``~/.cupy/kernel_cache`` (``CUPY_CACHE_DIR``) under a hash of its source and options and
reuses it in any process, so compiling the candidates first on every core makes the tuner's own loads
cache hits, with the cubins it would have built itself. Threads suffice: CuPy's NVRTC binding (like
cuda-python's) releases the GIL while ``nvrtcCompileProgram`` runs, NVRTC allows concurrent calls on
distinct programs, and CuPy writes each cubin to its cache (a temporary file moved into place) before
it loads the module, so the cache holds it even where a thread's own load of it fails. Where the
thread's load succeeds, CuPy's memo of the module serves the caller's load without reading the disk.
(With CuPy 14.2 and no GPU, ``scripts/compile_pool_probe.py``: kimi's 30 replay candidates 17.3 s one
by one, 8.9 s on 2 threads, 30 cubins written before the loads, which fail there; that the caller's
loads find them under the same key, the GPU test ``test_cupy_cache_holds_the_cubins_before_the_loads``.)

``warm_kernel_cache`` never fails the caller: a source that does not compile is left for the load
that needs it to report (a cubin not in the cache is compiled there, as without the pool).
``REPLAYSSM_COMPILE_WORKERS`` sets the pool's size (0 or 1: no pool).
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

from replayssm_dsl import knobs

from .cuda_module import source_hash
from .nvrtc_compile import NVRTC_OPTIONS

_SENT: set[tuple] = set()  # (GPU or None, source hash) this process has sent to a pool (compiled or failed)


def cupy_compile(source: str, device: int) -> None:
    """Compile ``source`` for GPU ``device`` as ``CompiledProgram.module`` does (the same options, so
    the same cache key) into CuPy's kernel cache; on a pool thread, the device made current there
    first (its primary context, which CuPy's module load needs)."""
    import cupy

    with cupy.cuda.Device(device):
        cupy.RawModule(code=source, options=NVRTC_OPTIONS, name_expressions=None).compile()


def _compile_quietly(compile_one, source: str) -> str | None:
    """On a pool thread: ``compile_one(source)``; the error's text instead of raising it."""
    try:
        compile_one(source)
    except Exception as exc:  # noqa: BLE001 - the load that needs the module reports it
        return f"{type(exc).__name__}: {exc}"
    return None


def warm_kernel_cache(sources, workers: int | None = None, compile_one=None) -> dict[str, str]:
    """Compile those of ``sources`` this process has not sent before with ``compile_one`` (default:
    ``cupy_compile`` for the caller's current GPU) on ``workers`` threads (default
    ``knobs.compile_workers()``); return {source hash: error text} of those that failed (the loads
    that need them raise their errors; nothing with fewer than two sources or workers). An
    interrupt cancels the compiles not yet begun."""
    workers = knobs.compile_workers() if workers is None else workers
    device = None
    if compile_one is None:
        import cupy

        device = cupy.cuda.Device().id
        compile_one = functools.partial(cupy_compile, device=device)
    todo = {source_hash(s): s for s in sources}
    todo = {h: s for h, s in todo.items() if (device, h) not in _SENT}
    if workers < 2 or len(todo) < 2:
        return {}
    pool = ThreadPoolExecutor(min(workers, len(todo)), thread_name_prefix="replayssm-compile")
    try:
        errors = dict(zip(todo, pool.map(lambda source: _compile_quietly(compile_one, source), todo.values())))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    _SENT.update((device, h) for h in todo)
    return {h: e for h, e in errors.items() if e is not None}
