"""Small value parsers shared by the Slurm output parsers: memory, time, TRES, GRES."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from slurm.hostlist import expand

# Slurm's NO_VAL / INFINITE sentinels (32 and 64 bit) mean "not set" / "unlimited".
_SENTINELS = {0xFFFFFFFE, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFE, 0xFFFFFFFFFFFFFFFF, 0xFFFE, 0xFFFF}
_EMPTY = {"", "(null)", "n/a", "none", "n/s", "unknown", "invalid", "partition_limit"}
_UNLIMITED = {"unlimited", "infinite"}

_MEMORY_FACTORS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024, "P": 1024**3}
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:I?B)?$", re.IGNORECASE)


def parse_memory(text: str | int | float | None) -> int | None:
    """Slurm memory size -> whole MB (MiB, as Slurm counts). Bare numbers are MB.

    ``"4000"`` -> 4000, ``"4G"`` -> 4096, ``"1.5T"`` -> 1572864, ``"512K"`` -> 1
    (rounded up: a non-zero amount never becomes zero). Empty/N/A -> None.
    """
    if text is None:
        return None
    if isinstance(text, int | float):
        return None if int(text) in _SENTINELS else math.ceil(text)
    value = text.strip()
    if value.lower() in _EMPTY or value.lower() in _UNLIMITED:
        return None
    match = _MEMORY.match(value)
    if not match:
        raise ValueError(f"not a memory size: {text!r}")
    number = float(match.group(1)) * _MEMORY_FACTORS[(match.group(2) or "M").upper()]
    return math.ceil(number)


def parse_duration_seconds(text: str | int | None) -> int | None:
    """Slurm time string -> seconds; UNLIMITED/INFINITE/NONE/INVALID/empty -> None.

    Forms (Slurm's own): ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``;
    seconds may carry a fraction (``00:01.234``, sacct's CPU times), rounded up.
    An int is taken as minutes, as Slurm's JSON gives time limits.
    """
    if text is None:
        return None
    if isinstance(text, int):
        return None if text in _SENTINELS else text * 60
    value = text.strip()
    if value.lower() in _EMPTY or value.lower() in _UNLIMITED:
        return None
    days = 0
    rest = value
    if "-" in value:
        day_text, _, rest = value.partition("-")
        if not day_text.isdigit():
            raise ValueError(f"not a Slurm time: {text!r}")
        days = int(day_text)
    fields = rest.split(":")
    if not 1 <= len(fields) <= 3 or not all(_is_number(field) for field in fields):
        raise ValueError(f"not a Slurm time: {text!r}")
    numbers = [float(field) for field in fields]
    if "-" in value:
        # After "D-" the first field is hours: D-H, D-H:M, D-H:M:S.
        hours, minutes, seconds = [*numbers, 0.0, 0.0][:3]
    elif len(numbers) == 1:
        hours, minutes, seconds = 0.0, numbers[0], 0.0
    elif len(numbers) == 2:
        hours, minutes, seconds = 0.0, numbers[0], numbers[1]
    else:
        hours, minutes, seconds = numbers
    return math.ceil(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def _is_number(text: str) -> bool:
    return bool(re.fullmatch(r"\d+(\.\d+)?", text))


def parse_slurm_time(text: str | int | None) -> int | None:
    """Slurm time string -> whole minutes (rounded up, as Slurm rounds limits); None if unset."""
    seconds = parse_duration_seconds(text)
    return None if seconds is None else math.ceil(seconds / 60)


def parse_timestamp(value: Any) -> datetime | None:
    """Epoch seconds (int, digit string, or ``{"number": ...}``) or ISO text -> aware UTC.

    0, sentinels, ``Unknown``, ``None`` -> None. ISO text without an offset is
    taken as UTC (our text commands set ``SLURM_TIME_FORMAT=%s`` to avoid that).
    """
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, dict | int | float) and not isinstance(value, bool):
        number = json_number(value)
        if number is None or number <= 0:
            return None
        return datetime.fromtimestamp(number, tz=UTC)
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.lower() in _EMPTY:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"not a timestamp: {value!r}") from exc
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def json_number(value: Any) -> int | None:
    """A number from Slurm JSON: plain int, or ``{"set": b, "infinite": b, "number": n}``.

    Unset, infinite and sentinel values -> None.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, dict):
        if value.get("infinite") or value.get("set") is False:
            return None
        value = value.get("number")
    if isinstance(value, float):
        value = int(value)
    if isinstance(value, int):
        return None if value in _SENTINELS else value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number = int(value)
        return None if number in _SENTINELS else number
    return None


def parse_tres(text: str | None) -> dict[str, str]:
    """``"cpu=2,mem=1000M,node=1,billing=2,gres/gpu=1"`` -> ``{"cpu": "2", ...}``."""
    result: dict[str, str] = {}
    if not text or text.strip() in ("(null)", "N/A"):
        return result
    for item in text.strip().split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"not a TRES item {item!r} in {text!r}")
        result[key.strip()] = value.strip()
    return result


