"""Shared parsing helpers: JSON documents, key=value records, state words."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from slurm.errors import SlurmParseError
from slurm.parsers.models import JOB_STATE_ALIASES
from slurm.units import (
    json_number,
)

# ---------------------------------------------------------------- helpers

T = TypeVar("T")


def snippet(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit]


def guarded(what: str, source: str, func: Callable[..., T], *args: Any) -> T:
    """Run ``func(*args)``; turn a ValueError/KeyError/TypeError into SlurmParseError."""
    try:
        return func(*args)
    except SlurmParseError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise SlurmParseError(what, snippet(source), str(exc)) from exc


def load_json(text: str, what: str, list_key: str) -> list[dict[str, Any]]:
    """Parse a Slurm ``--json`` document and return its ``list_key`` list."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(what, snippet(text), f"not JSON: {exc.msg}") from exc
    if not isinstance(document, dict):
        raise SlurmParseError(what, snippet(text), "expected a JSON object")
    errors = document.get("errors")
    items = document.get(list_key)
    if not isinstance(items, list):
        detail = f"no {list_key!r} list in the document"
        if errors:
            detail += f"; Slurm reported: {errors!r}"[:300]
        raise SlurmParseError(what, snippet(text), detail)
    if not all(isinstance(item, dict) for item in items):
        raise SlurmParseError(what, snippet(text), f"{list_key!r} holds non-objects")
    return items


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):
        # Slurm >= 23.02 sometimes wraps strings; take the obvious member.
        for key in ("name", "value", "job"):
            if isinstance(value.get(key), str):
                return as_text(value[key])
        return None
    text = str(value).strip()
    return None if text in ("", "(null)", "N/A", "None") else text


def str_list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(str(item).strip() for item in value if str(item).strip())
    text = str(value).strip()
    if text in ("", "(null)", "N/A"):
        return ()
    return tuple(part.strip() for part in text.split(",") if part.strip())


def state_words(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(item).upper() for item in value]
    if value is None:
        return []
    return [part for part in str(value).upper().split("+") if part]


# ---------------------------------------------------------------- node states

_NODE_SUFFIX_FLAGS = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "%": "POWERING_DOWN",
    "$": "MAINTENANCE",
    "@": "REBOOT_REQUESTED",
    "!": "POWER_DOWN",
    "^": "REBOOT_ISSUED",
    "-": "PLANNED",
}
_NODE_BASES = {
    "IDLE": ("IDLE", ()),
    "ALLOC": ("ALLOCATED", ()),
    "ALLOCATED": ("ALLOCATED", ()),
    "MIX": ("MIXED", ()),
    "MIXED": ("MIXED", ()),
    "DOWN": ("DOWN", ()),
    "UNK": ("UNKNOWN", ()),
    "UNKNOWN": ("UNKNOWN", ()),
    "ERROR": ("ERROR", ()),
    "FUTURE": ("FUTURE", ()),
    "FUTR": ("FUTURE", ()),
    # sinfo's compound words: base plus the flag they stand for.
    "DRAIN": ("IDLE", ("DRAIN",)),
    "DRAINED": ("IDLE", ("DRAIN",)),
    "DRNG": ("ALLOCATED", ("DRAIN",)),
    "DRAINING": ("ALLOCATED", ("DRAIN",)),
    "COMP": ("IDLE", ("COMPLETING",)),
    "COMPLETING": ("IDLE", ("COMPLETING",)),
    "FAIL": ("IDLE", ("FAIL",)),
    "FAILING": ("ALLOCATED", ("FAIL",)),
    "MAINT": ("IDLE", ("MAINTENANCE",)),
    "INVAL": ("UNKNOWN", ("INVALID_REG",)),
    "RESV": ("IDLE", ("RESERVED",)),
    "RESERVED": ("IDLE", ("RESERVED",)),
    "PLND": ("IDLE", ("PLANNED",)),
    "PLANNED": ("IDLE", ("PLANNED",)),
    "NPC": ("IDLE", ("POWER_DOWN",)),
    "POW_DN": ("IDLE", ("POWERED_DOWN",)),
    "POWERED_DOWN": ("IDLE", ("POWERED_DOWN",)),
    "REBOOT": ("IDLE", ("REBOOT_REQUESTED",)),
}


