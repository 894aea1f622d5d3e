"""DSL layer: sizes and replay settings a declaration is lowered for, and the model presets.

``ModelShape`` is the layer's geometry (value heads ``HV``, key heads ``H``, ``V``, ``K``);
``ReplayConfig`` the replay window ``L``, the most drafts ``T`` a verify takes, and the dtypes.
Presets are the model shapes of docs/design.md ("Traffic model", ``DESIGN_PRESETS``), and Kimi Linear's
shape with FLA's safe gate. Imports ``errors`` only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import ConfigError

STATE_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}
READ_ONLY_DTYPES = {"float8_e4m3": 1, "nvfp4": 0.5625}  # valid only for a low-precision read copy (later)
DTYPE_BYTES = {**STATE_DTYPES, **READ_ONLY_DTYPES}
RECORD_DTYPES = ("float32", "bfloat16")
RAW_RECORD_FIELDS = ("key", "decay")  # record fields that record_dtype="bfloat16" may keep as a bf16 token input


@dataclass(frozen=True)
class ModelShape:
    """One recurrence layer's geometry: state ``[HV, V, K]`` per sequence, keys per ``H`` key heads."""

    heads: int  # HV, value heads
    key_heads: int  # H, key heads (Mamba-2: ngroups)
    v_dim: int  # V, rows of the state
    k_dim: int  # K, the contiguous axis

    def __post_init__(self):
        for name in ("heads", "key_heads", "v_dim", "k_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name}: must be a positive int, got {value!r}")
        if self.heads % self.key_heads:
            raise ConfigError(f"key_heads: {self.key_heads} does not divide heads={self.heads}; each key head "
                              "(group) must serve the same number of value heads")

    @property
    def group_size(self) -> int:
        return self.heads // self.key_heads

    @property
    def state_elements(self) -> int:
        """``E = V·K``, elements of one head's state."""
        return self.v_dim * self.k_dim


MAX_CAPACITY = 31  # records per slot (window + max_drafts): one per lane of a warp, the 32nd the new token's


@dataclass(frozen=True)
class ReplayConfig:
    """Replay window ``L``, draft limit ``T`` and storage dtypes; ``capacity = L + T`` records per slot.

    ``record_dtype="bfloat16"``: a record's key (or decay vector) computed from one token input
    declared bf16 is kept as that input's bits, exact, and recomputed where read (half those bytes
    and that memory; lowering/record_inputs.py); everything else in the records stays float32.
    ``raw_record_fields`` names which of the two may be kept so (default both): ``("key",)`` keeps
    the decays' cumulative sums in float32, so no kernel recomputes them.

    ``scaled_keys`` (default on): where the declaration's gate bounds each token's log-decay below
    (``Declaration.decay_lower_bound``, e.g. FLA's safe gate) and the records are float32, a decay
    vector's records keep decay-scaled keys and the kernels read only the newest record's decays
    (lowering/record_keys.py); off, or for an unbounded gate, records keep the keys as they are."""

    window: int = 16
    max_drafts: int = 8
    state_dtype: str = "float32"
    record_dtype: str = "float32"
    raw_record_fields: tuple = RAW_RECORD_FIELDS
    scaled_keys: bool = True

    def __post_init__(self):
        if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 1:
            raise ConfigError(f"window: must be an int >= 1, got {self.window!r}")
        if not isinstance(self.max_drafts, int) or isinstance(self.max_drafts, bool) or not 1 <= self.max_drafts <= 8:
            raise ConfigError(f"max_drafts: must be an int in 1..8, got {self.max_drafts!r}")
        if self.window + self.max_drafts > MAX_CAPACITY:
            raise ConfigError(f"window: window + max_drafts = {self.window + self.max_drafts} > {MAX_CAPACITY}: the "
                              "kernels keep a slot's records one per lane of a warp, with a lane for the new token "
                              f"(use window <= {MAX_CAPACITY - self.max_drafts} with max_drafts={self.max_drafts})")
        for name in ("state_dtype", "record_dtype"):
            dtype = getattr(self, name)
            if dtype in READ_ONLY_DTYPES:
                raise ConfigError(f"{name}: {dtype} cannot carry the recurrence (its rounding error would "
                                  "grow with length); use float32, float16 or bfloat16")
            if dtype not in STATE_DTYPES:
                raise ConfigError(f"{name}: unknown dtype {dtype!r}; use one of {sorted(STATE_DTYPES)}")
        if self.record_dtype not in RECORD_DTYPES:
            raise ConfigError(f"record_dtype: {self.record_dtype!r}; use float32, or bfloat16 (record fields computed "
                              "from one bf16 token input keep its bits; writes and cumulative decays stay FP32)")
        fields = self.raw_record_fields
        if (not isinstance(fields, tuple) or not fields or len(set(fields)) != len(fields)
                or any(f not in RAW_RECORD_FIELDS for f in fields)):
            raise ConfigError(f"raw_record_fields: {fields!r}; use a tuple of distinct names out of {RAW_RECORD_FIELDS}")
        if self.record_dtype == "float32" and set(fields) != set(RAW_RECORD_FIELDS):
            raise ConfigError(f"raw_record_fields: {fields!r} chooses fields of bf16 records; float32 records keep "
                              "every field in float32 (set record_dtype='bfloat16')")
        if not isinstance(self.scaled_keys, bool):
            raise ConfigError(f"scaled_keys: must be True or False, got {self.scaled_keys!r}")
        # one order, so equal choices are equal configs (and share a tuning-table key)
        object.__setattr__(self, "raw_record_fields", tuple(f for f in RAW_RECORD_FIELDS if f in fields))

    @property
    def capacity(self) -> int:
        return self.window + self.max_drafts

    def as_dict(self) -> dict:
        return asdict(self)


def parse_raw_record_fields(text: str) -> tuple:
    """A command line's ``--raw-record-fields``: ``"key, decay"`` → ``("key", "decay")`` (checked by
    ``ReplayConfig``)."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


@dataclass(frozen=True)
class Preset:
    name: str
    variant: str
    shape: ModelShape
    note: str


PRESETS = {p.name: p for p in [
    Preset("nemotron-nano-4b", "mamba2", ModelShape(96, 8, 80, 128), "Nemotron-3-Nano-4B, Mamba-2"),
    Preset("nemotron-super-120b", "mamba2", ModelShape(128, 8, 64, 128), "Nemotron-3-Super-120B, Mamba-2"),
    Preset("qwen3.5-4b", "gdn", ModelShape(32, 16, 128, 128), "Qwen3.5-4B, Gated DeltaNet"),
    Preset("qwen3.5-122b", "gdn", ModelShape(64, 16, 128, 128), "Qwen3.5-122B, Gated DeltaNet"),
    Preset("kimi-linear", "kda", ModelShape(32, 32, 128, 128), "Kimi Linear, Kimi Delta Attention"),
    Preset("kimi-linear-safe-gate", "kda_safe_gate", ModelShape(32, 32, 128, 128),
           "Kimi Linear's shape with FLA's safe gate (lower_bound = -5): records of decay-scaled keys"),
]}
DESIGN_PRESETS = ("nemotron-nano-4b", "nemotron-super-120b", "qwen3.5-4b", "qwen3.5-122b", "kimi-linear")  # docs/design.md's five


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ConfigError(f"preset: unknown {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]
