"""Training configuration: JSON in, validated :class:`Config` out.

``validate(dict) -> Config`` is pure Python (no torch work) so Gantry's web form can call
it in-process. Every rejection raises :class:`ConfigError` naming the key and why.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = [
    "DEFAULTS",
    "MODEL_KEYS",
    "PRESETS",
    "STRATEGIES",
    "Config",
    "ConfigError",
    "DataConfig",
    "canonical_json",
    "load_file",
    "validate",
]


class ConfigError(ValueError):
    """An invalid configuration value. ``key`` is a dotted path (``data.order``)."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key = key
        self.why = why


# Model sizes a preset sets; explicit keys in the config override the preset.
MODEL_KEYS = ("vocab_size", "d_model", "n_layers", "n_heads", "seq_len", "batch_size")

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "vocab_size": 32,
        "d_model": 64,
        "n_layers": 2,
        "n_heads": 4,
        "seq_len": 64,
        "batch_size": 16,
    },
    "small": {
        "vocab_size": 256,
        "d_model": 256,
        "n_layers": 4,
        "n_heads": 8,
        "seq_len": 128,
        "batch_size": 32,
    },
}

# Distribution strategies: data-parallel replicas, or fully sharded (FSDP2).
STRATEGIES = ("ddp", "fsdp")

# Largest number of Markov contexts (vocab_size ** order) the data source will tabulate.
MAX_CONTEXTS = 1 << 20


@dataclass(frozen=True)
class DataConfig:
    kind: str = "markov"
    order: int = 1
    seed: int = 1234
    branching: int = 4
    alpha: float = 1.0


@dataclass(frozen=True)
class Config:
    preset: str | None = None
    vocab_size: int = 32
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int | None = None
    seq_len: int = 64
    batch_size: int = 16
    steps: int = 200
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    precision: str = "fp32"
    # ddp: every rank holds a full replica; fsdp: parameters, gradients and optimizer state
    # sharded over the ranks (FSDP2, per transformer block plus the root).
    strategy: str = "ddp"
    device: str = "auto"
    seed: int = 0
    checkpoint_every: int = 100
    checkpoint_keep: int = 3
    checkpoint_async: bool = True
    # Deterministic kernels (and no TF32 on GPUs): a drill of this run on the same shape
    # can then compare bit for bit on a GPU too. Drills always run deterministically.
    deterministic: bool = False
    log_every: int = 1
    target_epsilon: float = 0.05
    target_window: int = 10
    data: DataConfig = field(default_factory=DataConfig)

    @property
    def ff_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sha256(self) -> str:
        return hashlib.sha256(canonical_json(self.to_dict()).encode()).hexdigest()

    def replace(self, **changes: Any) -> Config:
        d = self.to_dict()
        d.update(changes)
        return validate(d)


DEFAULTS: dict[str, Any] = Config().to_dict()

_TOP_TYPES: dict[str, tuple[str, ...]] = {
    "preset": ("str", "null"),
    "vocab_size": ("int",),
    "d_model": ("int",),
    "n_layers": ("int",),
    "n_heads": ("int",),
    "d_ff": ("int", "null"),
    "seq_len": ("int",),
    "batch_size": ("int",),
    "steps": ("int",),
    "lr": ("float",),
    "min_lr_ratio": ("float",),
    "warmup_steps": ("int",),
    "weight_decay": ("float",),
    "grad_clip": ("float",),
    "precision": ("str",),
    "strategy": ("str",),
    "device": ("str",),
    "seed": ("int",),
    "checkpoint_every": ("int",),
    "checkpoint_keep": ("int",),
    "checkpoint_async": ("bool",),
    "deterministic": ("bool",),
    "log_every": ("int",),
    "target_epsilon": ("float",),
    "target_window": ("int",),
    "data": ("object",),
}
_DATA_TYPES: dict[str, tuple[str, ...]] = {
    "kind": ("str",),
    "order": ("int",),
    "seed": ("int",),
    "branching": ("int",),
    "alpha": ("float",),
}
assert set(_TOP_TYPES) == {f.name for f in fields(Config)}
assert set(_DATA_TYPES) == {f.name for f in fields(DataConfig)}


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _type_ok(value: Any, kinds: tuple[str, ...]) -> bool:
    for k in kinds:
        if k == "null" and value is None:
            return True
        if k == "int" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if (
            k == "float"
            and isinstance(value, int | float)
            and not isinstance(value, bool)
            and value == value  # not NaN
            and value not in (float("inf"), float("-inf"))
        ):
            return True
        if k == "str" and isinstance(value, str):
            return True
        if k == "bool" and isinstance(value, bool):
            return True
        if k == "object" and isinstance(value, dict):
            return True
    return False


