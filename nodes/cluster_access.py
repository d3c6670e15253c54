"""How Gantry reaches a cluster: its keys and pinned host key on disk, pooled transports.

Two kinds of login: the service account (``transport_for``: inventory, the watcher's
squeue/sacct, tag lookups, the shared trainer archive, operator actions that need Slurm
admin rights) and a cluster account Gantry acts as for a user (``transport_as``: a
short-lived certificate signed by the cluster's user CA, or the per-user key Gantry made).

Private keys (the service account's, the user CA's, per-user keys) live under
``GANTRY_DATA_DIR/ssh/<cluster>/`` with mode 0600 in 0700 directories, never in the
database; the database keeps only file names, public keys and the pinned fingerprint.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from django.conf import settings

from nodes.models import Cluster
from nodes.slurm.certificates import CertificateSpec, check_principal
from nodes.slurm.client import SlurmClient
from nodes.slurm.connect import SshConfig
from nodes.slurm.errors import SshConfigurationError
from nodes.slurm.transport import PoolLimits, SshTransport, get_transport

_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
USER_CA_FILE = "user_ca"
USER_KEY_FILE = "id_ed25519"


def ssh_dir() -> Path:
    path = Path(settings.SSH_DIR)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def cluster_key_dir(cluster_name: str) -> Path:
    path = ssh_dir() / cluster_name
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def private_key_path(cluster: Cluster) -> Path:
    if not _SAFE_NAME.match(cluster.ssh_key_name):
        raise ValueError(f"unsafe key file name {cluster.ssh_key_name!r}")
    return cluster_key_dir(cluster.name) / cluster.ssh_key_name


def write_private_file(path: Path, content: str | bytes) -> None:
    """Write ``content`` to ``path`` with mode 0600, atomically."""
    data = content.encode() if isinstance(content, str) else content
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(temporary, 0o600)
    os.replace(temporary, path)


def known_hosts_path(cluster: Cluster) -> Path:
    """The cluster's known_hosts file, rewritten from the pinned line when it differs."""
    path = cluster_key_dir(cluster.name) / "known_hosts"
    wanted = (cluster.host_key_line.strip() + "\n") if cluster.host_key_line.strip() else ""
    current = path.read_text() if path.exists() else None
    if current != wanted:
        write_private_file(path, wanted)
    return path


def user_ca_key_path(cluster: Cluster) -> Path:
    """The cluster's user CA private key (0600; created by ``nodes.identities``)."""
    return cluster_key_dir(cluster.name) / USER_CA_FILE


def user_key_path(cluster: Cluster, account: str) -> Path:
    """The private key Gantry made for ``account`` (user_keys mode), 0600 in a 0700 dir."""
    path = cluster_key_dir(cluster.name) / "users" / check_principal(account)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    os.chmod(path, 0o700)
    return path / USER_KEY_FILE


def _config(
    cluster: Cluster, *, user: str, key_path: str, certificate: CertificateSpec | None = None
) -> SshConfig:
    return SshConfig(
        host=cluster.ssh_host,
        port=cluster.ssh_port,
        user=user,
        key_path=key_path,
        known_hosts_path=str(known_hosts_path(cluster)),
        connect_timeout=settings.SSH_CONNECT_TIMEOUT,
        command_timeout=settings.SSH_COMMAND_TIMEOUT,
        expected_fingerprint=cluster.host_key_fingerprint or None,
        certificate=certificate,
    )


def ssh_config_for(cluster: Cluster) -> SshConfig:
    """The service account's login."""
    return _config(cluster, user=cluster.ssh_user, key_path=str(private_key_path(cluster)))


def ssh_config_as(cluster: Cluster, account: str) -> SshConfig:
    """The login of cluster account ``account``, by the cluster's ``user_auth`` mode.

    Refuses (fail closed) the service account itself, and any account on a cluster in
    service-account mode: Gantry then has no way to act as anyone but the service account.
    """
    check_principal(account)
    if account == cluster.ssh_user:
        raise SshConfigurationError(
            f"{account!r} is {cluster.name}'s service account; Gantry never acts as it for a user"
        )
    if cluster.user_auth == Cluster.UserAuth.CERTIFICATE:
        spec = CertificateSpec(
            ca_key_path=str(user_ca_key_path(cluster)),
            principal=account,
            key_id=f"gantry:{cluster.name}:{account}",
            valid_seconds=settings.SSH_CERTIFICATE_MINUTES * 60,
        )
        return _config(cluster, user=account, key_path="", certificate=spec)
    if cluster.user_auth == Cluster.UserAuth.USER_KEYS:
        return _config(cluster, user=account, key_path=str(user_key_path(cluster, account)))
    raise SshConfigurationError(
        f"{cluster.name} is in service-account mode: Gantry cannot act as {account!r} there "
        "(this work was submitted as that account; switch the cluster back to certificates "
        "or per-user keys to reach it)"
    )


def _pool_limits() -> PoolLimits:
    return PoolLimits(
        idle_seconds=settings.SSH_POOL_IDLE_TIMEOUT,
        max_per_login_node=settings.SSH_POOL_MAX_PER_CLUSTER,
    )


def transport_for(cluster: Cluster) -> SshTransport:
    """The service account's reused connection to this cluster in this worker process."""
    return get_transport(ssh_config_for(cluster), limits=_pool_limits())


def transport_as(cluster: Cluster, account: str) -> SshTransport:
    """The reused connection as cluster account ``account``; ``""`` is the service account
    (work from before per-user identities, clusters in service-account mode)."""
    if not account:
        return transport_for(cluster)
    return get_transport(ssh_config_as(cluster, account), limits=_pool_limits())


# One client per transport, so the --json capability learned once is remembered.
_clients: dict[int, SlurmClient] = {}


def slurm_client_for(cluster: Cluster) -> SlurmClient:
    """Slurm as the service account."""
    return _client_of(transport_for(cluster))


def slurm_client_as(cluster: Cluster, account: str) -> SlurmClient:
    """Slurm as cluster account ``account`` (``""``: the service account)."""
    return _client_of(transport_as(cluster, account))


def _client_of(transport: SshTransport) -> SlurmClient:
    client = _clients.get(id(transport))
    if client is None or client.transport is not transport:
        client = SlurmClient(transport)
        _clients[id(transport)] = client
    return client
