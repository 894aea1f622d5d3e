"""DSL layer: the exceptions every layer raises.

Each names the argument or field at fault and says why, so that a user who passed a wrong shape,
a duplicate slot or an invalid declaration sees what to change without reading the source.
Imports nothing from the project.
"""

from __future__ import annotations


class ReplaySSMError(Exception):
    """Base class of every error the project raises on purpose."""


class DeclarationError(ReplaySSMError, ValueError):
    """A recurrence declaration that replay cannot serve, or that is incomplete or inconsistent."""


class ConfigError(ReplaySSMError, ValueError):
    """A configuration (sizes, heads, window, dtypes) that does not fit the declaration."""


class InputError(ReplaySSMError, ValueError):
    """A bad argument at call time: shape, dtype, stride, device, slot, draft count, non-finite values."""


class CapacityError(InputError):
    """A request that would overflow a record buffer or exhaust a pool of slots or pages."""


class BackendUnavailable(ReplaySSMError, ImportError):
    """A command or backend that needs what this machine lacks (CuPy, a GPU, NVRTC); says what to install."""


class LoweringError(ReplaySSMError, ValueError):
    """A declaration or configuration the chosen backend cannot render (names the construct)."""
