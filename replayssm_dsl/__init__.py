"""replayssm-dsl: declare a linear-recurrence layer, generate its ReplaySSM decode kernels.

DSL layer (this package's own modules): declarations, expressions, configurations, the NumPy
references. It imports neither the lowering nor the runtime; they import it.
"""

from . import ops
from .config import ModelShape, ReplayConfig, preset
from .declaration import Declaration, Recurrence, delta, plain
from .errors import BackendUnavailable, CapacityError, ConfigError, DeclarationError, InputError, ReplaySSMError

__all__ = ["ops", "Recurrence", "Declaration", "plain", "delta", "ModelShape", "ReplayConfig", "preset",
           "ReplaySSMError", "DeclarationError", "ConfigError", "InputError", "CapacityError",
           "BackendUnavailable"]
__version__ = "0.1.0"
