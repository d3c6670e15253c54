"""Collecting a cluster's node probes: ``health_collect`` (the ``health.collect_cluster``
task's one service call).

Each node's Slurm health-check hook (``scripts/gantry-health-check``, run by slurmd as root
every HealthCheckInterval) writes ``<node>.json`` into the cluster's health directory
(``HealthSource.directory``). A collection reads every file in ONE remote command as the
service account (``health.collect``), then for each file of a node in the inventory:

- content newer than what was recorded → ``probe_record`` (the document must name the node
  its file is named after);
- older than three intervals (by the login node's clock) → the node is unknown, "probe is
  stale" (``health.services.node_health_unknown``): fail closed, never "ok" from old news;
- refused (a link, another owner, not a regular file), too large or not JSON → unknown,
  with the reason;
- a file for a node Gantry does not know, or with a name that is not a node name: counted,
  never looked up further.

A node with no file whose last recorded probe is older than three intervals is unknown
(stale) too; so is every node when the directory cannot be read for that long. The cost
(1 command, bytes of answer, seconds) and what was found are kept on the ``HealthSource``
and logged; a collection that changed nodes' health is audited (actor: Gantry). Safe to
re-run: unchanged files are neither sent again nor recorded twice.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.audit import AuditAction, audit_event_record
from health.collect import ExecTransport, ProbeFile, ProbeFiles, fetch_probe_files
from health.models import HealthSource, NodeHealth
from health.services import STALE_REASON, node_health_unknown, probe_record
from nodes.models import HealthState, Node
from slurm.errors import SlurmError

logger = logging.getLogger(__name__)

# Commands one collection runs on the cluster, whatever its size.
COMMANDS_PER_COLLECTION = 1
MAX_ERROR = 1024


@dataclass
class Collected:
    """What one collection did: the cost, what it found, the nodes whose state changed."""

    cluster: str
    ok: bool = True
    error: str = ""
    commands: int = 0
    answer_bytes: int = 0
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    changes: list[dict[str, str]] = field(default_factory=list)

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1


def _stale_reasons(limit_s: int) -> list[str]:
    return [STALE_REASON, f"no probe newer than {limit_s} s"]


class _Recorder:
    """Applies one collection's files to the nodes of one cluster."""

    def __init__(self, source: HealthSource, result: Collected, now: datetime) -> None:
        self.source = source
        self.result = result
        self.now = now
        self.limit_s = source.stale_after_seconds
        nodes = Node.objects.filter(cluster=source.cluster).exclude(state=Node.State.GONE)
        self.nodes = {node.name: node for node in nodes}
        self.fresh: set[str] = set()
        self.seen: dict[str, str] = {}

    def _changed(self, node: Node, before: str) -> None:
        after = Node.objects.values_list("health_state", flat=True).get(pk=node.pk)
        if after != before:
            self.result.changes.append({"node": node.name, "from": before, "to": after})

    def _unknown(self, node: Node, reasons: list[str], what: str) -> None:
        self.result.count(what)
        before = node.health_state
        node_health_unknown(node=node, reasons=reasons, now=self.now)
        self._changed(node, before)

    def file(self, probe: ProbeFile) -> None:
        node = self.nodes.get(probe.node)
        if node is None:
            self.result.count("unknown_node")
            return
        self.fresh.add(node.name)
        if probe.code:
            self._unknown(node, [f"probe file refused: {probe.error}"], "refused")
        elif probe.age_s is None or probe.age_s > self.limit_s:
            self._unknown(node, _stale_reasons(self.limit_s), "stale")
        elif probe.unchanged:
            self.result.count("unchanged")
            self.seen[f"{node.name}.json"] = probe.key
        elif probe.deferred:
            self.result.count("deferred")
        else:
            self._read(node, probe)

    def _read(self, node: Node, probe: ProbeFile) -> None:
        try:
            document: Any = json.loads(probe.data or b"")
        except (ValueError, RecursionError):
            self._unknown(node, ["probe file is not JSON"], "unreadable")
            return
        named = document.get("node") if isinstance(document, dict) else None
        if named != node.name:
            shown = named if isinstance(named, str) and len(named) <= 64 else "another node"
            self._unknown(node, [f"probe file names {shown!r}, not {node.name!r}"], "unreadable")
            return
        before = node.health_state
        probe_record(node=node, document=document, now=self.now)
        self._changed(node, before)
        self.result.count("recorded")
        self.seen[f"{node.name}.json"] = probe.key

    def without_fresh_file(self) -> None:
        """Nodes no fresh file spoke for: unknown once their last probe is too old."""
        oldest = self.now - timedelta(seconds=self.limit_s)
        rows = NodeHealth.objects.filter(node__in=list(self.nodes.values())).exclude(
            state=HealthState.UNKNOWN, reasons__0=STALE_REASON
        )
        for health in rows.select_related("node"):
            node = health.node
            if node.name in self.fresh:
                continue
            if health.probed_at is None or health.probed_at < oldest:
                self._unknown(node, _stale_reasons(self.limit_s), "stale")


