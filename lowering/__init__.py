"""Lowering layer: declarations → IR of kernel plans (``lower``), traffic model, CUDA rendering.

Imports the DSL layer only, never the runtime; needs neither CuPy nor a GPU.
"""

from .ir import Buffer, Kernel, Program, Stmt, When
from .lower import lower

__all__ = ["lower", "Program", "Kernel", "Stmt", "When", "Buffer"]
