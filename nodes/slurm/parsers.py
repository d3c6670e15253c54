"""Slurm output (JSON and text) -> typed dataclasses.

JSON is the primary source (Slurm 21.08+: ``--json``; field names of the
openapi v0.0.38 data format of Slurm 22.05, with the cheap parts of later
shapes accepted too: states as lists, numbers as ``{"set", "number"}``).
Text forms are the fallback. Unknown fields are ignored, missing optional
fields become None; a document of the wrong shape raises ``SlurmParseError``
with a snippet of what we got.

Conventions: node states are normalised lower-case words (``idle``,
``mixed``, ``allocated``, ``drained``, ``draining``, ``down``, ...) with
Slurm's flags kept upper-case in ``state_flags``; job states stay Slurm's
upper-case base names (``COMPLETED``, ``FAILED``, ``CANCELLED``, ...); times are
aware UTC datetimes; memory is MB; time limits are minutes (None = unlimited).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar

from nodes.slurm.errors import SlurmParseError
from nodes.slurm.hostlist import expand
from nodes.slurm.units import (
    Gres,
    json_number,
    parse_count,
    parse_gres,
    parse_memory,
    parse_slurm_time,
    parse_timestamp,
    parse_tres,
    tres_gpu_count,
)

# ---------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str
    state_flags: tuple[str, ...] = ()
    reason: str | None = None
    reason_set_by: str | None = None
    reason_changed_at: datetime | None = None
    cpus_total: int | None = None
    cpus_alloc: int | None = None
    memory_mb: int | None = None
    memory_alloc_mb: int | None = None
    memory_free_mb: int | None = None
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    active_features: tuple[str, ...] = ()
    gres: tuple[Gres, ...] = ()
    gres_used: tuple[Gres, ...] = ()
    address: str | None = None
    hostname: str | None = None
    port: int | None = None
    slurmd_version: str | None = None
    architecture: str | None = None
    operating_system: str | None = None
    sockets: int | None = None
    cores_per_socket: int | None = None
    threads_per_core: int | None = None
    boot_time: datetime | None = None
    last_busy: datetime | None = None
    tres: dict[str, str] = field(default_factory=dict)
    tres_used: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> tuple[Gres, ...]:
        return tuple(entry for entry in self.gres if entry.is_gpu)

    @property
    def gpu_count(self) -> int:
        return sum(entry.count for entry in self.gpus)

    @property
    def gpus_used(self) -> int:
        used = sum(entry.count for entry in self.gres_used if entry.is_gpu)
        if used or not self.tres_used:
            return used
        return tres_gpu_count(self.tres_used)

    @property
    def is_drained(self) -> bool:
        return "DRAIN" in self.state_flags


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...] = ()
    node_list_expr: str = ""
    default: bool = False
    max_time_minutes: int | None = None
    default_time_minutes: int | None = None
    state: str = "up"
    total_cpus: int | None = None
    total_nodes: int | None = None
    max_nodes: int | None = None
    hidden: bool = False
    tres: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Switch:
    name: str
    level: int
    parent: str | None = None
    nodes: tuple[str, ...] = ()
    node_list_expr: str = ""
    switches: tuple[str, ...] = ()
    link_speed: int | None = None


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    name: str | None = None
    comment: str | None = None
    state: str = "UNKNOWN"
    reason: str | None = None
    nodes: tuple[str, ...] = ()
    node_list_expr: str = ""
    partition: str | None = None
    user: str | None = None
    account: str | None = None
    submit_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    time_limit_minutes: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    alloc_tres: dict[str, str] = field(default_factory=dict)
    gpus: int | None = None
    gpus_per_node: int | None = None
    working_directory: str | None = None
    stdout_path: str | None = None
    source: str = ""

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_JOB_STATES

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_JOB_STATES


FINAL_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
ACTIVE_JOB_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
    }
)
_JOB_STATE_ALIASES = {
    "CA": "CANCELLED",
    "CD": "COMPLETED",
    "CF": "CONFIGURING",
    "CG": "COMPLETING",
    "F": "FAILED",
    "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY",
    "PD": "PENDING",
    "PR": "PREEMPTED",
    "R": "RUNNING",
    "S": "SUSPENDED",
    "TO": "TIMEOUT",
    "BF": "BOOT_FAIL",
    "DL": "DEADLINE",
    "RQ": "REQUEUED",
}


@dataclass(frozen=True)
class ClusterInfo:
    slurm_version: str
    cluster_name: str | None
    accounting_available: bool
    accounting_error: str | None = None
    partitions: tuple[Partition, ...] = ()
    topology_plugin: str | None = None
    json_supported: bool | None = None

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", self.slurm_version)[:3])


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[SlurmNode, ...]
    partitions: tuple[Partition, ...]
    switches: tuple[Switch, ...]

    @property
    def gpu_count(self) -> int:
        return sum(node.gpu_count for node in self.nodes)


# ---------------------------------------------------------------- helpers

T = TypeVar("T")


def _snippet(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit]


def _guard(what: str, source: str, func: Callable[..., T], *args: Any) -> T:
    """Run ``func(*args)``; turn a ValueError/KeyError/TypeError into SlurmParseError."""
    try:
        return func(*args)
    except SlurmParseError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise SlurmParseError(what, _snippet(source), str(exc)) from exc


def load_json(text: str, what: str, list_key: str) -> list[dict[str, Any]]:
    """Parse a Slurm ``--json`` document and return its ``list_key`` list."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(what, _snippet(text), f"not JSON: {exc.msg}") from exc
    if not isinstance(document, dict):
        raise SlurmParseError(what, _snippet(text), "expected a JSON object")
    errors = document.get("errors")
    items = document.get(list_key)
    if not isinstance(items, list):
        detail = f"no {list_key!r} list in the document"
        if errors:
            detail += f"; Slurm reported: {errors!r}"[:300]
        raise SlurmParseError(what, _snippet(text), detail)
    if not all(isinstance(item, dict) for item in items):
        raise SlurmParseError(what, _snippet(text), f"{list_key!r} holds non-objects")
    return items


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):
        # Slurm >= 23.02 sometimes wraps strings; take the obvious member.
        for key in ("name", "value", "job"):
            if isinstance(value.get(key), str):
                return _text(value[key])
        return None
    text = str(value).strip()
    return None if text in ("", "(null)", "N/A", "None") else text


