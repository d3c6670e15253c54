"""Per-user cluster identities: which cluster account a Gantry user's work runs as, and
the credentials Gantry acts with (the cluster's user CA, or per-user key pairs).

Modes (``Cluster.user_auth``):

- ``certificate`` (the default): Gantry holds an Ed25519 CA per cluster (a 0600 file under
  the data directory, never shown) and signs a certificate valid for minutes
  (``GANTRY_SSH_CERT_MINUTES``) for the mapped account whenever it connects as it. The
  login node trusts the CA with one line: ``TrustedUserCAKeys <file with the public key>``.
- ``user_keys``: for sites that forbid a CA. Gantry makes one key pair per mapped account;
  the user (or the admin) installs the public key in the account's ``authorized_keys``.
  The private key stays in the data directory.
- ``service_account``: legacy, one account for everything. Only when an operator chooses
  it for a cluster (audited); never a default.

Selectors: ``cluster_account_for`` (the account new work of a user runs as, or a 400
naming the field and the fix), ``cluster_identity_for_user``, ``cluster_identity_list``.
Services (operators, audited): ``cluster_identity_set``, ``cluster_identity_delete``,
``cluster_user_ca_ensure``, ``cluster_user_auth_set``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from core.audit import AuditAction, audit_event_record
from core.errors import FieldError
from core.roles import is_operator
from nodes.cluster_access import user_ca_key_path, user_key_path
from nodes.models import Cluster, ClusterIdentity
from nodes.slurm.certificates import (
    PRINCIPAL,
    ca_public_line,
    generate_ca_private_key,
    generate_key_pair,
)

# Accounts no Gantry user's work may run as, whatever an operator types.
RESERVED_ACCOUNTS = frozenset(
    {"root", "daemon", "bin", "sys", "nobody", "slurm", "munge", "sshd", "mysql", "postgres"}
)
NO_IDENTITY_FIX = (
    "ask an operator to map your Gantry user to your account on this cluster "
    "(admin: Cluster identities; API: POST /api/v1/clusters/{id}/identities/)"
)


def trusted_ca_file(cluster: Cluster) -> str:
    """Where the login node's admin puts the CA's public key (a suggestion they may change)."""
    return f"/etc/ssh/gantry-{cluster.name}-user-ca.pub"


def sshd_config_line(cluster: Cluster) -> str:
    """The one line the login node's sshd_config needs to trust Gantry's certificates."""
    return f"TrustedUserCAKeys {trusted_ca_file(cluster)}"


# ---------------------------------------------------------------- selectors


def cluster_identity_for_user(*, cluster: Cluster, user: Any) -> ClusterIdentity | None:
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return ClusterIdentity.objects.filter(cluster=cluster, user=user).first()


def cluster_identity_list(*, cluster: Cluster | None = None) -> QuerySet[ClusterIdentity]:
    identities = ClusterIdentity.objects.select_related("cluster", "user")
    return identities.filter(cluster=cluster) if cluster is not None else identities


def cluster_account_for(*, cluster: Cluster, user: Any) -> str:
    """The cluster account new work of ``user`` runs as on ``cluster`` (``""``: the service
    account, on a cluster an operator put in service-account mode).

    Fails closed with a 400 naming the ``cluster`` field and the fix: no mapping, or a
    mapping Gantry has no credential for yet (no CA, no key pair)."""
    if cluster.user_auth == Cluster.UserAuth.SERVICE_ACCOUNT:
        return ""
    identity = cluster_identity_for_user(cluster=cluster, user=user)
    name = user.get_username() if user is not None else "nobody"
    if identity is None:
        raise FieldError(
            "cluster",
            f"{name} has no account on cluster {cluster.name}, and Gantry runs work there only "
            f"as the researcher's own account; {NO_IDENTITY_FIX.format(id=cluster.pk)}",
        )
    if cluster.user_auth == Cluster.UserAuth.CERTIFICATE and not cluster.user_ca_public_key:
        raise FieldError(
            "cluster",
            f"cluster {cluster.name} has no user CA yet, so Gantry cannot log in as "
            f'{identity.account}; an operator creates it (admin: Clusters, action "Create '
            f'the user CA"; or POST /api/v1/clusters/{cluster.pk}/user-ca/create/)',
        )
    if cluster.user_auth == Cluster.UserAuth.USER_KEYS and not identity.public_key:
        raise FieldError(
            "cluster",
            f"Gantry has no key for {identity.account} on {cluster.name} yet; an operator "
            "maps the account again to make one",
        )
    return identity.account


# ---------------------------------------------------------------- services


def _check_operator(actor: Any) -> None:
    """Operators only; ``None`` is Gantry itself (the command line, registration), which no
    request can be: every page and API view passes the signed-in user."""
    if actor is not None and not is_operator(actor):
        raise PermissionDenied("Only operators may change cluster identities.")


def check_account(cluster: Cluster, account: str) -> str:
    """A cluster account a user's work may run as: a plain Unix user name, not the service
    account, not a system account."""
    # No stripping: an account name with spaces or a newline is refused, not repaired.
    if not isinstance(account, str) or not PRINCIPAL.fullmatch(account):
        raise FieldError(
            "account",
            "a Unix user name: lower-case letters, digits, '_' and '-', starting with a "
            "letter or '_', at most 32",
        )
    if account == cluster.ssh_user:
        raise FieldError(
            "account",
            f"{account} is the cluster's service account (it has Slurm admin rights); map "
            "the user to their own account",
        )
    if account in RESERVED_ACCOUNTS:
        raise FieldError("account", f"{account} is a system account")
    return account


def _create_private_file(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` (0600) unless it exists; never replaces a file another
    process made meanwhile. True if this call created it."""
    temporary = path.with_name(f".{path.name}.new-{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temporary, path)
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def cluster_user_ca_ensure(*, actor: Any, cluster: Cluster) -> str:
    """The public key of the cluster's user CA, creating the CA if there is none (operators,
    or Gantry itself at registration: ``actor`` None). The private key is a 0600 file in the
    cluster's 0700 key directory; only its public half reaches the database, pages and the
    API. Creating it is audited. Safe to repeat: an existing CA is kept."""
    _check_operator(actor)
    path = user_ca_key_path(cluster)
    created = False
    if not path.exists():
        created = _create_private_file(path, generate_ca_private_key())
    public = ca_public_line(path.read_bytes(), f"gantry-user-ca:{cluster.name}")
    with transaction.atomic():
        current = Cluster.objects.select_for_update().get(pk=cluster.pk)
        if current.user_ca_public_key != public:
            current.user_ca_public_key = public
            current.save(update_fields=["user_ca_public_key", "updated_at"])
            audit_event_record(
                actor=actor,
                action=AuditAction.CLUSTER_USER_CA_CREATE,
                target=current,
                details={"public_key": public, "new_key": created},
            )
    cluster.user_ca_public_key = public
    return public


def _ensure_user_key(cluster: Cluster, identity: ClusterIdentity) -> None:
    """user_keys mode: the account's key pair (private 0600 under the data dir)."""
    path = user_key_path(cluster, identity.account)
    if path.exists() and identity.public_key:
        return
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    private, public = generate_key_pair(f"gantry:{cluster.name}:{identity.account}")
    _create_private_file(path, private)
    identity.public_key = public
    ClusterIdentity.objects.filter(pk=identity.pk).update(public_key=public)


def cluster_identity_set(
    *, actor: Any, cluster: Cluster, user: User, account: str
) -> ClusterIdentity:
    """Map ``user`` to cluster account ``account`` on ``cluster`` (operators; audited with
    the account before and after). One account per user per cluster, one user per account.

    Work already submitted keeps the account it was submitted as; new work uses this one.
    Makes sure Gantry has the credential the cluster's mode needs (the CA, or the
    account's key pair)."""
    _check_operator(actor)
    account = check_account(cluster, account)
    taken = (
        ClusterIdentity.objects.filter(cluster=cluster, account=account)
        .exclude(user=user)
        .select_related("user")
        .first()
    )
    if taken is not None:
        raise FieldError(
            "account", f"{account} is already mapped to {taken.user} on {cluster.name}"
        )
    try:
        with transaction.atomic():
            identity = ClusterIdentity.objects.select_for_update().filter(
                cluster=cluster, user=user
            ).first() or ClusterIdentity(cluster=cluster, user=user)
            before = identity.account if identity.pk else None
            changed = before != account
            if before is not None and changed:
                identity.public_key = ""
            identity.account = account
            if changed:
                identity.save()
                audit_event_record(
                    actor=actor,
                    action=AuditAction.CLUSTER_IDENTITY_SET,
                    target=identity,
                    details={
                        "cluster": cluster.name,
                        "user": user.get_username(),
                        "before": before,
                        "after": account,
                    },
                )
    except IntegrityError:
        raise FieldError("account", f"{account} was mapped to another user meanwhile") from None
    if cluster.user_auth == Cluster.UserAuth.CERTIFICATE:
        cluster_user_ca_ensure(actor=actor, cluster=cluster)
    elif cluster.user_auth == Cluster.UserAuth.USER_KEYS:
        _ensure_user_key(cluster, identity)
    return identity


def cluster_identity_delete(*, actor: Any, identity: ClusterIdentity) -> None:
    """Remove a mapping (operators; audited): the user can no longer submit there. Work
    already submitted keeps running as its account (Gantry still reads its files)."""
    _check_operator(actor)
    with transaction.atomic():
        audit_event_record(
            actor=actor,
            action=AuditAction.CLUSTER_IDENTITY_DELETE,
            target=identity,
            details={
                "cluster": identity.cluster.name,
                "user": identity.user.get_username(),
                "account": identity.account,
            },
        )
        identity.delete()


def cluster_user_auth_set(*, actor: Any, cluster: Cluster, user_auth: str) -> Cluster:
    """Change how Gantry acts as users on ``cluster`` (operators; audited). Choosing
    ``service_account`` is the explicit opt-in to the legacy single-account mode; choosing
    ``certificate`` or ``user_keys`` makes sure the credentials exist."""
    _check_operator(actor)
    if user_auth not in Cluster.UserAuth.values:
        raise FieldError("user_auth", f"one of {', '.join(Cluster.UserAuth.values)}")
    with transaction.atomic():
        current = Cluster.objects.select_for_update().get(pk=cluster.pk)
        before = current.user_auth
        if before != user_auth:
            current.user_auth = user_auth
            current.save(update_fields=["user_auth", "updated_at"])
            audit_event_record(
                actor=actor,
                action=AuditAction.CLUSTER_USER_AUTH,
                target=current,
                details={"before": before, "after": user_auth},
            )
    if user_auth == Cluster.UserAuth.CERTIFICATE:
        cluster_user_ca_ensure(actor=actor, cluster=current)
    elif user_auth == Cluster.UserAuth.USER_KEYS:
        for identity in ClusterIdentity.objects.filter(cluster=current):
            _ensure_user_key(current, identity)
    current.refresh_from_db()
    return current
