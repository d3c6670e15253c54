"""How Gantry reaches a cluster: its keys and pinned host key on disk, pooled transports.

Two kinds of login: the service account (``transport_for``: inventory, the watcher's
squeue/sacct, tag lookups, the shared trainer archive, operator actions that need Slurm
admin rights) and a cluster account Gantry acts as for a user (``transport_as``: a
short-lived certificate signed by the cluster's user CA, or the per-user key Gantry made).
Where this process may not read the CA key (``GANTRY_CA_KEY_ACCESS=signer``: the web
processes), a worker signs each certificate (``nodes.access.signer``).

Private keys (the service account's, the user CA's, per-user keys) live under
``GANTRY_DATA_DIR/ssh/<cluster>/`` with mode 0600 in 0700 directories, never in the
database; the database keeps only file names, public keys and the pinned fingerprint.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings

from nodes.access.signer_client import PURPOSE_WEB, remote_signer
from nodes.models import Cluster, ClusterIdentity
from slurm.certificates import CertificateSpec, check_principal, check_source_addresses
from slurm.client import SlurmClient
from slurm.connect import SshConfig
from slurm.errors import SshConfigurationError, local_file_error
from slurm.transport import PoolLimits, SshTransport, get_transport

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
    """The cluster's user CA private key (0600; created by ``nodes.access.identities``)."""
    return cluster_key_dir(cluster.name) / USER_CA_FILE


def user_key_path(cluster: Cluster, account: str) -> Path:
    """The private key Gantry made for ``account`` (user_keys mode), 0600 in a 0700 dir."""
    path = cluster_key_dir(cluster.name) / "users" / check_principal(account)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    os.chmod(path, 0o700)
    return path / USER_KEY_FILE


def _config(
    cluster: Cluster,
    *,
    user: str,
    key_path: str,
    certificate: CertificateSpec | None = None,
    public_key: str = "",
) -> SshConfig:
    return SshConfig(
        host=cluster.ssh_host,
        port=cluster.ssh_port,
        user=user,
        key_path=key_path,
        known_hosts_path=str(known_hosts_path(cluster)),
        connect_timeout=settings.SSH_CONNECT_TIMEOUT,
        command_timeout=settings.SSH_COMMAND_TIMEOUT,
        max_output_bytes=settings.SSH_MAX_OUTPUT_BYTES,
        max_stderr_bytes=settings.SSH_MAX_STDERR_BYTES,
        expected_fingerprint=cluster.host_key_fingerprint or None,
        certificate=certificate,
        public_key=public_key,
    )


@contextlib.contextmanager
def _local_files(cluster: Cluster) -> Iterator[None]:
    """Making the key directories or rewriting known_hosts failed: one of our errors, which
    a task retries when the errno passes (EIO, EMFILE, a stale NFS handle, a full disk)."""
    try:
        yield
    except OSError as error:
        raise local_file_error(
            f"cannot prepare Gantry's SSH files for cluster {cluster.name}", error
        ) from error


def ssh_config_for(cluster: Cluster) -> SshConfig:
    """The service account's login."""
    with _local_files(cluster):
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
    with _local_files(cluster):
        return _config_as(cluster, account)


def certificate_spec(cluster: Cluster, account: str, *, purpose: str = "") -> CertificateSpec:
    """How a certificate for ``account`` on ``cluster`` is made: the namespaced principal,
    the cluster's source addresses, ``GANTRY_SSH_CERT_MINUTES``; signed with the CA key
    file where this process may read it, else by the signer queue (``purpose`` names who
    asked, in the key id). ValueError for an account Gantry never certifies (root, a
    system account, the service account)."""
    local = settings.CA_KEY_ACCESS == "local"
    key_id = f"gantry:{cluster.name}:{account}"
    if purpose or not local:
        # sshd logs the key id with each login: who asked for the certificate shows.
        key_id += f":{purpose or PURPOSE_WEB}"
    return CertificateSpec(
        cluster=cluster.name,
        account=account,
        service_account=cluster.ssh_user,
        ca_key_path=str(user_ca_key_path(cluster)) if local else "",
        key_id=key_id,
        valid_seconds=settings.SSH_CERTIFICATE_MINUTES * 60,
        source_addresses=check_source_addresses(cluster.certificate_source_addresses),
        signer=None if local else remote_signer,
    )


def _config_as(cluster: Cluster, account: str) -> SshConfig:
    if cluster.user_auth == Cluster.UserAuth.CERTIFICATE:
        spec = certificate_spec(cluster, account)
        return _config(cluster, user=account, key_path="", certificate=spec)
    if cluster.user_auth == Cluster.UserAuth.USER_KEYS:
        # The public half the user installed: the key file is checked against it at login.
        public_key = (
            ClusterIdentity.objects.filter(cluster=cluster, account=account)
            .values_list("public_key", flat=True)
            .first()
        )
        key_path = str(user_key_path(cluster, account))
        return _config(cluster, user=account, key_path=key_path, public_key=public_key or "")
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
