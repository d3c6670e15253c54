"""Per-user cluster identities: which cluster account a Gantry user's work runs as, and
the credentials Gantry acts with (the cluster's user CA, or per-user key pairs).

Modes (``Cluster.user_auth``):

- ``certificate`` (the default): Gantry holds an Ed25519 CA per cluster (a 0600 file under
  the data directory, never shown) and signs a certificate valid for minutes
  (``GANTRY_SSH_CERT_MINUTES``) whenever it connects as a mapped account. Its one principal
  is ``gantry:<cluster>:<account>`` (``slurm.certificates``), with ``source-address``
  when the cluster has ``certificate_source_addresses``. The login node trusts the CA and
  maps principals to accounts with the lines ``sshd_config_lines`` gives (shown on the
  access page, the admin, the API and ``manage.py cluster_user_ca``):
  ``TrustedUserCAKeys <file with the public key(s): trusted_ca_keys>``,
  ``AuthorizedPrincipalsCommand /usr/local/sbin/gantry-principals --cluster <name>
  --service-account <user> %u`` (``scripts/gantry-principals``: nothing for root, system
  accounts and the service account) and ``AuthorizedPrincipalsCommandUser nobody``. The
  web processes never read the CA key: they ask a worker (``nodes.access.signer``). A rotation
  (``manage.py gantry_ca_rotate``, ``nodes.access.ca_rotation``) makes a new CA the login nodes
  trust beside the old one before Gantry signs with it.
- ``user_keys``: for sites that forbid a CA. Gantry makes one key pair per mapped account;
  the user (or the admin) installs the public key in the account's ``authorized_keys``.
  The private key stays in the data directory.
- ``service_account``: legacy, one account for everything. Only when an operator chooses
  it for a cluster (audited); never a default.

Selectors: ``cluster_account_for`` (the account new work of a user runs as, or a 400
naming the field and the fix), ``cluster_identity_for_user``, ``cluster_identity_list``.
Services (operators, audited): ``cluster_identity_set``, ``cluster_identity_delete``,
``cluster_user_ca_ensure``, ``cluster_user_auth_set``.
Where the CA key may be read (workers, manage.py): ``user_ca_key_ensure``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from core.audit import AuditAction, audit_event_record
from core.errors import FieldError
from core.roles import is_operator
from core.types import Actor, User
from nodes.access.cluster import user_ca_key_path, user_key_path
from nodes.access.signer_client import remote_user_ca_ensure
from nodes.models import Cluster, ClusterIdentity
from slurm.certificates import (
    PRINCIPAL,
    SYSTEM_ACCOUNTS,
    ca_public_line,
    generate_ca_private_key,
    generate_key_pair,
    public_line,
)

logger = logging.getLogger(__name__)

# Accounts no Gantry user's work may run as, whatever an operator types: the ones Gantry
# never certifies either.
RESERVED_ACCOUNTS = SYSTEM_ACCOUNTS
# Where the README tells a login node's admin to install scripts/gantry-principals.
PRINCIPALS_COMMAND = "/usr/local/sbin/gantry-principals"
NO_IDENTITY_FIX = (
    "ask an operator to map your Gantry user to your account on this cluster "
    "(admin: Cluster identities; API: POST /api/v1/clusters/{id}/identities/)"
)


def trusted_ca_file(cluster: Cluster) -> str:
    """Where the login node's admin puts the CA's public key (a suggestion they may change)."""
    return f"/etc/ssh/gantry-{cluster.name}-user-ca.pub"


def trusted_ca_keys(cluster: Cluster) -> list[str]:
    """The public key lines the login node's TrustedUserCAKeys file holds: the CA Gantry
    signs with and, during a rotation, the next one."""
    lines = (cluster.user_ca_public_key, cluster.user_ca_next_public_key)
    return [line.strip() for line in lines if line.strip()]


def sshd_config_lines(cluster: Cluster) -> list[str]:
    """The lines the login node's sshd_config needs: trust the CA, and accept for each
    ordinary account only Gantry's principal for it (``scripts/gantry-principals``)."""
    return [
        sshd_config_line(cluster),
        f"AuthorizedPrincipalsCommand {PRINCIPALS_COMMAND} --cluster {cluster.name} "
        f"--service-account {cluster.ssh_user} %u",
        "AuthorizedPrincipalsCommandUser nobody",
    ]


def sshd_config_line(cluster: Cluster) -> str:
    """The sshd_config line that trusts Gantry's user CA (the first of ``sshd_config_lines``)."""
    return f"TrustedUserCAKeys {trusted_ca_file(cluster)}"


# ---------------------------------------------------------------- selectors


def cluster_identity_for_user(*, cluster: Cluster, user: User) -> ClusterIdentity | None:
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return ClusterIdentity.objects.filter(cluster=cluster, user=user).first()


