"""Host keys: fingerprints, the policy that refuses unknown keys (naming the key it saw),
fetching a server's key to show and pin, and loading our private key."""

from __future__ import annotations

import base64
import hashlib
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, NoReturn

import paramiko
from paramiko.pkey import UnknownKeyType

from slurm.errors import (
    HostKeyUnknown,
    SshAuthenticationError,
    SshConfigurationError,
    SshTransientError,
    local_file_error,
    resolution_error,
)


class HostKeyInfo(NamedTuple):
    key_type: str
    fingerprint_sha256: str
    known_hosts_line: str


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:<base64 without padding>`` fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


class RejectUnknownHost(paramiko.RejectPolicy):
    """RejectPolicy that says which key it refused, so an operator can compare it."""

    def __init__(self, port: int) -> None:
        self.port = port

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> NoReturn:
        seen = fingerprint(key)
        host = hostname
        if host.startswith("[") and "]:" in host:
            host = host[1:].split("]:", 1)[0]
        raise HostKeyUnknown(
            f"host key of {hostname} is not pinned: the server offered {key.get_name()} {seen}; "
            "add it to the cluster's known_hosts only after checking it out of band",
            host=host,
            port=self.port,
            key_type=key.get_name(),
            fingerprint_seen=seen,
        )


def load_private_key(path: str) -> paramiko.PKey:
    """Our private key at ``path``. Missing, unreadable as configured (permissions, a
    directory) or unusable: permanent errors; an I/O error that passes: retried."""
    key_path = Path(path)
    try:
        return paramiko.PKey.from_path(key_path)
    except FileNotFoundError:
        raise SshConfigurationError(f"private key file {key_path} does not exist") from None
    except PermissionError as exc:
        raise SshConfigurationError(
            f"cannot read private key {key_path}: permission denied"
        ) from exc
    except OSError as exc:
        raise local_file_error(f"cannot read private key {key_path}", exc) from exc
    except (paramiko.PasswordRequiredException, TypeError) as exc:
        # cryptography says TypeError for an encrypted key loaded without a password.
        raise SshAuthenticationError(
            f"private key {key_path} is encrypted; Gantry needs an unencrypted key"
        ) from exc
    except (paramiko.SSHException, UnknownKeyType, ValueError) as exc:
        raise SshAuthenticationError(f"cannot load private key {key_path}: {exc}") from exc


def public_key_line(key: paramiko.PKey) -> str:
    """``<type> <base64>`` of ``key``'s public half (an authorized_keys line, no comment)."""
    return f"{key.get_name()} {key.get_base64()}"


def fetch_host_key(
    host: str,
    port: int = 22,
    timeout: float = 10,
    *,
    key_types: Sequence[str] | None = None,
) -> HostKeyInfo:
    """The server's host key, without authenticating: for "show and pin the host key".

    Returns the key type, its OpenSSH SHA256 fingerprint and a known_hosts line.
    The caller must show the fingerprint to a person to confirm before pinning.
    """
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except socket.gaierror as exc:
        raise resolution_error(host, exc) from exc
    except (ConnectionError, TimeoutError, OSError) as exc:
        raise SshTransientError(f"cannot connect to {host}:{port}: {exc}") from exc
    transport = paramiko.Transport(sock)
    try:
        if key_types:
            transport.get_security_options().key_types = tuple(key_types)
        transport.banner_timeout = timeout
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise SshTransientError(f"SSH handshake with {host}:{port} failed: {exc}") from exc
    finally:
        transport.close()
        sock.close()
    line = f"{known_hosts_name(host, port)} {key.get_name()} {key.get_base64()}"
    return HostKeyInfo(key.get_name(), fingerprint(key), line)
