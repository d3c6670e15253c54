"""Registering a cluster: validate the endpoint, fetch and pin its host key, store the
private key 0600, probe Slurm; and probing a registered cluster again.

Nothing is saved unless the probe succeeds.
"""

from __future__ import annotations

import io
import ipaddress
import re
from dataclasses import dataclass

import paramiko
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from controlplane.tasknames import CLUSTER_SYNC, task_send
from core.audit import AuditAction, audit_event_record
from core.errors import ApplicationError, FieldError
from core.types import Actor, User
from nodes.access.cluster import cluster_key_dir, slurm_client_for, write_private_file
from nodes.access.identities import cluster_user_ca_ensure
from nodes.models import Cluster
from nodes.sync import apply_partitions
from slurm import errors as slurm_errors
from slurm.errors import describe_cluster_error
from slurm.hostkeys import HostKeyInfo, fetch_host_key
from slurm.parsers import ClusterInfo
from slurm.transport import close_all

KEY_FILE_NAME = "id_key"
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


@dataclass
class ClusterRegistration:
    cluster: Cluster
    created: bool
    info: ClusterInfo
    fingerprint_seen: str


@dataclass(frozen=True)
class ClusterEndpoint:
    """What an operator types to register a cluster."""

    name: str
    ssh_host: str
    ssh_port: int
    ssh_user: str
    workdir: str
    python: str
    default_partition: str = ""
    description: str = ""
    # How Gantry acts as users there; None: certificate for a new cluster, unchanged else.
    user_auth: str | None = None


def _validate_private_key(content: str) -> None:
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


def _validate_ssh_host(host: str) -> None:
    """A host name (RFC 1123 labels) or an IP address; refused with the field otherwise."""
    text = (host or "").strip()
    try:
        ipaddress.ip_address(text)
        return
    except ValueError:
        pass
    labels = text.rstrip(".").split(".")
    if not text or len(text) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise FieldError(
            "ssh_host",
            "not a host name or IP address (letters, digits and '-', labels of at most 63)",
        )


def _cluster_for(endpoint: ClusterEndpoint, *, update_existing: bool) -> tuple[Cluster, bool]:
    """The cluster row to fill (new, or the existing one when updating), validated."""
    _validate_ssh_host(endpoint.ssh_host)
    existing = Cluster.objects.filter(name=endpoint.name).first()
    if existing is not None and not update_existing:
        raise FieldError("name", f"a cluster named {endpoint.name!r} is already registered")
    same_login = (
        Cluster.objects.filter(
            ssh_host=endpoint.ssh_host, ssh_port=endpoint.ssh_port, ssh_user=endpoint.ssh_user
        )
        .exclude(name=endpoint.name)
        .first()
    )
    if same_login is not None:
        raise FieldError(
            "ssh_host", f"cluster {same_login.name!r} is already registered with this login"
        )
    cluster = existing or Cluster(name=endpoint.name)
    cluster.description = endpoint.description
    cluster.ssh_host = endpoint.ssh_host
    cluster.ssh_port = endpoint.ssh_port
    cluster.ssh_user = endpoint.ssh_user
    cluster.ssh_key_name = KEY_FILE_NAME
    cluster.workdir = endpoint.workdir.rstrip("/") or "/"
    cluster.python = endpoint.python
    cluster.default_partition = endpoint.default_partition
    if endpoint.user_auth is not None:
        if endpoint.user_auth not in Cluster.UserAuth.values:
            raise FieldError("user_auth", f"one of {', '.join(Cluster.UserAuth.values)}")
        cluster.user_auth = endpoint.user_auth
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
    return cluster, existing is not None


def _pin_host_key(
    cluster: Cluster,
    *,
    expected_fingerprint: str | None,
    previously: str,
    trust_on_first_use: bool,
) -> tuple[HostKeyInfo, str]:
    """Fetch the login node's host key and pin it on ``cluster``, refusing a key other
    than the one the operator confirmed, a changed key nobody confirmed, and a first key
    nobody confirmed unless the operator chose to trust it on first use. Returns the key
    and how it came to be trusted (for the audit log)."""
    try:
        host_key = fetch_host_key(
            cluster.ssh_host, cluster.ssh_port, timeout=settings.SSH_CONNECT_TIMEOUT
        )
    except slurm_errors.SlurmError as error:
        raise FieldError(
            "ssh_host", f"cannot reach {cluster.ssh_host}:{cluster.ssh_port}: {error}"
        ) from None
    expected = (expected_fingerprint or "").strip()
    if expected and expected != host_key.fingerprint_sha256:
        raise FieldError(
            "host_key_fingerprint",
            f"the server presented {host_key.key_type} {host_key.fingerprint_sha256}, "
            f"not {expected}; refusing to pin it",
        )
    if previously and previously != host_key.fingerprint_sha256 and not expected:
        raise FieldError(
            "host_key_fingerprint",
            f"the server's host key changed from {previously} to "
            f"{host_key.fingerprint_sha256}; confirm the new fingerprint to re-pin it",
        )
    if expected:
        trust = "confirmed fingerprint"
    elif previously:
        trust = "unchanged pinned key"
    elif trust_on_first_use:
        trust = "trust on first use"
    else:
        raise FieldError(
            "host_key_fingerprint",
            f"the server presents {host_key.key_type} {host_key.fingerprint_sha256}; give that "
            "fingerprint once you have checked it on a trusted path (e.g. ssh-keygen -lf "
            "/etc/ssh/ssh_host_ed25519_key.pub on the login node), or choose trust on first use",
        )
    cluster.host_key_type = host_key.key_type
    cluster.host_key_fingerprint = host_key.fingerprint_sha256
    cluster.host_key_line = host_key.known_hosts_line
    return host_key, trust


