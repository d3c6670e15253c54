"""Writes for clusters and nodes: registration, probe, sync, drain and resume."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane.audit import audit_event_record
from controlplane.errors import ApplicationError, FieldError
from controlplane.roles import is_operator
from nodes.cluster_access import (
    cluster_key_dir,
    slurm_client_for,
    write_private_file,
)
from nodes.models import Cluster, Gpu, Link, Node, NodeEvent, Partition, Switch
from nodes.slurm import errors as slurm_errors
from nodes.slurm.parsers import ClusterInfo, Inventory, SlurmNode
from nodes.slurm.transport import close_all, fetch_host_key

logger = logging.getLogger(__name__)

KEY_FILE_NAME = "id_key"
MAX_SYNC_BACKOFF_SECONDS = 600
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def describe_cluster_error(error: BaseException) -> str:
    """A plain-words line for a page or an API error: what failed and what to check."""
    if isinstance(error, slurm_errors.HostKeyError):
        return f"Host key refused: {error}"
    if isinstance(error, slurm_errors.SshAuthenticationError):
        return f"SSH login refused: {error} (check the user and the private key)"
    if isinstance(error, slurm_errors.SlurmNotFound):
        return f"Slurm is not installed or not on PATH on the login node: {error}"
    if isinstance(error, slurm_errors.SlurmControllerUnavailable):
        return f"The Slurm controller does not answer: {error}"
    if isinstance(error, slurm_errors.SlurmParseError):
        return f"Gantry could not read Slurm's output: {error}"
    if isinstance(error, slurm_errors.SlurmCommandError):
        return f"A Slurm command failed: {error}"
    if isinstance(error, slurm_errors.SshTransientError):
        return f"Cluster unreachable: {error}"
    if isinstance(error, slurm_errors.SlurmError):
        return str(error)
    return f"{type(error).__name__}: {error}"


# ---------------------------------------------------------------- registration


@dataclass
class ClusterRegistration:
    cluster: Cluster
    created: bool
    info: ClusterInfo
    fingerprint_seen: str


def _validate_private_key(content: str) -> None:
    import io

    import paramiko

    last_error: Exception | None = None
    for key_class in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            key_class.from_private_key(io.StringIO(content))
            return
        except (paramiko.SSHException, ValueError, IndexError) as error:
            last_error = error
    raise FieldError(
        "private_key", f"not a usable unencrypted private key (OpenSSH or PEM): {last_error}"
    )


_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def _validate_ssh_host(host: str) -> None:
    """A host name (RFC 1123 labels) or an IP address; refused with the field otherwise."""
    import ipaddress

    text = (host or "").strip()
    try:
        ipaddress.ip_address(text)
        return
    except ValueError:
        pass
    labels = text.rstrip(".").split(".")
    if not text or len(text) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
        raise FieldError(
            "ssh_host",
            "not a host name or IP address (letters, digits and '-', labels of at most 63)",
        )


def cluster_register(
    *,
    actor: Any,
    name: str,
    ssh_host: str,
    ssh_port: int,
    ssh_user: str,
    private_key: str,
    workdir: str,
    python: str,
    default_partition: str = "",
    description: str = "",
    expected_fingerprint: str | None = None,
    is_default: bool = False,
    update_existing: bool = False,
    sync: bool = True,
) -> ClusterRegistration:
    """Register a cluster: fetch and pin its host key, store its key 0600, probe Slurm.

    Refuses, with the field and why, anything that would not work: a taken name, an
    unreachable host, a host key other than ``expected_fingerprint``, a bad private key,
    a refused login, Slurm missing. Nothing is saved unless the probe succeeds. Safe to
    re-run with ``update_existing`` (the dev cluster is registered on every ``make run``).
    """
    _validate_ssh_host(ssh_host)
    existing = Cluster.objects.filter(name=name).first()
    if existing is not None and not update_existing:
        raise FieldError("name", f"a cluster named {name!r} is already registered")
    same_login = (
        Cluster.objects.filter(ssh_host=ssh_host, ssh_port=ssh_port, ssh_user=ssh_user)
        .exclude(name=name)
        .first()
    )
    if same_login is not None:
        raise FieldError(
            "ssh_host", f"cluster {same_login.name!r} is already registered with this login"
        )
    cluster = existing or Cluster(name=name)
    cluster.description = description
    cluster.ssh_host = ssh_host
    cluster.ssh_port = ssh_port
    cluster.ssh_user = ssh_user
    cluster.ssh_key_name = KEY_FILE_NAME
    cluster.workdir = workdir.rstrip("/") or "/"
    cluster.python = python
    cluster.default_partition = default_partition
    try:
        cluster.full_clean(
            exclude=[
                "host_key_type",
                "host_key_fingerprint",
                "host_key_line",
                "is_default",
                "accounting_available",
            ],
            validate_unique=False,
            validate_constraints=False,
        )
    except ValidationError as error:
        field_name, messages = next(iter(error.message_dict.items()))
        raise FieldError(field_name, " ".join(messages)) from None
    _validate_private_key(private_key)

    try:
        host_key = fetch_host_key(ssh_host, ssh_port, timeout=settings.SSH_CONNECT_TIMEOUT)
    except slurm_errors.SlurmError as error:
        raise FieldError("ssh_host", f"cannot reach {ssh_host}:{ssh_port}: {error}") from None
    expected = (expected_fingerprint or "").strip()
    if expected and expected != host_key.fingerprint_sha256:
        raise FieldError(
            "host_key_fingerprint",
            f"the server presented {host_key.key_type} {host_key.fingerprint_sha256}, "
            f"not {expected}; refusing to pin it",
        )
    if (
        existing is not None
        and existing.host_key_fingerprint
        and existing.host_key_fingerprint != host_key.fingerprint_sha256
        and not expected
    ):
        raise FieldError(
            "host_key_fingerprint",
            f"the server's host key changed from {existing.host_key_fingerprint} to "
            f"{host_key.fingerprint_sha256}; confirm the new fingerprint to re-pin it",
        )
    cluster.host_key_type = host_key.key_type
    cluster.host_key_fingerprint = host_key.fingerprint_sha256
    cluster.host_key_line = host_key.known_hosts_line

    write_private_file(cluster_key_dir(name) / KEY_FILE_NAME, private_key.strip() + "\n")
    # A re-registration may change the key or the host: never reuse the old connection.
    close_all()
    try:
        info = slurm_client_for(cluster).probe()
    except slurm_errors.SlurmError as error:
        raise ApplicationError(
            f"Registration failed: {describe_cluster_error(error)}",
            extra={"fingerprint_seen": host_key.fingerprint_sha256},
        ) from None

    with transaction.atomic():
        if is_default:
            Cluster.objects.exclude(pk=cluster.pk).filter(is_default=True).update(is_default=False)
            cluster.is_default = True
        elif not Cluster.objects.filter(is_default=True).exclude(pk=cluster.pk).exists():
            # The first cluster is the default one.
            cluster.is_default = True
        _apply_probe(cluster, info)
        cluster.next_sync_at = timezone.now()
        cluster.save()
        _apply_partitions(cluster, list(info.partitions))
        audit_event_record(
            actor=actor,
            action="cluster.update" if existing else "cluster.register",
            target=cluster,
            details={
                "endpoint": f"{ssh_user}@{ssh_host}:{ssh_port}",
                "host_key": host_key.fingerprint_sha256,
                "slurm_version": info.slurm_version,
            },
        )
        if sync:
            cluster_id = cluster.pk
            transaction.on_commit(lambda: _enqueue_sync(cluster_id))
    return ClusterRegistration(
        cluster=cluster,
        created=existing is None,
        info=info,
        fingerprint_seen=host_key.fingerprint_sha256,
    )


def _enqueue_sync(cluster_id: int) -> None:
    from nodes.tasks import cluster_sync_task

    try:
        cluster_sync_task.delay(cluster_id)
    except Exception:  # Redis down: beat re-enqueues due syncs, nothing is lost.
        logger.warning("could not enqueue a sync of cluster %s; beat will", cluster_id)


def _apply_probe(cluster: Cluster, info: ClusterInfo) -> None:
    cluster.slurm_version = info.slurm_version[:32]
    cluster.slurm_cluster_name = (info.cluster_name or "")[:64]
    cluster.accounting_available = info.accounting_available
    if not cluster.default_partition:
        default = next((p.name for p in info.partitions if p.default), "")
        cluster.default_partition = default


def cluster_probe(*, actor: Any, cluster: Cluster) -> ClusterInfo:
    """Connect with the pinned key and ask Slurm its version, name, partitions, accounting."""
    try:
        info = slurm_client_for(cluster).probe()
    except slurm_errors.SlurmError as error:
        raise ApplicationError(
            f"Probe failed: {describe_cluster_error(error)}", status_code=502
        ) from None
    with transaction.atomic():
        _apply_probe(cluster, info)
        cluster.save(
            update_fields=[
                "slurm_version",
                "slurm_cluster_name",
                "accounting_available",
                "default_partition",
                "updated_at",
            ]
        )
        _apply_partitions(cluster, list(info.partitions))
        audit_event_record(actor=actor, action="cluster.probe", target=cluster)
    return info


def cluster_sync_request(*, actor: Any, cluster: Cluster) -> None:
    """ "Sync now": make the cluster due and enqueue its sync after commit."""
    with transaction.atomic():
        Cluster.objects.filter(pk=cluster.pk).update(next_sync_at=timezone.now())
        audit_event_record(actor=actor, action="cluster.sync_request", target=cluster)
        cluster_id = cluster.pk
        transaction.on_commit(lambda: _enqueue_sync(cluster_id))


# ---------------------------------------------------------------- sync


@dataclass
class SyncResult:
    ok: bool
    error: str = ""
    nodes_seen: int = 0
    state_changes: int = 0
    events: list[str] = field(default_factory=list)


def sync_backoff_seconds(failures: int, interval: int) -> int:
    """Wait longer after each consecutive failure, up to ten minutes."""
    return int(min(MAX_SYNC_BACKOFF_SECONDS, interval * (2 ** max(0, failures - 1))))


def cluster_sync(*, cluster_id: int) -> SyncResult:
    """Read the inventory (three remote commands) and apply it.

    Safe to re-run at any time: every write compares first and state changes are
    conditional updates, so two syncs racing apply each change once. On failure the
    cluster shows the error and backs off; nothing already known is deleted.
    """
    cluster = Cluster.objects.get(pk=cluster_id)
    try:
        inventory = slurm_client_for(cluster).inventory()
    except slurm_errors.SlurmError as error:
        message = describe_cluster_error(error)
        cluster_sync_failed(cluster=cluster, message=message)
        return SyncResult(ok=False, error=message)
    return _apply_inventory(cluster, inventory)


def cluster_sync_failed(*, cluster: Cluster, message: str) -> None:
    now = timezone.now()
    failures = cluster.sync_failures + 1
    Cluster.objects.filter(pk=cluster.pk).update(
        sync_status=Cluster.SyncStatus.ERROR,
        last_sync_at=now,
        last_sync_error=message[:2000],
        sync_failures=F("sync_failures") + 1,
        next_sync_at=now
        + timedelta(seconds=sync_backoff_seconds(failures, settings.SYNC_INTERVAL_SECONDS)),
    )
    logger.warning("sync of cluster %s failed: %s", cluster.name, message)


def _apply_partitions(cluster: Cluster, partitions: list[Any]) -> None:
    existing = {partition.name: partition for partition in cluster.partitions.all()}
    seen = set()
    for data in partitions:
        seen.add(data.name)
        values = {
            "nodes_expression": (data.node_list_expr or ",".join(data.nodes))[:1024],
            "is_default": bool(data.default),
            "state": (data.state or "")[:32],
            "max_time_minutes": data.max_time_minutes,
            "total_cpus": data.total_cpus or 0,
            "total_nodes": data.total_nodes or len(data.nodes),
            "gone": False,
        }
        current = existing.get(data.name)
        if current is None:
            Partition.objects.create(cluster=cluster, name=data.name, **values)
        elif any(getattr(current, key) != value for key, value in values.items()):
            for key, value in values.items():
                setattr(current, key, value)
            current.save(update_fields=[*values.keys(), "updated_at"])
    Partition.objects.filter(cluster=cluster, gone=False).exclude(name__in=seen).update(gone=True)


def _apply_switches(cluster: Cluster, inventory: Inventory) -> dict[str, Switch]:
    existing = {switch.name: switch for switch in cluster.switches.all()}
    for data in inventory.switches:
        current = existing.get(data.name)
        if current is None:
            current = Switch.objects.create(
                cluster=cluster, name=data.name, level=data.level, link_speed=data.link_speed
            )
            existing[data.name] = current
        elif (current.level, current.link_speed, current.gone) != (
            data.level,
            data.link_speed,
            False,
        ):
            current.level, current.link_speed, current.gone = data.level, data.link_speed, False
            current.save(update_fields=["level", "link_speed", "gone", "updated_at"])
    seen = {data.name for data in inventory.switches}
    for data in inventory.switches:
        switch = existing[data.name]
        parent = existing.get(data.parent) if data.parent else None
        if switch.parent_id != (parent.pk if parent else None):
            switch.parent = parent
            switch.save(update_fields=["parent", "updated_at"])
        if parent is not None:
            Link.objects.get_or_create(
                cluster=cluster,
                scope=Link.Scope.SWITCH_SWITCH,
                switch=switch,
                upper_switch=parent,
                defaults={"kind": Link.Kind.UNKNOWN},
            )
    Switch.objects.filter(cluster=cluster, gone=False).exclude(name__in=seen).update(gone=True)
    return {name: switch for name, switch in existing.items() if name in seen}


def _leaf_of(inventory: Inventory) -> dict[str, str]:
    """Node name -> the lowest-level switch that lists it."""
    leaf: dict[str, tuple[int, str]] = {}
    for switch in inventory.switches:
        for node_name in switch.nodes:
            if node_name not in leaf or switch.level < leaf[node_name][0]:
                leaf[node_name] = (switch.level, switch.name)
    return {name: switch_name for name, (_, switch_name) in leaf.items()}


def _gpu_rows(data: SlurmNode) -> list[tuple[int, str, bool]]:
    """(index, type, allocated) for each GPU Slurm reports on the node."""
    rows: list[tuple[int, str, bool]] = []
    used_indexes: set[int] = set()
    used_count_by_type: dict[str, int] = {}
    for entry in data.gres_used:
        if entry.is_gpu:
            used_indexes.update(entry.indexes)
            key = entry.type or ""
            used_count_by_type[key] = used_count_by_type.get(key, 0) + entry.count
    next_index = 0
    for entry in data.gpus:
        indexes = list(entry.indexes) or list(range(next_index, next_index + entry.count))
        for index in indexes:
            rows.append((index, entry.type or "", False))
        next_index = max(indexes, default=next_index - 1) + 1
    if used_indexes:
        rows = [(index, gpu_type, index in used_indexes) for index, gpu_type, _ in rows]
    else:
        # No indexes reported: mark the first N of each type allocated.
        remaining = dict(used_count_by_type)
        if not remaining and data.gpus_used:
            remaining = {"": data.gpus_used}
        marked: list[tuple[int, str, bool]] = []
        for index, gpu_type, _ in rows:
            key = gpu_type if gpu_type in remaining else ""
            if remaining.get(key, 0) > 0:
                remaining[key] -= 1
                marked.append((index, gpu_type, True))
            else:
                marked.append((index, gpu_type, False))
        rows = marked
    return rows


def _node_state(value: str) -> str:
    valid = {choice for choice, _ in Node.State.choices}
    return value if value in valid else Node.State.UNKNOWN


def _apply_inventory(cluster: Cluster, inventory: Inventory) -> SyncResult:
    now = timezone.now()
    result = SyncResult(ok=True, nodes_seen=len(inventory.nodes))
    with transaction.atomic():
        _apply_partitions(cluster, list(inventory.partitions))
        switches = _apply_switches(cluster, inventory)
        leaf_of = _leaf_of(inventory)
        existing = {node.name: node for node in cluster.nodes.all()}
        gpus_by_node: dict[int, dict[int, Gpu]] = {}
        for gpu in Gpu.objects.filter(node__cluster=cluster):
            gpus_by_node.setdefault(gpu.node_id, {})[gpu.index] = gpu
        events: list[NodeEvent] = []
        for data in inventory.nodes:
            leaf = switches.get(leaf_of.get(data.name, ""))
            values: dict[str, Any] = {
                "address": (data.address or "")[:255],
                "state_flags": list(data.state_flags),
                "reason": (data.reason or "")[:512],
                "cpus_total": data.cpus_total or 0,
                "cpus_alloc": min(data.cpus_alloc or 0, data.cpus_total or 0),
                "memory_mb": data.memory_mb or 0,
                "memory_alloc_mb": data.memory_alloc_mb or 0,
                "features": list(data.features),
                "partitions": list(data.partitions),
                "partitions_text": Node.partitions_as_text(list(data.partitions)),
                "leaf_switch_id": leaf.pk if leaf else None,
            }
            new_state = _node_state(data.state)
            node = existing.get(data.name)
            if node is None:
                node = Node.objects.create(
                    cluster=cluster,
                    name=data.name,
                    state=new_state,
                    state_changed_at=now,
                    last_seen_at=now,
                    **values,
                )
                existing[data.name] = node
                events.append(
                    NodeEvent(
                        node=node, kind="appeared", to_state=new_state, message=values["reason"]
                    )
                )
            else:
                changed = [key for key, value in values.items() if getattr(node, key) != value]
                if changed:
                    Node.objects.filter(pk=node.pk).update(
                        last_seen_at=now, updated_at=now, **{key: values[key] for key in changed}
                    )
                else:
                    Node.objects.filter(pk=node.pk).update(last_seen_at=now)
                if "reason" in changed and node.state == new_state:
                    events.append(
                        NodeEvent(
                            node=node,
                            kind="reason",
                            from_state=node.state,
                            to_state=new_state,
                            message=values["reason"] or "(reason cleared)",
                        )
                    )
                if node.state != new_state:
                    # Nothing got updated: another sync applied this change first.
                    if Node.objects.filter(pk=node.pk, state=node.state).update(
                        state=new_state, state_changed_at=now
                    ):
                        result.state_changes += 1
                        events.append(
                            NodeEvent(
                                node=node,
                                kind="state",
                                from_state=node.state,
                                to_state=new_state,
                                message=values["reason"],
                            )
                        )
            _apply_gpus(node, _gpu_rows(data), gpus_by_node.get(node.pk, {}))
            if leaf is not None:
                Link.objects.get_or_create(
                    cluster=cluster,
                    scope=Link.Scope.NODE_SWITCH,
                    node=node,
                    switch=leaf,
                    defaults={"kind": Link.Kind.UNKNOWN},
                )
        seen = {data.name for data in inventory.nodes}
        for name, node in existing.items():
            if name in seen or node.state == Node.State.GONE:
                continue
            if Node.objects.filter(pk=node.pk, state=node.state).update(
                state=Node.State.GONE, state_changed_at=now
            ):
                result.state_changes += 1
                events.append(
                    NodeEvent(
                        node=node,
                        kind="gone",
                        from_state=node.state,
                        to_state=Node.State.GONE,
                        message="no longer reported by Slurm",
                    )
                )
        NodeEvent.objects.bulk_create(events)
        result.events = [f"{event.node.name}: {event.kind} {event.to_state}" for event in events]
        Cluster.objects.filter(pk=cluster.pk).update(
            sync_status=Cluster.SyncStatus.OK,
            last_sync_at=now,
            last_sync_ok_at=now,
            last_sync_error="",
            sync_failures=0,
            next_sync_at=now + timedelta(seconds=settings.SYNC_INTERVAL_SECONDS),
        )
    return result


def _apply_gpus(node: Node, rows: list[tuple[int, str, bool]], existing: dict[int, Gpu]) -> None:
    seen = set()
    for index, gpu_type, allocated in rows:
        seen.add(index)
        state = Gpu.State.ALLOCATED if allocated else Gpu.State.FREE
        if node.state in {Node.State.DOWN, Node.State.FAIL, Node.State.INVAL}:
            state = Gpu.State.UNHEALTHY
        gpu = existing.get(index)
        if gpu is None:
            Gpu.objects.create(node=node, index=index, gpu_type=gpu_type, state=state)
        elif (gpu.gpu_type, gpu.state, gpu.health) != (gpu_type, state, ""):
            gpu.gpu_type, gpu.state, gpu.health = gpu_type, state, ""
            gpu.save(update_fields=["gpu_type", "state", "health", "updated_at"])
    for index, gpu in existing.items():
        if index not in seen and gpu.state != Gpu.State.UNKNOWN:
            gpu.state, gpu.health = Gpu.State.UNKNOWN, "no longer reported by Slurm"
            gpu.save(update_fields=["state", "health", "updated_at"])


# ---------------------------------------------------------------- operator actions


def _check_operator(actor: Any) -> None:
    if not is_operator(actor):
        raise PermissionDenied("Only operators may drain or resume nodes.")


def _refresh_node_from_slurm(
    node: Node, slurm_node: SlurmNode | None, kind: str, message: str
) -> None:
    if slurm_node is None:
        return
    new_state = _node_state(slurm_node.state)
    now = timezone.now()
    Node.objects.filter(pk=node.pk).update(
        reason=(slurm_node.reason or "")[:512],
        state_flags=list(slurm_node.state_flags),
        last_seen_at=now,
    )
    old_state = node.state
    if new_state != old_state:
        Node.objects.filter(pk=node.pk, state=old_state).update(
            state=new_state, state_changed_at=now
        )
    NodeEvent.objects.create(
        node=node, kind=kind, from_state=old_state, to_state=new_state, message=message[:512]
    )
    node.refresh_from_db()


def _slurm_action_error(error: slurm_errors.SlurmError) -> ApplicationError:
    status = 503 if error.transient else 502
    return ApplicationError(describe_cluster_error(error), status_code=status)


def node_drain(*, actor: Any, node: Node, reason: str) -> Node:
    """Drain a node through ``scontrol update``; running jobs finish, no new ones start.

    Accepts any node state; draining a drained node again only updates the reason.
    """
    _check_operator(actor)
    reason = (reason or "").strip()
    if not reason:
        raise FieldError("reason", "a reason is required to drain a node")
    if len(reason) > 255:
        raise FieldError("reason", "at most 255 characters")
    if _CONTROL_CHARACTERS.search(reason):
        raise FieldError("reason", "must not contain control characters such as newlines")
    client = slurm_client_for(node.cluster)
    full_reason = f"{reason} [{actor.get_username()}]"
    try:
        client.drain(node.name, full_reason)
        slurm_node = client.node(node.name)
    except slurm_errors.SlurmError as error:
        raise _slurm_action_error(error) from None
    with transaction.atomic():
        _refresh_node_from_slurm(
            node, slurm_node, "drain", f"drained by {actor.get_username()}: {reason}"
        )
        audit_event_record(
            actor=actor, action="node.drain", target=node, details={"reason": reason}
        )
    return node


def node_resume(*, actor: Any, node: Node) -> Node:
    """Return a drained or down node to service (``state=resume``)."""
    _check_operator(actor)
    client = slurm_client_for(node.cluster)
    try:
        client.resume(node.name)
        slurm_node = client.node(node.name)
    except slurm_errors.SlurmError as error:
        raise _slurm_action_error(error) from None
    with transaction.atomic():
        _refresh_node_from_slurm(node, slurm_node, "resume", f"resumed by {actor.get_username()}")
        audit_event_record(actor=actor, action="node.resume", target=node)
    return node
