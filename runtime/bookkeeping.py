"""Runtime layer: the host-side bookkeeping of replay buffers (slots, copy-on-write pages, fills).

``SlotPool`` is the compiled class (``runtime/_bookkeeping.pyx``); ``PySlotPool`` is its readable
pure-Python twin and spec (``runtime/bookkeeping_py.py``), with the same API and error messages.
Read ``bookkeeping_py``'s docstring for the model and the step protocol (build_* then
report_step / commit; reused output buffers; ``set_step_buffers`` for caller-owned, e.g. pinned, arrays).

There is no silent fallback: when the extension is not built, importing this module raises an
ImportError that says how to build it. Use ``PySlotPool`` explicitly if you want the slow path.

May import: ``runtime._bookkeeping``, ``runtime.bookkeeping_py`` (and through them NumPy,
``replayssm_dsl.errors``, ``replayssm_dsl.lowering.buffer_rules``).
"""

from __future__ import annotations

from .bookkeeping_py import NULL_SLOT, PySlotPool

try:
    from ._bookkeeping import SlotPool
except ImportError as error:  # pragma: no cover - depends on the build
    raise ImportError(
        "replayssm_dsl.runtime._bookkeeping (the Cython SlotPool) is not built or cannot be loaded "
        f"({error}). Build it with `pip install -e .` from the repository root (needs Cython and a "
        "C compiler), or in place with `cythonize -i runtime/_bookkeeping.pyx`. "
        "PySlotPool (replayssm_dsl.runtime.bookkeeping_py) is the pure-Python twin, for tests only."
    ) from error

__all__ = ["NULL_SLOT", "PySlotPool", "SlotPool"]
