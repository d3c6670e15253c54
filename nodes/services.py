"""Operator actions on clusters and nodes: drain, resume, "sync now"; and the nudge that
makes the watcher look at a cluster soon.

Registration lives in ``nodes.registration``, the inventory sync in ``nodes.sync``.
"""

from __future__ import annotations

import re
import shutil
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from controlplane.tasknames import CLUSTER_SYNC, task_send
from core.audit import AuditAction, audit_event_record
from core.errors import ApplicationError, FieldError
from core.roles import is_operator
from core.types import User
from nodes.access.cluster import slurm_client_for, ssh_dir
from nodes.models import Cluster, Node, NodeEvent
from nodes.sync import node_state
from slurm import errors as slurm_errors
from slurm.errors import describe_cluster_error
from slurm.parsers import SlurmNode

_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def cluster_sync_request(*, actor: User, cluster: Cluster) -> None:
    """ "Sync now": make the cluster due and enqueue its sync after commit."""
    with transaction.atomic():
        Cluster.objects.filter(pk=cluster.pk).update(next_sync_at=timezone.now())
        audit_event_record(actor=actor, action=AuditAction.CLUSTER_SYNC_REQUEST, target=cluster)
        cluster_id = cluster.pk
        transaction.on_commit(lambda: task_send(CLUSTER_SYNC, cluster_id))


# What an operator may change on a registered cluster. The login (host, port, user, key)
# is pinned with its host key: changing it means registering again.
CLUSTER_EDITABLE = (
    "description",
    "is_default",
    "workdir",
    "python",
    "default_partition",
    "proven_checkpoint_max_age_minutes",
    "extra_allowed_environment",
    "verifier_account",
    "certificate_source_addresses",
)


def cluster_update(*, actor: User, cluster: Cluster, **changes: Any) -> Cluster:
    """Change what may change on a registered cluster (operators only): validated, one
    default cluster at most, audited with the values before and after."""
    _check_operator(actor)
    unknown = sorted(set(changes) - set(CLUSTER_EDITABLE))
    if unknown:
        raise FieldError(unknown[0], "cannot be changed here; register the cluster again")
    with transaction.atomic():
        current = Cluster.objects.select_for_update().get(pk=cluster.pk)
        before = {key: getattr(current, key) for key in changes}
        for key, value in changes.items():
            setattr(current, key, value)
        others = [f.name for f in Cluster._meta.fields if f.name not in changes]
        try:
            current.full_clean(exclude=others, validate_unique=False, validate_constraints=False)
        except ValidationError as error:
            field_name, reasons = next(iter(error.message_dict.items()))
            raise FieldError(field_name, " ".join(reasons)) from None
        if current.is_default:
            Cluster.objects.exclude(pk=current.pk).filter(is_default=True).update(is_default=False)
        current.save(update_fields=[*changes, "updated_at"])
        audit_event_record(
            actor=actor,
            action=AuditAction.CLUSTER_UPDATE,
            target=current,
            details={"before": before, "after": {key: getattr(current, key) for key in changes}},
        )
    return current


def cluster_delete(*, actor: User, cluster: Cluster) -> None:
    """Remove a cluster Gantry never ran anything on (operators only), with its inventory
    and its stored key; audited. A cluster with jobs is refused: their history stays."""
    _check_operator(actor)
    if cluster.jobs.exists():
        raise FieldError(
            "cluster",
            f"{cluster.name} has jobs; their history would go with it. Keep the cluster "
            "(stop using it) instead",
        )
    with transaction.atomic():
        audit_event_record(
            actor=actor,
            action=AuditAction.CLUSTER_DELETE,
            target=cluster,
            details={"endpoint": f"{cluster.ssh_user}@{cluster.ssh_host}:{cluster.ssh_port}"},
        )
        name = cluster.name
        cluster.delete()
    shutil.rmtree(ssh_dir() / name, ignore_errors=True)


def cluster_reconcile_soon(*, cluster_id: int) -> None:
    """Make the cluster's next watcher cycle due now, whatever its idle back-off was."""
    Cluster.objects.filter(pk=cluster_id).update(next_reconcile_at=timezone.now())


def _check_operator(actor: User) -> None:
    if not is_operator(actor):
        raise PermissionDenied("Only operators may do this.")


def _refresh_node_from_slurm(
    node: Node, slurm_node: SlurmNode | None, kind: str, message: str
) -> None:
    if slurm_node is None:
        return
    new_state = node_state(slurm_node.state)
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


def node_drain(*, actor: User, node: Node, reason: str) -> Node:
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
            actor=actor, action=AuditAction.NODE_DRAIN, target=node, details={"reason": reason}
        )
    return node


def node_resume(*, actor: User, node: Node) -> Node:
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
        audit_event_record(actor=actor, action=AuditAction.NODE_RESUME, target=node)
    return node
