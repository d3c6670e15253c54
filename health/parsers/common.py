"""What every probe parser shares: the size bound, the error, and value readers that
answer None for anything missing, ``N/A``, ``[Not Supported]`` or malformed."""

from __future__ import annotations

import re

# No probe output Gantry parses is larger than this; a bigger one is refused whole.
MAX_INPUT_BYTES = 4 * 1024 * 1024

_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")
_ABSENT = {"", "n/a", "none", "[n/a]", "[not supported]", "not supported", "unknown", "[unknown]"}


class ProbeParseError(ValueError):
    """The output cannot be read at all (too large, not the expected format)."""


def check_size(text: str, what: str) -> None:
    if not isinstance(text, str):
        raise ProbeParseError(f"{what}: expected text, got {type(text).__name__}")
    if len(text.encode("utf-8", errors="replace")) > MAX_INPUT_BYTES:
        raise ProbeParseError(f"{what}: larger than {MAX_INPUT_BYTES} bytes, refused")


def clean(value: str | None) -> str | None:
    """The value as text, or None when nvidia-smi says it has none."""
    if value is None:
        return None
    value = value.strip()
    if value.lower() in _ABSENT or value.lower().startswith(("requested functionality", "[")):
        return None
    return value


def number(value: str | None) -> float | None:
    """``"81559 MiB"`` → 81559.0; ``"N/A"`` → None."""
    text = clean(value)
    if text is None:
        return None
    match = _NUMBER.match(text)
    return float(match.group(1)) if match else None


def integer(value: str | None) -> int | None:
    found = number(value)
    return int(found) if found is not None else None


def yes_no(value: str | None) -> bool | None:
    """``Yes``/``No`` (and ``Active``/``Not Active``, ``True``/``False``) → bool."""
    text = clean(value)
    if text is None:
        return None
    lowered = text.lower()
    if lowered in {"yes", "active", "true", "enabled"}:
        return True
    if lowered in {"no", "not active", "false", "disabled"}:
        return False
    return None