def normalise_node_state(words: Iterable[str]) -> tuple[str, tuple[str, ...]]:
    """Slurm state words (``["IDLE", "DRAIN"]``, ``["drained*"]``) -> (state, flags).

    ``state`` is one of idle, mixed, allocated, completing, down, drained,
    draining, fail, failing, future, error, inval, unknown. DRAIN wins over the
    base state as in Slurm's own display, except that a DOWN node stays
    ``down`` (the drain flag is kept in the flags).
    """
    base: str | None = None
    flags: list[str] = []
    for raw in words:
        word = raw.strip().upper()
        while word and word[-1] in _NODE_SUFFIX_FLAGS:
            flags.append(_NODE_SUFFIX_FLAGS[word[-1]])
            word = word[:-1]
        if not word:
            continue
        if base is None and word in _NODE_BASES:
            base, implied = _NODE_BASES[word]
            flags.extend(implied)
        elif word == "INVAL" or word == "INVALID":
            flags.append("INVALID_REG")
        else:
            flags.append(word)
    base = base or "UNKNOWN"
    unique_flags = tuple(dict.fromkeys(flags))
    busy = base in ("ALLOCATED", "MIXED") or "COMPLETING" in unique_flags
    if base == "DOWN":
        state = "down"
    elif "DRAIN" in unique_flags:
        state = "draining" if busy else "drained"
    elif "FAIL" in unique_flags:
        state = "failing" if busy else "fail"
    elif "INVALID_REG" in unique_flags and base == "UNKNOWN":
        state = "inval"
    elif base == "IDLE" and "COMPLETING" in unique_flags:
        state = "completing"
    else:
        state = base.lower()
    return state, unique_flags


def normalise_job_state(value: Any) -> tuple[str, tuple[str, ...]]:
    """``"RUNNING"``, ``["RUNNING", "COMPLETING"]``, ``"CANCELLED by 1000"``, ``"CD"`` -> base."""
    words = value if isinstance(value, list) else [value] if value is not None else []
    states: list[str] = []
    for word in words:
        text = str(word).strip().upper()
        # sacct: "CANCELLED by 1000"; squeue text may add "+" flags.
        text = text.split(" ", 1)[0]
        for part in text.split("+"):
            if part:
                states.append(JOB_STATE_ALIASES.get(part, part))
    if not states:
        return "UNKNOWN", ()
    return states[0], tuple(states[1:])


# ---------------------------------------------------------------- key=value text


_KEY_TOKEN = re.compile(r"^([A-Za-z][A-Za-z0-9_/:.\[\]-]*)=(.*)$", re.DOTALL)
_WHOLE_LINE_KEYS = ("OS", "Reason", "Comment", "Extra", "Command", "WorkDir", "StdOut", "StdErr")
# In the one-line (-o) node form, Reason= runs to the end unless one of these follows.
_AFTER_REASON_KEYS = {"Comment", "Extra", "ResumeAfterTime", "InstanceId", "InstanceType"}


def _kv_line(line: str, pairs: dict[str, str], absorbing_key: str | None) -> None:
    """Split ``Key=value Key=value`` where values may contain spaces.

    A token that does not look like ``Key=`` continues the previous value. After
    ``absorbing_key`` (a node's ``Reason=``, free text that may hold ``=``) every
    token continues it unless it starts one of ``_AFTER_REASON_KEYS``.
    """
    current: str | None = None
    for token in line.split(" "):
        if token == "":
            continue
        match = _KEY_TOKEN.match(token)
        starts_key = match is not None and not (
            current is not None
            and current == absorbing_key
            and match.group(1) not in _AFTER_REASON_KEYS
        )
        if match and starts_key:
            current = match.group(1)
            pairs[current] = match.group(2)
        elif current is not None:
            pairs[current] = f"{pairs[current]} {token}" if pairs[current] else token
        else:
            raise ValueError(f"text before the first key: {token!r}")


def parse_kv_records(
    text: str, record_key: str, absorbing_key: str | None = None
) -> list[dict[str, str]]:
    """``scontrol show <thing>`` (multi-line or ``-o``) -> one dict per record."""
    records: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line:
            continue
        if line.startswith(f"{record_key}="):
            current = {}
            records.append(current)
        if current is None:
            if line.lower().startswith("no ") or "not found" in line.lower():
                continue
            raise ValueError(f"expected a line starting with {record_key}=, got {line!r}")
        whole = next((key for key in _WHOLE_LINE_KEYS if line.startswith(f"{key}=")), None)
        if whole and not line.startswith(f"{record_key}="):
            current[whole] = line[len(whole) + 1 :].strip()
        else:
            _kv_line(line, current, absorbing_key)
    return records


def as_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, int | dict):
        return json_number(value)
    text = str(value).strip()
    if text.upper() in ("", "N/A", "(NULL)", "UNLIMITED", "NONE", "INFINITE"):
        return None
    return int(text)


def is_yes(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().upper() in ("YES", "TRUE", "1")


def reason_parts(reason: str | None) -> tuple[str | None, str | None]:
    """``"maint [root@2024-01-01T10:00:00]"`` -> (``"maint"``, ``"root"``)."""
    if not reason:
        return None, None
    match = re.match(r"^(.*?)\s*\[([^@\]]+)@[^\]]*\]$", reason)
    if match:
        return (match.group(1) or None), match.group(2)
    return reason, None