def cluster_identity_list(*, cluster: Cluster | None = None) -> QuerySet[ClusterIdentity]:
    identities = ClusterIdentity.objects.select_related("cluster", "user")
    return identities.filter(cluster=cluster) if cluster is not None else identities


def cluster_account_for(*, cluster: Cluster, user: User) -> str:
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


def _check_operator(actor: Actor) -> None:
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
    if account in RESERVED_ACCOUNTS or account.startswith("systemd-"):
        raise FieldError("account", f"{account} is a system account")
    if account == cluster.verifier_account:
        raise FieldError(
            "account",
            f"{account} is the cluster's drill verifier: a user mapped to it could attest "
            "their own drills",
        )
    return account


def _create_private_file(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` (0600) unless it exists; never replaces a file another
    process made meanwhile. True if this call created it."""
    # A name of this call's own: two threads of one process must not write one temp file.
    temporary = path.with_name(f".{path.name}.new-{os.getpid()}-{secrets.token_hex(6)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
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


def cluster_user_ca_ensure(*, actor: Actor, cluster: Cluster) -> str:
    """The public key of the cluster's user CA, creating the CA if there is none (operators,
    or Gantry itself at registration: ``actor`` None). The private key is a 0600 file in the
    cluster's 0700 key directory; only its public half reaches the database, pages and the
    API. Creating it is audited. Safe to repeat: an existing CA is kept. A process that
    may not read the CA key (the web) has the signer make and read it."""
    _check_operator(actor)
    if settings.CA_KEY_ACCESS == "local":
        public, created = user_ca_key_ensure(cluster)
    else:
        public, created = remote_user_ca_ensure(cluster.pk)
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


def user_ca_key_ensure(cluster: Cluster) -> tuple[str, bool]:
    """The cluster's CA key file, made if missing (0600; never replacing one another
    process made): its public key line, and whether this call made it. Only where the CA
    key may be read (workers, manage.py)."""
    path = user_ca_key_path(cluster)
    created = False
    if not path.exists():
        created = _create_private_file(path, generate_ca_private_key())
    return ca_public_line(path.read_bytes(), f"gantry-user-ca:{cluster.name}"), created


@contextlib.contextmanager
def _key_lock(path: Path) -> Iterator[None]:
    """One maker of the key at ``path`` at a time, across threads and worker processes (an
    advisory lock on a file beside it; closing the descriptor releases it)."""
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _stored_public_line(path: Path, comment: str) -> str | None:
    """The public half of the private key stored at ``path``; None when there is none. An
    unusable file is moved aside (kept for a person to look at), as if there were none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return public_line(data, comment)
    except ValueError as error:
        aside = path.with_name(f".{path.name}.unusable-{int(time.time())}")
        os.replace(path, aside)
        logger.warning("user key %s is unusable (%s); moved it to %s", path, error, aside)
        return None


def user_key_pair_ensure(path: Path, comment: str) -> str:
    """The public line of the key pair at ``path``, making the pair if there is none. Safe
    to race (threads, worker processes): see ``_user_key_pair``."""
    with _key_lock(path):
        return _user_key_pair(path, comment)


def _user_key_pair(path: Path, comment: str) -> str:
    """Under ``_key_lock(path)``: makers take turns, a new private key is linked in only
    where none exists, and the public half is always derived from the private key on disk,
    never from one a losing maker generated."""
    public = _stored_public_line(path, comment)
    if public is None:
        private, _ = generate_key_pair(comment)
        _create_private_file(path, private)
        public = _stored_public_line(path, comment)
    if public is None:
        raise RuntimeError(f"the user key {path} vanished while it was being made")
    return public


def _ensure_user_key(cluster: Cluster, identity: ClusterIdentity) -> None:
    """user_keys mode: the account's key pair (private 0600 under the data dir), one per
    (cluster, account) however many makers race, and the database's public key the pair of
    the private key Gantry holds: written under the same lock, so the last write is always
    the stored key's. An existing key is kept (its public half may already be in the
    account's authorized_keys); one the database disagrees with is corrected here."""
    path = user_key_path(cluster, identity.account)
    with _key_lock(path):
        public = _user_key_pair(path, f"gantry:{cluster.name}:{identity.account}")
        # Only while the row still maps this account (an operator may be remapping it).
        ClusterIdentity.objects.filter(pk=identity.pk, account=identity.account).update(
            public_key=public
        )
    identity.public_key = public


def cluster_identity_set(
    *, actor: Actor, cluster: Cluster, user: User, account: str
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


def cluster_identity_delete(*, actor: Actor, identity: ClusterIdentity) -> None:
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


def cluster_user_auth_set(*, actor: User, cluster: Cluster, user_auth: str) -> Cluster:
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