def _check_types(raw: dict[str, Any], types: dict[str, tuple[str, ...]], prefix: str) -> None:
    for key in raw:
        if not isinstance(key, str) or key not in types:
            allowed = ", ".join(sorted(types))
            raise ConfigError(f"{prefix}{key}", f"unknown key (allowed: {allowed})")
    for key, value in raw.items():
        kinds = types[key]
        if not _type_ok(value, kinds):
            want = " or ".join("number" if k == "float" else k for k in kinds)
            raise ConfigError(f"{prefix}{key}", f"expected {want}, got {type(value).__name__}")


def _at_least(cfg: dict[str, Any], key: str, lo: float, prefix: str = "") -> None:
    if cfg[key] < lo:
        raise ConfigError(f"{prefix}{key}", f"must be >= {lo}, got {cfg[key]}")


def validate(raw: Any) -> Config:
    """Validate a config mapping (as parsed from JSON) and return a :class:`Config`.

    Raises :class:`ConfigError` with the offending key and the reason.
    """
    if not isinstance(raw, dict):
        raise ConfigError("<config>", f"expected a JSON object, got {type(raw).__name__}")
    raw = copy.deepcopy(raw)
    _check_types(raw, _TOP_TYPES, "")
    data_raw = raw.pop("data", None) or {}
    _check_types(data_raw, _DATA_TYPES, "data.")

    merged: dict[str, Any] = {k: v for k, v in DEFAULTS.items() if k != "data"}
    preset = raw.get("preset")
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError("preset", f"unknown preset {preset!r} (known: {', '.join(PRESETS)})")
        merged.update(PRESETS[preset])
    merged.update(raw)
    data = {**DEFAULTS["data"], **data_raw}

    for key in ("vocab_size",):
        _at_least(merged, key, 2)
    for key in ("d_model", "n_layers", "n_heads", "seq_len", "batch_size", "steps", "log_every"):
        _at_least(merged, key, 1)
    for key in ("checkpoint_keep", "target_window"):
        _at_least(merged, key, 1)
    for key in ("warmup_steps", "checkpoint_every", "weight_decay", "grad_clip"):
        _at_least(merged, key, 0)
    if merged["d_ff"] is not None:
        _at_least(merged, "d_ff", 1)
    if merged["lr"] <= 0:
        raise ConfigError("lr", f"must be > 0, got {merged['lr']}")
    if merged["target_epsilon"] <= 0:
        raise ConfigError("target_epsilon", f"must be > 0, got {merged['target_epsilon']}")
    if not 0 <= merged["min_lr_ratio"] <= 1:
        raise ConfigError("min_lr_ratio", f"must be in [0, 1], got {merged['min_lr_ratio']}")
    if merged["d_model"] % merged["n_heads"] != 0:
        raise ConfigError(
            "d_model",
            f"d_model={merged['d_model']} is not divisible by n_heads={merged['n_heads']}",
        )
    if merged["precision"] not in ("fp32", "bf16"):
        raise ConfigError("precision", f"must be 'fp32' or 'bf16', got {merged['precision']!r}")
    if merged["strategy"] not in STRATEGIES:
        raise ConfigError("strategy", f"must be 'ddp' or 'fsdp', got {merged['strategy']!r}")
    if merged["device"] not in ("auto", "cpu", "cuda"):
        raise ConfigError("device", f"must be 'auto', 'cpu' or 'cuda', got {merged['device']!r}")

    if data["kind"] != "markov":
        raise ConfigError("data.kind", f"only 'markov' is supported, got {data['kind']!r}")
    _at_least(data, "order", 1, "data.")
    _at_least(data, "branching", 1, "data.")
    if data["branching"] > merged["vocab_size"]:
        raise ConfigError(
            "data.branching",
            f"branching={data['branching']} exceeds vocab_size={merged['vocab_size']}",
        )
    if data["alpha"] <= 0:
        raise ConfigError("data.alpha", f"must be > 0, got {data['alpha']}")
    contexts = merged["vocab_size"] ** data["order"]
    if contexts > MAX_CONTEXTS:
        raise ConfigError(
            "data.order",
            f"vocab_size**order = {contexts} contexts exceeds the limit {MAX_CONTEXTS}",
        )
    if merged["seq_len"] < data["order"]:
        raise ConfigError(
            "seq_len",
            f"seq_len={merged['seq_len']} must be >= data.order={data['order']} "
            "so every sample has at least one fully-conditioned target",
        )
    for key in ("lr", "min_lr_ratio", "weight_decay", "grad_clip", "target_epsilon"):
        merged[key] = float(merged[key])
    data["alpha"] = float(data["alpha"])
    return Config(**merged, data=DataConfig(**data))


def load_file(path: str) -> Config:
    """Read and validate a JSON config file; errors are :class:`ConfigError`."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError("<file>", f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("<file>", f"{path} is not valid JSON: {exc}") from None
    return validate(raw)
