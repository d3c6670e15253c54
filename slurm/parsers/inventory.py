"""Nodes (sinfo JSON, scontrol, sinfo text), partitions and the switch tree."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import replace
from datetime import datetime
from typing import Any

from slurm.errors import SlurmParseError
from slurm.hostlist import expand
from slurm.parsers.common import (
    as_int,
    as_text,
    guarded,
    is_yes,
    load_json,
    normalise_node_state,
    parse_kv_records,
    reason_parts,
    state_words,
    str_list,
)
from slurm.parsers.models import Partition, SlurmNode, Switch
from slurm.units import (
    Gres,
    json_number,
    parse_gres,
    parse_memory,
    parse_slurm_time,
    parse_timestamp,
    parse_tres,
)

# ---------------------------------------------------------------- nodes


def _node_from_json(item: dict[str, Any]) -> SlurmNode:
    name = as_text(item.get("name")) or as_text(item.get("hostname"))
    if not name:
        raise ValueError("node without a name")
    words = state_words(item.get("state")) + state_words(item.get("state_flags"))
    state, flags = normalise_node_state(words)
    reason = as_text(item.get("reason"))
    reason_set_by = as_text(item.get("reason_set_by_user"))
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
        partitions=str_list(item.get("partitions")),
        features=str_list(item.get("features")),
        active_features=str_list(item.get("active_features")),
        gres=tuple(parse_gres(as_text(item.get("gres")))),
        gres_used=tuple(parse_gres(as_text(item.get("gres_used")))),
        address=as_text(item.get("address")),
        hostname=as_text(item.get("hostname")),
        port=json_number(item.get("port")),
        slurmd_version=as_text(item.get("slurmd_version")) or as_text(item.get("version")),
        architecture=as_text(item.get("architecture")),
        operating_system=as_text(item.get("operating_system")),
        sockets=json_number(item.get("sockets")),
        cores_per_socket=json_number(item.get("cores")),
        threads_per_core=json_number(item.get("threads")),
        boot_time=parse_timestamp(item.get("boot_time")),
        last_busy=parse_timestamp(item.get("last_busy")),
        tres=parse_tres(as_text(item.get("tres"))),
        tres_used=parse_tres(as_text(item.get("tres_used"))),
    )


def parse_sinfo_json(text: str) -> list[SlurmNode]:
    """``sinfo --json`` (Slurm 22.05: a top-level ``nodes`` list) -> nodes."""
    items = load_json(text, "sinfo --json", "nodes")
    nodes: list[SlurmNode] = []
    for item in items:
        nodes.append(
            guarded("a node in sinfo --json", json.dumps(item)[:300], _node_from_json, item)
        )
    return nodes


def _node_from_kv(pairs: dict[str, str]) -> SlurmNode:
    reason_full = pairs.get("Reason")
    reason, reason_by = reason_parts(as_text(reason_full))
    state, flags = normalise_node_state(state_words(pairs.get("State")))
    return SlurmNode(
        name=pairs["NodeName"],
        state=state,
        state_flags=flags,
        reason=reason,
        reason_set_by=reason_by,
        cpus_total=as_int(pairs.get("CPUTot")),
        cpus_alloc=as_int(pairs.get("CPUAlloc")),
        memory_mb=parse_memory(pairs.get("RealMemory")),
        memory_alloc_mb=parse_memory(pairs.get("AllocMem")),
        memory_free_mb=parse_memory(pairs.get("FreeMem")),
        partitions=str_list(pairs.get("Partitions")),
        features=str_list(pairs.get("AvailableFeatures")),
        active_features=str_list(pairs.get("ActiveFeatures")),
        gres=tuple(parse_gres(pairs.get("Gres"))),
        gres_used=tuple(parse_gres(pairs.get("GresUsed"))),
        address=as_text(pairs.get("NodeAddr")),
        hostname=as_text(pairs.get("NodeHostName")),
        port=as_int(pairs.get("Port")),
        slurmd_version=as_text(pairs.get("Version")),
        architecture=as_text(pairs.get("Arch")),
        operating_system=as_text(pairs.get("OS")),
        sockets=as_int(pairs.get("Sockets")),
        cores_per_socket=as_int(pairs.get("CoresPerSocket")),
        threads_per_core=as_int(pairs.get("ThreadsPerCore")),
        boot_time=kv_time(pairs.get("BootTime")),
        last_busy=kv_time(pairs.get("LastBusyTime")),
        tres=parse_tres(pairs.get("CfgTRES")),
        tres_used=parse_tres(pairs.get("AllocTRES")),
    )


def kv_time(value: str | None) -> datetime | None:
    if value is None or value.strip() in ("", "None", "Unknown", "N/A"):
        return None
    return parse_timestamp(value)


def parse_scontrol_nodes(text: str) -> list[SlurmNode]:
    """``scontrol show node`` (multi-line) or ``scontrol show node -o`` -> nodes."""
    records = guarded("scontrol show node", text, parse_kv_records, text, "NodeName", "Reason")
    return [
        guarded(
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


def split_fields(line: str, count: int, free_index: int, what: str) -> list[str]:
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
    reason_text, reason_by = reason_parts(None if reason == "none" else as_text(reason))
    return SlurmNode(
        name=name,
        state=state,
        state_flags=flags,
        reason=reason_text,
        reason_set_by=reason_by,
        cpus_total=total or as_int(cpus),
        cpus_alloc=allocated,
        memory_mb=parse_memory(memory),
        memory_free_mb=parse_memory(free),
        partitions=(partition.rstrip("*"),) if as_text(partition) else (),
        features=str_list(features),
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
        fields = split_fields(line, 10, _SINFO_REASON_INDEX, "sinfo text line")
        node = guarded("sinfo text line", line, _node_from_sinfo_fields, fields)
        if node.name in merged:
            previous = merged[node.name]
            partitions = tuple(dict.fromkeys(previous.partitions + node.partitions))
            merged[node.name] = replace(previous, partitions=partitions)
        else:
            merged[node.name] = node
    return list(merged.values())


# ---------------------------------------------------------------- partitions


def _partition_from_kv(pairs: dict[str, str]) -> Partition:
    node_expr = as_text(pairs.get("Nodes")) or ""
    state = (pairs.get("State") or "UP").strip().lower()
    return Partition(
        name=pairs["PartitionName"],
        nodes=tuple(expand(node_expr)),
        node_list_expr=node_expr,
        default=is_yes(pairs.get("Default", "NO")),
        max_time_minutes=parse_slurm_time(pairs.get("MaxTime")),
        default_time_minutes=parse_slurm_time(pairs.get("DefaultTime")),
        state=state,
        total_cpus=as_int(pairs.get("TotalCPUs")),
        total_nodes=as_int(pairs.get("TotalNodes")),
        max_nodes=as_int(pairs.get("MaxNodes")),
        hidden=is_yes(pairs.get("Hidden", "NO")),
        tres=parse_tres(pairs.get("TRES")),
        allow_accounts=(as_text(pairs.get("AllowAccounts")) or "")[:1024],
        deny_accounts=(as_text(pairs.get("DenyAccounts")) or "")[:1024],
        allow_groups=(as_text(pairs.get("AllowGroups")) or "")[:1024],
    )


def parse_partitions(text: str) -> list[Partition]:
    """``scontrol show partition`` (multi-line or ``-o``) -> partitions."""
    records = guarded("scontrol show partition", text, parse_kv_records, text, "PartitionName")
    return [
        guarded(
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
    records = guarded("scontrol show topology", text, parse_kv_records, text, "SwitchName")
    children_of: dict[str, tuple[str, ...]] = {}
    raw: list[dict[str, str]] = []
    for record in records:
        raw.append(record)
        children_of[record["SwitchName"]] = tuple(
            guarded(
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
        node_expr = as_text(record.get("Nodes")) or ""

        def build(
            record: dict[str, str] = record, name: str = name, node_expr: str = node_expr
        ) -> Switch:
            return Switch(
                name=name,
                level=as_int(record.get("Level")) or 0,
                parent=parent_of.get(name),
                nodes=tuple(expand(node_expr)),
                node_list_expr=node_expr,
                switches=children_of[name],
                link_speed=as_int(record.get("LinkSpeed")),
            )

        switches.append(guarded("a topology switch", str(record), build))
    return switches


def iter_gpu_gres(nodes: Iterable[SlurmNode]) -> Iterator[tuple[str, Gres]]:
    for node in nodes:
        for entry in node.gpus:
            yield node.name, entry