def tres_gpu_count(tres: dict[str, str]) -> int:
    """Total GPUs in a TRES dict: ``gres/gpu`` if present, else the sum of typed entries."""
    if "gres/gpu" in tres:
        return parse_count(tres["gres/gpu"])
    return sum(parse_count(value) for key, value in tres.items() if key.startswith("gres/gpu:"))


def parse_count(text: str | int) -> int:
    """``"2"`` -> 2, ``"2K"`` -> 2048 (Slurm counts use binary suffixes)."""
    if isinstance(text, int):
        return text
    value = text.strip()
    factors = {"K": 1024, "M": 1024**2, "G": 1024**3}
    if value and value[-1].upper() in factors and value[:-1].isdigit():
        return int(value[:-1]) * factors[value[-1].upper()]
    if not value.isdigit():
        raise ValueError(f"not a count: {text!r}")
    return int(value)


@dataclass(frozen=True)
class Gres:
    """One generic resource entry: ``gpu:a100:2(S:0)`` or ``gpu:h100:1(IDX:0)``."""

    name: str
    type: str | None
    count: int
    indexes: tuple[int, ...] = ()
    sockets: tuple[int, ...] = ()

    @property
    def is_gpu(self) -> bool:
        return self.name == "gpu"


# A GPU entry is a Gres whose name is "gpu"; the alias keeps call sites readable.
GpuGres = Gres


def _int_ranges(text: str) -> tuple[int, ...]:
    numbers: list[int] = []
    for item in text.split(","):
        item = item.strip()
        if not item or item.upper() == "N/A":
            continue
        low, dash, high = item.partition("-")
        if dash:
            numbers.extend(range(int(low), int(high) + 1))
        else:
            numbers.append(int(low))
    return tuple(numbers)


def _split_outside_parens(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


_GRES_ITEM = re.compile(r"^(?P<spec>[^()]+?)(?:\((?P<extra>[^()]*)\))?$")


def parse_gres(text: str | None) -> list[Gres]:
    """Parse a node/job GRES string into entries.

    ``"gpu:a100:2(S:0)"``, ``"gpu:h100:2(IDX:0-1)"``, ``"gpu:2"``, ``"gpu"``,
    ``"gpu:a100:2(S:0-1),shard:8"``, ``"(null)"`` -> [] . Slurm's ``gres:`` prefix
    (job TRES-per-node strings) is dropped.
    """
    if text is None:
        return []
    value = text.strip()
    if value in ("", "(null)", "N/A", "none"):
        return []
    entries: list[Gres] = []
    for item in _split_outside_parens(value):
        item = item.strip()
        if not item:
            continue
        match = _GRES_ITEM.match(item)
        if not match:
            raise ValueError(f"not a GRES entry {item!r} in {text!r}")
        fields = match.group("spec").split(":")
        if fields[0] == "gres" and len(fields) > 1:
            fields = fields[1:]
        name = fields[0]
        gres_type: str | None = None
        count = 1
        if len(fields) == 2:
            # "gpu:2" (count) or "gpu:a100" (type, count 1).
            if re.fullmatch(r"\d+[KMG]?", fields[1]):
                count = parse_count(fields[1])
            else:
                gres_type = fields[1]
        elif len(fields) >= 3:
            gres_type = fields[1]
            count = parse_count(fields[2])
        indexes: tuple[int, ...] = ()
        sockets: tuple[int, ...] = ()
        extra = match.group("extra")
        if extra:
            for part in re.split(r"[()]", extra):
                key, sep, rest = part.partition(":")
                if not sep:
                    continue
                try:
                    if key.strip().upper() == "IDX":
                        indexes = _int_ranges(rest)
                    elif key.strip().upper() == "S":
                        sockets = _int_ranges(rest)
                except ValueError as exc:
                    raise ValueError(f"bad index list in GRES entry {item!r}") from exc
        if not name:
            raise ValueError(f"GRES entry without a name: {item!r}")
        entries.append(
            Gres(name=name, type=gres_type, count=count, indexes=indexes, sockets=sockets)
        )
    return entries


def expand_nodes(text: str | None) -> tuple[str, ...]:
    return tuple(expand(text))
