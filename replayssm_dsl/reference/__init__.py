"""DSL layer: NumPy references: the generic plain recurrence and hand-written per-variant oracles."""

from .handwritten import HANDWRITTEN
from .plain import plain_recurrence

__all__ = ["plain_recurrence", "HANDWRITTEN"]