def _fetch(source: HealthSource, transport: ExecTransport | None) -> ProbeFiles:
    if transport is None:
        from nodes.access.cluster import transport_for

        transport = transport_for(source.cluster)
    return fetch_probe_files(
        transport,
        python=source.cluster.python,
        directory=source.directory,
        known=source.seen if isinstance(source.seen, dict) else {},
    )


def health_collect(
    *, cluster_id: int, transport: ExecTransport | None = None, now: datetime | None = None
) -> Collected | None:
    """Collect one cluster's probe files (see the module's docstring). None when the
    cluster has no enabled health source."""
    source = HealthSource.objects.select_related("cluster").filter(cluster_id=cluster_id).first()
    if source is None or not source.enabled:
        return None
    now = now or timezone.now()
    result = Collected(cluster=source.cluster.name, commands=COMMANDS_PER_COLLECTION)
    started = time.monotonic()
    recorder = _Recorder(source, result, now)
    try:
        found = _fetch(source, transport)
    except SlurmError as error:
        result.ok, result.error = False, str(error)[:MAX_ERROR]
        found = None
    result.seconds = round(time.monotonic() - started, 3)
    if found is not None:
        result.answer_bytes = found.answer_bytes
        result.counts.update(ignored=found.ignored, over_limit=found.over_limit)
        for probe in found.files.values():
            recorder.file(probe)
    recorder.without_fresh_file()
    _save(source, result, recorder, now)
    return result


def _save(source: HealthSource, result: Collected, recorder: _Recorder, now: datetime) -> None:
    """The figures on the source, the next turn, the log line, and the audit event when
    nodes' health changed."""
    values: dict[str, Any] = {
        "last_error": result.error,
        "last_commands": result.commands,
        "last_bytes": result.answer_bytes,
        "last_seconds": result.seconds,
        "last_counts": dict(result.counts),
        "next_collect_at": now + timedelta(seconds=source.interval_seconds),
    }
    if result.ok:
        values.update(last_collected_at=now, seen=recorder.seen)
    with transaction.atomic():
        HealthSource.objects.filter(pk=source.pk).update(**values)
        if result.changes:
            audit_event_record(
                actor=None,
                action=AuditAction.HEALTH_COLLECT,
                target=source,
                details={
                    "changes": result.changes[:200],
                    "commands": result.commands,
                    "bytes": result.answer_bytes,
                    "seconds": result.seconds,
                    "counts": dict(result.counts),
                },
            )
    log = logger.info if result.ok else logger.warning
    log(
        "health collect %s: %d command, %d bytes, %.2f s, %s%s",
        result.cluster,
        result.commands,
        result.answer_bytes,
        result.seconds,
        ", ".join(f"{key} {value}" for key, value in sorted(result.counts.items())) or "no files",
        f"; error: {result.error}" if result.error else "",
    )
