"""Recording node probes: the one entry point is ``probe_record``.

Whoever runs the probe (the cluster's health-check hook, collected by ``health.collection``)
hands its JSON document here with the node it ran on. ``probe_record`` parses and judges
it (``health.document``, ``health.evaluate``), stores the probe, the node's and each GPU's
verdict and the stack, sets the node's ``health_state`` (which placement reads), and writes
a ``HealthEvent`` (and a node timeline event) only when a state changes. Safe to call again
with the same document: the verdict is the same, so nothing but the stored probe is new.

``node_health_unknown`` is the other way a node's health changes: no fresh probe vouches
for it (``STALE_REASON``), or its probe file was refused; it and its GPUs become unknown.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from health.document import ProbeContents, document_problem, read_probe
from health.evaluate import GpuVerdict, NodeVerdict, State, evaluate_node
from health.models import GpuHealth, HealthEvent, NodeHealth, NodeProbe
from health.stack import stack_fingerprint
from nodes.models import Node, NodeEvent

# Probes kept per node (the newest); older ones are deleted as new ones arrive.
PROBES_KEPT = 12
MAX_REASON = 1024


def _taken_at(document: Any, now: datetime) -> datetime:
    """When the node says it probed, if that is a sane time not after ``now``."""
    value = document.get("taken_at") if isinstance(document, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        try:
            moment = datetime.fromtimestamp(float(value), tz=UTC)
        except (OverflowError, OSError, ValueError):
            return now
        return min(moment, now)
    return now


def _inventory(node: Node) -> tuple[int | None, int | None]:
    """GPUs and memory per GPU (MiB, when known) that Slurm's inventory says the node has."""
    gpus = list(node.gpus.all())
    memories = [gpu.memory_mb for gpu in gpus if gpu.memory_mb]
    return (len(gpus) or None), (max(memories) if memories else None)


def _judge(node: Node, contents: ProbeContents) -> NodeVerdict:
    inventory_gpus, inventory_memory = _inventory(node)
    return evaluate_node(
        report=contents.report,
        problems=contents.problems,
        xids=contents.xids,
        links=contents.links,
        topology=contents.topology,
        inventory_gpus=inventory_gpus,
        inventory_memory_mib=inventory_memory,
    )


def _summary(reasons: tuple[str, ...] | list[str], state: str) -> str:
    text = "; ".join(reasons) if reasons else f"now {state}"
    return text[:MAX_REASON]


def _record_gpus(node: Node, gpus: tuple[GpuVerdict, ...], now: datetime) -> None:
    current = {row.index: row for row in GpuHealth.objects.select_for_update().filter(node=node)}
    seen = set()
    for verdict in gpus:
        seen.add(verdict.index)
        row = current.get(verdict.index)
        before = row.state if row is not None else State.UNKNOWN
        values = {
            "uuid": (verdict.uuid or "")[:64],
            "model": (verdict.model or "")[:128],
            "state": verdict.state,
            "reasons": list(verdict.reasons),
            "action": verdict.action,
            "readings": verdict.readings,
        }
        GpuHealth.objects.update_or_create(node=node, index=verdict.index, defaults=values)
        if before != verdict.state:
            HealthEvent.objects.create(
                node=node,
                gpu_index=verdict.index,
                at=now,
                from_state=before,
                to_state=verdict.state,
                reason=_summary(verdict.reasons, verdict.state),
                action=verdict.action,
            )
    for index, row in current.items():
        if index not in seen and row.state != State.UNKNOWN:
            # The GPU is not in this probe: the node's verdict says why (missing, probe failed).
            HealthEvent.objects.create(
                node=node,
                gpu_index=index,
                at=now,
                from_state=row.state,
                to_state=State.UNKNOWN,
                reason="not in the latest probe",
                action="watch",
            )
            GpuHealth.objects.filter(pk=row.pk).update(
                state=State.UNKNOWN, reasons=["not in the latest probe"], action="watch"
            )