def _str_list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(str(item).strip() for item in value if str(item).strip())
    text = str(value).strip()
    if text in ("", "(null)", "N/A"):
        return ()
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _state_words(value: Any) -> list[str]:
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
                states.append(_JOB_STATE_ALIASES.get(part, part))
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


def _int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, int | dict):
        return json_number(value)
    text = str(value).strip()
    if text.upper() in ("", "N/A", "(NULL)", "UNLIMITED", "NONE", "INFINITE"):
        return None
    return int(text)


def _yes(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().upper() in ("YES", "TRUE", "1")


def _reason_parts(reason: str | None) -> tuple[str | None, str | None]:
    """``"maint [root@2024-01-01T10:00:00]"`` -> (``"maint"``, ``"root"``)."""
    if not reason:
        return None, None
    match = re.match(r"^(.*?)\s*\[([^@\]]+)@[^\]]*\]$", reason)
    if match:
        return (match.group(1) or None), match.group(2)
    return reason, None


# ---------------------------------------------------------------- nodes


def _node_from_json(item: dict[str, Any]) -> SlurmNode:
    name = _text(item.get("name")) or _text(item.get("hostname"))
    if not name:
        raise ValueError("node without a name")
    state_words = _state_words(item.get("state")) + _state_words(item.get("state_flags"))
    state, flags = normalise_node_state(state_words)
    reason = _text(item.get("reason"))
    reason_set_by = _text(item.get("reason_set_by_user"))
    return SlurmNode(
        name=name,
        state=state,
        state_flags=flags,
        reason=reason,
        reason_set_by=reason_set_by,
        reason_changed_at=parse_timestamp(item.get("reason_changed_at")),
        cpus_total=json_number(item.get("cpus")),
        cpus_alloc=json_number(item.get("alloc_cpus")),
        memory_mb=json_number(item.get("real_memory")),
        memory_alloc_mb=json_number(item.get("alloc_memory")),
        memory_free_mb=json_number(item.get("free_memory")),
        partitions=_str_list(item.get("partitions")),
        features=_str_list(item.get("features")),
        active_features=_str_list(item.get("active_features")),
        gres=tuple(parse_gres(_text(item.get("gres")))),
        gres_used=tuple(parse_gres(_text(item.get("gres_used")))),
        address=_text(item.get("address")),
        hostname=_text(item.get("hostname")),
        port=json_number(item.get("port")),
        slurmd_version=_text(item.get("slurmd_version")) or _text(item.get("version")),
        architecture=_text(item.get("architecture")),
        operating_system=_text(item.get("operating_system")),
        sockets=json_number(item.get("sockets")),
        cores_per_socket=json_number(item.get("cores")),
        threads_per_core=json_number(item.get("threads")),
        boot_time=parse_timestamp(item.get("boot_time")),
        last_busy=parse_timestamp(item.get("last_busy")),
        tres=parse_tres(_text(item.get("tres"))),
        tres_used=parse_tres(_text(item.get("tres_used"))),
    )


def parse_sinfo_json(text: str) -> list[SlurmNode]:
    """``sinfo --json`` (Slurm 22.05: a top-level ``nodes`` list) -> nodes."""
    items = load_json(text, "sinfo --json", "nodes")
    nodes: list[SlurmNode] = []
    for item in items:
        nodes.append(
            _guard("a node in sinfo --json", json.dumps(item)[:300], _node_from_json, item)
        )
    return nodes


def _node_from_kv(pairs: dict[str, str]) -> SlurmNode:
    reason_full = pairs.get("Reason")
    reason, reason_by = _reason_parts(_text(reason_full))
    state, flags = normalise_node_state(_state_words(pairs.get("State")))
    return SlurmNode(
        name=pairs["NodeName"],
        state=state,
        state_flags=flags,
        reason=reason,
        reason_set_by=reason_by,
        cpus_total=_int(pairs.get("CPUTot")),
        cpus_alloc=_int(pairs.get("CPUAlloc")),
        memory_mb=parse_memory(pairs.get("RealMemory")),
        memory_alloc_mb=parse_memory(pairs.get("AllocMem")),
        memory_free_mb=parse_memory(pairs.get("FreeMem")),
        partitions=_str_list(pairs.get("Partitions")),
        features=_str_list(pairs.get("AvailableFeatures")),
        active_features=_str_list(pairs.get("ActiveFeatures")),
        gres=tuple(parse_gres(pairs.get("Gres"))),
        gres_used=tuple(parse_gres(pairs.get("GresUsed"))),
        address=_text(pairs.get("NodeAddr")),
        hostname=_text(pairs.get("NodeHostName")),
        port=_int(pairs.get("Port")),
        slurmd_version=_text(pairs.get("Version")),
        architecture=_text(pairs.get("Arch")),
        operating_system=_text(pairs.get("OS")),
        sockets=_int(pairs.get("Sockets")),
        cores_per_socket=_int(pairs.get("CoresPerSocket")),
        threads_per_core=_int(pairs.get("ThreadsPerCore")),
        boot_time=_kv_time(pairs.get("BootTime")),
        last_busy=_kv_time(pairs.get("LastBusyTime")),
        tres=parse_tres(pairs.get("CfgTRES")),
        tres_used=parse_tres(pairs.get("AllocTRES")),
    )


def _kv_time(value: str | None) -> datetime | None:
    if value is None or value.strip() in ("", "None", "Unknown", "N/A"):
        return None
    return parse_timestamp(value)


def parse_scontrol_nodes(text: str) -> list[SlurmNode]:
    """``scontrol show node`` (multi-line) or ``scontrol show node -o`` -> nodes."""
    records = _guard("scontrol show node", text, parse_kv_records, text, "NodeName", "Reason")
    return [
        _guard(
            "a node in scontrol show node",
            " ".join(f"{k}={v}" for k, v in record.items()),
            _node_from_kv,
            record,
        )
        for record in records
    ]


TEXT_SEPARATOR = "|"
# ``sinfo -N -h -o`` fields of commands.sinfo_text(): node, partition (``*`` =
# default), state, CPUs, memory MB, gres, features, reason, CPUs A/I/O/T, free MB.
SINFO_TEXT_FORMAT = "%N|%P|%T|%c|%m|%G|%f|%E|%C|%e"
_SINFO_REASON_INDEX = 7


def _split_fields(line: str, count: int, free_index: int, what: str) -> list[str]:
    """Split on ``|``; extra separators belong to the one free-text field."""
    fields = line.split(TEXT_SEPARATOR)
    if len(fields) < count:
        raise SlurmParseError(
            what, line, f"expected {count} '|'-separated fields, got {len(fields)}"
        )
    extra = len(fields) - count
    if extra:
        merged = TEXT_SEPARATOR.join(fields[free_index : free_index + extra + 1])
        fields = [*fields[:free_index], merged, *fields[free_index + extra + 1 :]]
    return fields


def _node_from_sinfo_fields(fields: list[str]) -> SlurmNode:
    name, partition, state_text, cpus, memory, gres, features, reason, cpu_states, free = (
        item.strip() for item in fields
    )
    state, flags = normalise_node_state([state_text])
    allocated, _idle, _other, total = (int(part) for part in cpu_states.split("/"))
    # sinfo prints "none" for no reason.
    reason_text, reason_by = _reason_parts(None if reason == "none" else _text(reason))
    return SlurmNode(
        name=name,
        state=state,
        state_flags=flags,
        reason=reason_text,
        reason_set_by=reason_by,
        cpus_total=total or _int(cpus),
        cpus_alloc=allocated,
        memory_mb=parse_memory(memory),
        memory_free_mb=parse_memory(free),
        partitions=(partition.rstrip("*"),) if _text(partition) else (),
        features=_str_list(features),
        gres=tuple(parse_gres(gres)),
    )


def parse_sinfo_text(text: str) -> list[SlurmNode]:
    """Output of ``commands.sinfo_text()`` (one line per node and partition) -> nodes.

    Nodes in several partitions appear once per partition; they are merged.
    Allocated memory and GRES usage are not in this form (None / empty).
    """
    merged: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = _split_fields(line, 10, _SINFO_REASON_INDEX, "sinfo text line")
        node = _guard("sinfo text line", line, _node_from_sinfo_fields, fields)
        if node.name in merged:
            previous = merged[node.name]
            partitions = tuple(dict.fromkeys(previous.partitions + node.partitions))
            merged[node.name] = replace(previous, partitions=partitions)
        else:
            merged[node.name] = node
    return list(merged.values())


# ---------------------------------------------------------------- partitions


def _partition_from_kv(pairs: dict[str, str]) -> Partition:
    node_expr = _text(pairs.get("Nodes")) or ""
    state = (pairs.get("State") or "UP").strip().lower()
    return Partition(
        name=pairs["PartitionName"],
        nodes=tuple(expand(node_expr)),
        node_list_expr=node_expr,
        default=_yes(pairs.get("Default", "NO")),
        max_time_minutes=parse_slurm_time(pairs.get("MaxTime")),
        default_time_minutes=parse_slurm_time(pairs.get("DefaultTime")),
        state=state,
        total_cpus=_int(pairs.get("TotalCPUs")),
        total_nodes=_int(pairs.get("TotalNodes")),
        max_nodes=_int(pairs.get("MaxNodes")),
        hidden=_yes(pairs.get("Hidden", "NO")),
        tres=parse_tres(pairs.get("TRES")),
    )


def parse_partitions(text: str) -> list[Partition]:
    """``scontrol show partition`` (multi-line or ``-o``) -> partitions."""
    records = _guard("scontrol show partition", text, parse_kv_records, text, "PartitionName")
    return [
        _guard(
            "a partition",
            " ".join(f"{k}={v}" for k, v in record.items()),
            _partition_from_kv,
            record,
        )
        for record in records
    ]


# ---------------------------------------------------------------- topology


def parse_topology(text: str) -> list[Switch]:
    """``scontrol show topology`` -> switches, each with its parent filled in.

    A cluster without the tree plugin prints no SwitchName lines: [] is returned.
    """
    records = _guard("scontrol show topology", text, parse_kv_records, text, "SwitchName")
    children_of: dict[str, tuple[str, ...]] = {}
    raw: list[dict[str, str]] = []
    for record in records:
        raw.append(record)
        children_of[record["SwitchName"]] = tuple(
            _guard(
                "topology switch list",
                record.get("Switches", ""),
                expand,
                record.get("Switches"),
            )
        )
    parent_of: dict[str, str] = {}
    for parent, children in children_of.items():
        for child in children:
            parent_of.setdefault(child, parent)
    switches: list[Switch] = []
    for record in raw:
        name = record["SwitchName"]
        node_expr = _text(record.get("Nodes")) or ""

        def build(
            record: dict[str, str] = record, name: str = name, node_expr: str = node_expr
        ) -> Switch:
            return Switch(
                name=name,
                level=_int(record.get("Level")) or 0,
                parent=parent_of.get(name),
                nodes=tuple(expand(node_expr)),
                node_list_expr=node_expr,
                switches=children_of[name],
                link_speed=_int(record.get("LinkSpeed")),
            )

        switches.append(_guard("a topology switch", str(record), build))
    return switches


# ---------------------------------------------------------------- jobs


def _exit_from_wait_status(value: Any) -> tuple[int | None, int | None]:
    """squeue's raw wait status -> (exit code, signal)."""
    number = json_number(value)
    if number is None:
        return None, None
    return (number >> 8) & 0xFF, (number & 0x7F) or None


def _exit_from_json_object(value: Any) -> tuple[int | None, int | None]:
    """sacct's ``{"status": ..., "return_code": n, "signal": {"signal_id": s}}``."""
    if not isinstance(value, dict):
        return _exit_from_wait_status(value)
    return_code = json_number(value.get("return_code"))
    signal_info = value.get("signal")
    signal = json_number(signal_info.get("signal_id")) if isinstance(signal_info, dict) else None
    status = value.get("status")
    statuses = status if isinstance(status, list) else [status]
    if not signal and any(str(item).upper() == "SIGNALED" for item in statuses) and return_code:
        # Older shapes put the signal number in return_code for SIGNALED.
        signal, return_code = return_code, None
    return return_code, signal or None


def _gpus_per_node(tres_per_node: str | None) -> int | None:
    entries = [entry for entry in parse_gres(tres_per_node) if entry.is_gpu]
    return sum(entry.count for entry in entries) if entries else None


def _job_from_squeue_json(item: dict[str, Any]) -> SlurmJob:
    job_id = json_number(item.get("job_id"))
    if job_id is None:
        raise ValueError("job without job_id")
    array_task = json_number(item.get("array_task_id"))
    array_job = json_number(item.get("array_job_id"))
    shown_id = f"{array_job}_{array_task}" if array_job and array_task is not None else str(job_id)
    state, _flags = normalise_job_state(item.get("job_state"))
    node_expr = _text(item.get("nodes")) or ""
    tres = parse_tres(_text(item.get("tres_alloc_str")))
    exit_code, signal = (None, None)
    if state in FINAL_JOB_STATES:
        exit_code, signal = _exit_from_json_object(item.get("exit_code"))
    return SlurmJob(
        job_id=shown_id,
        name=_text(item.get("name")),
        comment=_text(item.get("comment")),
        state=state,
        reason=_text(item.get("state_reason")),
        nodes=tuple(expand(node_expr)),
        node_list_expr=node_expr,
        partition=_text(item.get("partition")),
        user=_text(item.get("user_name")),
        account=_text(item.get("account")),
        submit_time=parse_timestamp(item.get("submit_time")),
        # For pending jobs Slurm gives an estimate, for running ones the limit: drop them.
        start_time=parse_timestamp(item.get("start_time")) if state != "PENDING" else None,
        end_time=parse_timestamp(item.get("end_time")) if state in FINAL_JOB_STATES else None,
        time_limit_minutes=json_number(item.get("time_limit")),
        exit_code=exit_code,
        signal=signal,
        alloc_tres=tres,
        gpus=tres_gpu_count(tres) if tres else None,
        gpus_per_node=_gpus_per_node(_text(item.get("tres_per_node"))),
        working_directory=_text(item.get("current_working_directory")),
        stdout_path=_text(item.get("standard_output")),
        source="squeue",
    )


def parse_squeue_json(text: str) -> list[SlurmJob]:
    """``squeue --json`` -> jobs (Slurm 22.05 ignores filters with --json: filter after)."""
    items = load_json(text, "squeue --json", "jobs")
    return [
        _guard(
            "a job in squeue --json",
            json.dumps(item)[:300],
            _job_from_squeue_json,
            item,
        )
        for item in items
    ]


def _tres_list_to_dict(value: Any) -> dict[str, str]:
    """sacct JSON ``[{"type": "gres", "name": "gpu", "count": 2}, ...]`` -> TRES dict."""
    if isinstance(value, str):
        return parse_tres(value)
    result: dict[str, str] = {}
    if not isinstance(value, list):
        return result
    for entry in value:
        if not isinstance(entry, dict) or not entry.get("type"):
            continue
        key = str(entry["type"])
        if entry.get("name"):
            key = f"{key}/{entry['name']}"
        count = json_number(entry.get("count"))
        if count is None:
            continue
        result[key] = f"{count}M" if key == "mem" else str(count)
    return result


def _job_from_sacct_json(item: dict[str, Any]) -> SlurmJob:
    job_id = json_number(item.get("job_id"))
    if job_id is None:
        raise ValueError("job without job_id")
    array = _dict(item.get("array"))
    array_task = json_number(array.get("task_id"))
    array_job = json_number(array.get("job_id"))
    shown_id = f"{array_job}_{array_task}" if array_job and array_task is not None else str(job_id)
    state_info = item.get("state")
    if isinstance(state_info, dict):
        state, _flags = normalise_job_state(state_info.get("current"))
        reason = _text(state_info.get("reason"))
    else:
        state, _flags = normalise_job_state(state_info)
        reason = None
    times = _dict(item.get("time"))
    limit = times.get("limit")
    comment = item.get("comment")
    node_expr = _text(item.get("nodes")) or ""
    if node_expr == "None assigned":
        node_expr = ""
    tres_block = _dict(item.get("tres"))
    tres = _tres_list_to_dict(tres_block.get("allocated"))
    exit_code, signal = _exit_from_json_object(item.get("exit_code"))
    if state not in FINAL_JOB_STATES:
        exit_code, signal = None, None
    return SlurmJob(
        job_id=shown_id,
        name=_text(item.get("name")),
        comment=_text(comment.get("job")) if isinstance(comment, dict) else _text(comment),
        state=state,
        reason=reason,
        nodes=tuple(expand(node_expr)),
        node_list_expr=node_expr,
        partition=_text(item.get("partition")),
        user=_text(item.get("user")),
        account=_text(item.get("account")),
        submit_time=parse_timestamp(times.get("submission")),
        start_time=parse_timestamp(times.get("start")),
        end_time=parse_timestamp(times.get("end")),
        time_limit_minutes=json_number(limit),
        exit_code=exit_code,
        signal=signal,
        alloc_tres=tres,
        gpus=tres_gpu_count(tres) if tres else None,
        working_directory=_text(item.get("working_directory")),
        source="sacct",
    )


def parse_sacct_json(text: str) -> list[SlurmJob]:
    """``sacct --json`` -> one SlurmJob per job (steps are ignored)."""
    items = load_json(text, "sacct --json", "jobs")
    return [
        _guard(
            "a job in sacct --json",
            json.dumps(item)[:300],
            _job_from_sacct_json,
            item,
        )
        for item in items
    ]


# ``squeue -h -o`` fields of commands.squeue_text(): id, name, user, partition, state,
# reason, elapsed, limit, node count, node list, tres-per-node, start, submit.
SQUEUE_TEXT_FORMAT = "%i|%j|%u|%P|%T|%r|%M|%l|%D|%N|%b|%S|%V"
# ``sacct -P -n -o`` fields of commands.sacct_text().
SACCT_TEXT_FIELDS = (
    "JobID",
    "JobName",
    "User",
    "Account",
    "Partition",
    "State",
    "ExitCode",
    "Elapsed",
    "Submit",
    "Start",
    "End",
    "NodeList",
    "AllocTRES",
    "ReqTRES",
    "Timelimit",
)


def _job_from_squeue_fields(fields: list[str]) -> SlurmJob:
    (job_id, name, user, partition, state_text, reason, _elapsed, limit, _count, nodes,
     tres_per_node, start, submit) = (item.strip() for item in fields)  # fmt: skip
    state, _flags = normalise_job_state(state_text)
    node_expr = _text(nodes) or ""
    return SlurmJob(
        job_id=job_id,
        name=_text(name),
        state=state,
        reason=_text(reason),
        nodes=tuple(expand(node_expr)),
        node_list_expr=node_expr,
        partition=_text(partition),
        user=_text(user),
        submit_time=_kv_time(submit),
        start_time=_kv_time(start) if state != "PENDING" else None,
        time_limit_minutes=parse_slurm_time(limit),
        gpus_per_node=_gpus_per_node(_text(tres_per_node)),
        source="squeue",
    )


def parse_squeue_text(text: str) -> list[SlurmJob]:
    """Output of ``commands.squeue_text()`` -> jobs (a pending job's start is an estimate: None)."""
    jobs: list[SlurmJob] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = _split_fields(line, 13, 1, "squeue text line")
        jobs.append(_guard("squeue text line", line, _job_from_squeue_fields, fields))
    return jobs


def _exit_text(text: str) -> tuple[int | None, int | None]:
    """sacct/scontrol ``ExitCode=3:0`` -> (3, None); ``0:15`` -> (0, 15)."""
    code, sep, sig = text.strip().partition(":")
    if not sep or not code.isdigit() or not sig.isdigit():
        return None, None
    return int(code), (int(sig) or None)


def _job_from_sacct_fields(fields: list[str]) -> SlurmJob:
    (job_id, name, user, account, partition, state_text, exit_text, _elapsed, submit, start,
     end, nodes, alloc_tres, _req_tres, limit) = (item.strip() for item in fields)  # fmt: skip
    state, _flags = normalise_job_state(state_text)
    exit_code, signal = _exit_text(exit_text) if state in FINAL_JOB_STATES else (None, None)
    node_expr = _text(nodes) or ""
    if node_expr == "None assigned":
        node_expr = ""
    tres = parse_tres(alloc_tres)
    return SlurmJob(
        job_id=job_id,
        name=_text(name),
        state=state,
        nodes=tuple(expand(node_expr)),
        node_list_expr=node_expr,
        partition=_text(partition),
        user=_text(user),
        account=_text(account),
        submit_time=_kv_time(submit),
        start_time=_kv_time(start),
        end_time=_kv_time(end),
        time_limit_minutes=parse_slurm_time(limit),
        exit_code=exit_code,
        signal=signal,
        alloc_tres=tres,
        gpus=tres_gpu_count(tres) if tres else None,
        source="sacct",
    )


def parse_sacct_text(text: str) -> list[SlurmJob]:
    """Output of ``commands.sacct_text()`` (``-P -n``) -> jobs; step lines are skipped."""
    jobs: list[SlurmJob] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = _split_fields(line, len(SACCT_TEXT_FIELDS), 1, "sacct text line")
        if "." in fields[0]:
            continue
        if fields[0] == "JobID":
            continue
        jobs.append(_guard("sacct text line", line, _job_from_sacct_fields, fields))
    return jobs


def _job_from_kv(pairs: dict[str, str]) -> SlurmJob:
    state, _flags = normalise_job_state(pairs.get("JobState"))
    node_expr = _text(pairs.get("NodeList")) or ""
    tres = parse_tres(pairs.get("AllocTRES") or pairs.get("TRES"))
    exit_code, signal = (None, None)
    if state in FINAL_JOB_STATES:
        exit_code, signal = _exit_text(pairs.get("ExitCode", ""))
    if not node_expr:
        # Before allocation TRES= is the request, not an allocation.
        tres = {}
    user = _text(pairs.get("UserId"))
    return SlurmJob(
        job_id=pairs["JobId"],
        name=_text(pairs.get("JobName")),
        comment=_text(pairs.get("Comment")),
        state=state,
        reason=_text(pairs.get("Reason")),
        nodes=tuple(expand(node_expr)),
        node_list_expr=node_expr,
        partition=_text(pairs.get("Partition")),
        user=user.split("(", 1)[0] if user else None,
        account=_text(pairs.get("Account")),
        submit_time=_kv_time(pairs.get("SubmitTime")),
        start_time=_kv_time(pairs.get("StartTime")) if node_expr else None,
        end_time=_kv_time(pairs.get("EndTime")) if state in FINAL_JOB_STATES else None,
        time_limit_minutes=parse_slurm_time(pairs.get("TimeLimit")),
        exit_code=exit_code,
        signal=signal,
        alloc_tres=tres,
        gpus=tres_gpu_count(tres) if tres else None,
        gpus_per_node=_gpus_per_node(_text(pairs.get("TresPerNode"))),
        working_directory=_text(pairs.get("WorkDir")),
        stdout_path=_text(pairs.get("StdOut")),
        source="scontrol",
    )


def parse_scontrol_jobs(text: str) -> list[SlurmJob]:
    """``scontrol show job [-o] [id]`` -> jobs. Times are local cluster time taken as UTC
    unless the command ran with ``SLURM_TIME_FORMAT=%s`` (commands.scontrol_show_job does)."""
    records = _guard("scontrol show job", text, parse_kv_records, text, "JobId")
    return [
        _guard(
            "a job in scontrol show job",
            str(record)[:300],
            _job_from_kv,
            record,
        )
        for record in records
    ]


# ---------------------------------------------------------------- misc


_SBATCH_ID = re.compile(r"^(\d+)(?:;(\S+))?$")


def parse_sbatch_parsable(text: str) -> str:
    """``sbatch --parsable`` -> job id: ``"123"`` or ``"123;cluster"`` -> ``"123"``.

    sbatch may print warnings before the id; the id is the last non-empty line.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    match = _SBATCH_ID.match(lines[-1]) if lines else None
    if not match:
        raise SlurmParseError("sbatch --parsable output", text, "expected '<job id>[;<cluster>]'")
    return match.group(1)


def parse_version(text: str) -> str:
    """``sinfo -V`` -> ``"22.05.8"``."""
    match = re.search(r"(\d+\.\d+(?:\.\d+)?(?:-\S+)?)", text)
    if not match:
        raise SlurmParseError("sinfo -V output", text, "no version number")
    return match.group(1)


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` -> ``{"ClusterName": "dev", ...}`` (``Key = value`` lines)."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            result[key.strip()] = value.strip()
    if not result:
        raise SlurmParseError("scontrol show config", text, "no 'Key = value' lines")
    return result


def iter_gpu_gres(nodes: Iterable[SlurmNode]) -> Iterator[tuple[str, Gres]]:
    for node in nodes:
        for entry in node.gpus:
            yield node.name, entry


__all__ = [
    "ACTIVE_JOB_STATES",
    "FINAL_JOB_STATES",
    "ClusterInfo",
    "Gres",
    "Inventory",
    "Partition",
    "SlurmJob",
    "SlurmNode",
    "Switch",
    "normalise_job_state",
    "normalise_node_state",
    "parse_config",
    "parse_count",
    "parse_kv_records",
    "parse_partitions",
    "parse_sacct_json",
    "parse_sacct_text",
    "parse_sbatch_parsable",
    "parse_scontrol_jobs",
    "parse_scontrol_nodes",
    "parse_sinfo_json",
    "parse_sinfo_text",
    "parse_squeue_json",
    "parse_squeue_text",
    "parse_topology",
    "parse_version",
]