def apply_probe(cluster: Cluster, info: ClusterInfo) -> None:
    cluster.slurm_version = info.slurm_version[:32]
    cluster.slurm_cluster_name = (info.cluster_name or "")[:64]
    cluster.accounting_available = info.accounting_available
    if not cluster.default_partition:
        default = next((p.name for p in info.partitions if p.default), "")
        cluster.default_partition = default


def _save_registration(
    cluster: Cluster,
    info: ClusterInfo,
    *,
    actor: Actor,
    updated: bool,
    is_default: bool,
    trust: str,
) -> None:
    if is_default:
        Cluster.objects.exclude(pk=cluster.pk).filter(is_default=True).update(is_default=False)
        cluster.is_default = True
    elif not Cluster.objects.filter(is_default=True).exclude(pk=cluster.pk).exists():
        # The first cluster is the default one.
        cluster.is_default = True
    apply_probe(cluster, info)
    cluster.next_sync_at = timezone.now()
    cluster.save()
    apply_partitions(cluster, list(info.partitions))
    audit_event_record(
        actor=actor,
        action=AuditAction.CLUSTER_UPDATE if updated else AuditAction.CLUSTER_REGISTER,
        target=cluster,
        details={
            "endpoint": f"{cluster.ssh_user}@{cluster.ssh_host}:{cluster.ssh_port}",
            "host_key": cluster.host_key_fingerprint,
            "host_key_trust": trust,
            "slurm_version": info.slurm_version,
            "user_auth": cluster.user_auth,
        },
    )


def _ensure_user_ca(cluster: Cluster, *, actor: Actor) -> None:
    """A cluster that uses certificates gets its user CA at registration (kept if any)."""
    if cluster.user_auth == Cluster.UserAuth.CERTIFICATE:
        cluster_user_ca_ensure(actor=actor, cluster=cluster)


def cluster_register(
    *,
    actor: Actor,
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
    trust_on_first_use: bool = False,
    user_auth: str | None = None,
) -> ClusterRegistration:
    """Register a cluster: fetch and pin its host key, store its key 0600, probe Slurm.

    Refuses, with the field and why, anything that would not work: a taken name, an
    unreachable host, a host key other than ``expected_fingerprint`` — or, without one, a
    key the operator did not choose to trust on first use (the refusal names the key seen)
    — a bad private key, a refused login, Slurm missing. Nothing is saved unless the probe
    succeeds; the audit event records how the key came to be trusted. Safe to re-run with
    ``update_existing`` (the dev cluster is registered on every ``make run``).

    ``user_auth``: how Gantry acts as users there (``nodes.access.identities``); a new cluster
    gets ``certificate`` and its user CA, an existing one keeps its mode unless given.
    ``service_account`` is the explicit opt-in to the legacy single-account mode.
    """
    endpoint = ClusterEndpoint(
        name=name,
        ssh_host=ssh_host,
        ssh_port=ssh_port,
        ssh_user=ssh_user,
        workdir=workdir,
        python=python,
        default_partition=default_partition,
        description=description,
        user_auth=user_auth,
    )
    cluster, updated = _cluster_for(endpoint, update_existing=update_existing)
    previously = cluster.host_key_fingerprint if updated else ""
    _validate_private_key(private_key)
    host_key, trust = _pin_host_key(
        cluster,
        expected_fingerprint=expected_fingerprint,
        previously=previously,
        trust_on_first_use=trust_on_first_use,
    )
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
        _save_registration(
            cluster, info, actor=actor, updated=updated, is_default=is_default, trust=trust
        )
        if sync:
            cluster_id = cluster.pk
            transaction.on_commit(lambda: task_send(CLUSTER_SYNC, cluster_id))
    _ensure_user_ca(cluster, actor=actor)
    return ClusterRegistration(
        cluster=cluster,
        created=not updated,
        info=info,
        fingerprint_seen=host_key.fingerprint_sha256,
    )


def cluster_probe(*, actor: User, cluster: Cluster) -> ClusterInfo:
    """Connect with the pinned key and ask Slurm its version, name, partitions, accounting."""
    try:
        info = slurm_client_for(cluster).probe()
    except slurm_errors.SlurmError as error:
        raise ApplicationError(
            f"Probe failed: {describe_cluster_error(error)}", status_code=502
        ) from None
    with transaction.atomic():
        apply_probe(cluster, info)
        cluster.save(
            update_fields=[
                "slurm_version",
                "slurm_cluster_name",
                "accounting_available",
                "default_partition",
                "updated_at",
            ]
        )
        apply_partitions(cluster, list(info.partitions))
        audit_event_record(actor=actor, action=AuditAction.CLUSTER_PROBE, target=cluster)
    return info