def _record_node(
    node: Node, verdict: NodeVerdict, contents: ProbeContents, now: datetime
) -> NodeHealth:
    before = Node.objects.select_for_update().values_list("health_state", flat=True).get(pk=node.pk)
    reasons = [*verdict.reasons, *contents.notes]
    health, _created = NodeHealth.objects.update_or_create(
        node=node,
        defaults={
            "state": verdict.state,
            "reasons": reasons,
            "action": verdict.action,
            "stack": contents.stack,
            "stack_fingerprint": stack_fingerprint(contents.stack),
            "boot_id": contents.boot_id,
            "probed_at": now,
        },
    )
    if before != verdict.state:
        Node.objects.filter(pk=node.pk).update(health_state=verdict.state)
        node.health_state = verdict.state
        summary = _summary(verdict.reasons, verdict.state)
        HealthEvent.objects.create(
            node=node,
            at=now,
            from_state=before,
            to_state=verdict.state,
            reason=summary,
            action=verdict.action,
        )
        NodeEvent.objects.create(
            node=node,
            kind="health",
            from_state=before,
            to_state=verdict.state,
            message=f"GPU health: {summary}"[:512],
        )
    return health


def probe_record(*, node: Node, document: object, now: datetime) -> NodeHealth:
    """Store a probe of ``node`` and its verdict; events only where a state changed.

    ``document``: the probe's JSON (``gantry-node-probe/1``) as parsed from its output; any
    shape is accepted and judged (a malformed one makes the node "unknown", with the
    reason). Runs in one transaction; the node row is locked so two probes of one node
    recorded at once cannot both miss a change."""
    contents = read_probe(document)
    verdict = _judge(node, contents)
    # The document as evidence when its shape and size are right; else only its schema.
    stored: dict[str, Any] = (
        dict(document)
        if isinstance(document, dict) and document_problem(document) is None
        else {"schema": str(document.get("schema"))[:64] if isinstance(document, dict) else ""}
    )
    with transaction.atomic():
        NodeProbe.objects.create(
            node=node,
            taken_at=_taken_at(document, now),
            document=stored,
            parse_error="; ".join(contents.problems)[:MAX_REASON],
        )
        keep = NodeProbe.objects.filter(node=node).values_list("pk", flat=True)[:PROBES_KEPT]
        NodeProbe.objects.filter(node=node).exclude(pk__in=list(keep)).delete()
        health = _record_node(node, verdict, contents, now)
        _record_gpus(node, verdict.gpus, now)
    return health


# The reason a node whose newest probe is too old is unknown (``health.collection``).
STALE_REASON = "probe is stale"


def _gpus_unknown(node: Node, reason: str, now: datetime) -> None:
    """Every GPU of the node that is not unknown yet becomes unknown, with an event: no
    probe vouches for it any more."""
    for row in GpuHealth.objects.select_for_update().filter(node=node).exclude(state=State.UNKNOWN):
        HealthEvent.objects.create(
            node=node,
            gpu_index=row.index,
            at=now,
            from_state=row.state,
            to_state=State.UNKNOWN,
            reason=reason[:MAX_REASON],
            action="watch",
        )
        GpuHealth.objects.filter(pk=row.pk).update(
            state=State.UNKNOWN, reasons=[reason], action="watch"
        )


def node_health_unknown(*, node: Node, reasons: list[str], now: datetime) -> bool:
    """The node's health becomes unknown with ``reasons`` (the first says why: a stale
    probe, a probe file refused or unreadable), and so does every GPU of it, with events
    where a state changed. The last probe's time and stack are kept. Fail closed: what no
    fresh probe vouches for is not "ok". Returns whether the node's state changed. Safe to
    repeat: the same reasons again change nothing."""
    reasons = [str(reason)[:MAX_REASON] for reason in reasons if reason]
    with transaction.atomic():
        before = (
            Node.objects.select_for_update().values_list("health_state", flat=True).get(pk=node.pk)
        )
        health, _created = NodeHealth.objects.get_or_create(node=node)
        if health.state != State.UNKNOWN or list(health.reasons) != reasons:
            health.state, health.reasons, health.action = State.UNKNOWN, reasons, "watch"
            health.save(update_fields=["state", "reasons", "action", "updated_at"])
        _gpus_unknown(node, reasons[0] if reasons else "unknown", now)
        if before == State.UNKNOWN:
            return False
        Node.objects.filter(pk=node.pk).update(health_state=State.UNKNOWN)
        node.health_state = State.UNKNOWN
        summary = _summary(reasons, State.UNKNOWN)
        HealthEvent.objects.create(
            node=node,
            at=now,
            from_state=before,
            to_state=State.UNKNOWN,
            reason=summary,
            action="watch",
        )
        NodeEvent.objects.create(
            node=node,
            kind="health",
            from_state=before,
            to_state=State.UNKNOWN,
            message=f"GPU health: {summary}"[:512],
        )
    return True
