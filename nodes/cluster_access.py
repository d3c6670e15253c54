"""How Gantry reaches a cluster: its key and pinned host key on disk, a pooled transport.

Private keys live under ``GANTRY_DATA_DIR/ssh/<cluster>/`` with mode 0600, never in the
database; the database keeps only the file name and the pinned host-key fingerprint.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from django.conf import settings

from nodes.models import Cluster
from nodes.slurm.client import SlurmClient
from nodes.slurm.connect import SshConfig
from nodes.slurm.transport import SshTransport, get_transport

_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


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


def ssh_config_for(cluster: Cluster) -> SshConfig:
    return SshConfig(
        host=cluster.ssh_host,
        port=cluster.ssh_port,
        user=cluster.ssh_user,
        key_path=str(private_key_path(cluster)),
        known_hosts_path=str(known_hosts_path(cluster)),
        connect_timeout=settings.SSH_CONNECT_TIMEOUT,
        command_timeout=settings.SSH_COMMAND_TIMEOUT,
        expected_fingerprint=cluster.host_key_fingerprint or None,
    )


def transport_for(cluster: Cluster) -> SshTransport:
    """The one reused connection to this cluster in this worker process."""
    return get_transport(ssh_config_for(cluster))


# One client per transport, so the --json capability learned once is remembered.
_clients: dict[int, SlurmClient] = {}


def slurm_client_for(cluster: Cluster) -> SlurmClient:
    transport = transport_for(cluster)
    client = _clients.get(id(transport))
    if client is None or client.transport is not transport:
        client = SlurmClient(transport)
        _clients[id(transport)] = client
    return client
