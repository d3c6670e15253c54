"""How Gantry connects to a cluster's login node: the settings, a client that trusts only
the pinned host key, key authentication, and connection failures in plain words."""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from pathlib import Path

import paramiko

from slurm.certificates import CertificateSpec
from slurm.errors import (
    HostKeyMismatch,
    HostKeyUnknown,
    SshAuthenticationError,
    SshConfigurationError,
    SshError,
    SshTransientError,
    local_file_error,
    resolution_error,
)
from slurm.hostkeys import (
    RejectUnknownHost,
    fingerprint,
    load_private_key,
    public_key_line,
)

logger = logging.getLogger(__name__)

# Errors meaning "the link is gone or never came up": retry-worthy.
LINK_ERRORS = (
    paramiko.SSHException,
    EOFError,
    ConnectionError,
    socket.timeout,
    TimeoutError,
    OSError,
)


@dataclass(frozen=True)
class SshConfig:
    host: str
    port: int
    user: str
    # A private key file (the service account, or a per-user key Gantry made), or "" when
    # ``certificate`` says how to sign a short-lived certificate for each connection.
    key_path: str
    known_hosts_path: str
    connect_timeout: float = 10
    command_timeout: float = 60
    keepalive: int = 15
    # The bytes of a command's stdout and stderr kept: a command (or a login file such as
    # ~/.ssh/rc) that prints more fails with CommandOutputTooLarge; the rest is never read.
    # ``exec(max_output=...)`` sets another stdout bound for one call.
    max_output_bytes: int = 16 << 20
    max_stderr_bytes: int = 1 << 20
    # When set, the server key's SHA256 fingerprint must also equal it.
    expected_fingerprint: str | None = None
    certificate: CertificateSpec | None = None
    # user_keys mode: the public key Gantry gave out for this account (``<type> <base64>
    # [comment]``); the private key file must be its pair, checked before each login.
    public_key: str = ""

    @property
    def endpoint(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    @property
    def login_node(self) -> tuple[str, int]:
        """The login node this connects to: connection limits count per login node."""
        return (self.host, self.port)

    @property
    def credential(self) -> str:
        """How this config authenticates, in words (never the key itself)."""
        if self.certificate is not None:
            return (
                f"a certificate for principal {self.certificate.principal!r} signed by "
                "Gantry's user CA"
            )
        return f"key {self.key_path}"


def open_client(
    config: SshConfig, key: paramiko.PKey | None = None
) -> tuple[paramiko.SSHClient, str]:
    """A new authenticated connection whose host key is the pinned one, and that key's
    fingerprint. ``key``: the key to log in with (with its certificate loaded, for
    certificate logins); by default the private key file of ``config``."""
    if key is None:
        if config.certificate is not None:
            raise SshConfigurationError("a certificate login needs its signed key")
        key = load_private_key(config.key_path)
        _check_key_pair(config, key)
    client = _client_with_pinned_keys(config)
    try:
        client.connect(
            config.host,
            port=config.port,
            username=config.user,
            pkey=key,
            look_for_keys=False,
            allow_agent=False,
            timeout=config.connect_timeout,
            banner_timeout=config.connect_timeout,
            auth_timeout=config.connect_timeout,
            channel_timeout=config.connect_timeout,
        )
    except HostKeyUnknown:
        client.close()
        raise
    except Exception as exc:
        client.close()
        raise _connect_error(config, exc) from exc
    transport = client.get_transport()
    assert transport is not None
    seen = _check_expected_fingerprint(config, client, transport.get_remote_server_key())
    if config.keepalive:
        transport.set_keepalive(int(config.keepalive))
    logger.info("SSH connected to %s (host key %s)", config.endpoint, seen)
    return client, seen


def _check_key_pair(config: SshConfig, key: paramiko.PKey) -> None:
    """The private key is the pair of the public key Gantry gave out for the account (a
    key file replaced behind the database's back would only be refused by sshd, with no
    word of why)."""
    expected = " ".join(config.public_key.split()[:2])
    if expected and public_key_line(key) != expected:
        raise SshAuthenticationError(
            f"the private key {config.key_path} is not the pair of the public key Gantry gave "
            f"out for {config.user!r} ({fingerprint(key)} on disk); an operator maps the "
            "account again to store the public half of the key Gantry holds, which the user "
            "then installs"
        )


def _client_with_pinned_keys(config: SshConfig) -> paramiko.SSHClient:
    known_hosts = Path(config.known_hosts_path)
    client = paramiko.SSHClient()
    try:
        # Only our own pinned file: never the system's or the user's known_hosts.
        client.load_host_keys(str(known_hosts))
    except FileNotFoundError:
        raise SshConfigurationError(f"known_hosts file {known_hosts} does not exist") from None
    except OSError as exc:
        raise local_file_error(f"cannot read known_hosts file {known_hosts}", exc) from exc
    except paramiko.SSHException as exc:
        raise SshConfigurationError(f"cannot read known_hosts file {known_hosts}: {exc}") from exc
    client.set_missing_host_key_policy(RejectUnknownHost(config.port))
    return client


def _connect_error(config: SshConfig, exc: BaseException) -> SshError:
    """What a failed ``connect`` means, as one of our errors, in plain words."""
    where = config.endpoint
    if isinstance(exc, paramiko.BadHostKeyException):
        seen = fingerprint(exc.key)
        expected = fingerprint(exc.expected_key)
        return HostKeyMismatch(
            f"host key of {where} CHANGED: the server offered {exc.key.get_name()} {seen}, "
            f"but {expected} is pinned. Someone may be intercepting the connection, or the "
            "host was reinstalled; re-pin only after checking out of band",
            host=config.host,
            port=config.port,
            key_type=exc.key.get_name(),
            fingerprint_seen=seen,
            fingerprint_expected=expected,
        )
    if isinstance(exc, paramiko.AuthenticationException) and str(exc).startswith(
        "Authentication timeout"
    ):
        # The server did not answer within auth_timeout (an overloaded login node, a slow
        # PAM or directory lookup): nothing was refused.
        return SshTransientError(
            f"{where} did not answer the key authentication within {config.connect_timeout}s"
        )
    if isinstance(exc, paramiko.AuthenticationException):
        hint = ""
        if config.certificate is not None:
            hint = (
                f" (does the login node trust Gantry's user CA: TrustedUserCAKeys in its "
                f"sshd_config, and does the account {config.user!r} exist there?)"
            )
        return SshAuthenticationError(
            f"{where} refused key authentication for user {config.user!r} "
            f"with {config.credential}: {exc}{hint}"
        )
    if isinstance(exc, socket.gaierror):
        # EAI_AGAIN (the name server did not answer) passes; EAI_NONAME does not.
        return resolution_error(config.host, exc)
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return SshTransientError(
            f"cannot connect to {config.host}:{config.port}: connection refused "
            "(is sshd running, is the port right?)"
        )
    if isinstance(exc, TimeoutError):
        return SshTransientError(
            f"connecting to {config.host}:{config.port} timed out after {config.connect_timeout}s"
        )
    if isinstance(exc, LINK_ERRORS):
        return SshTransientError(f"SSH connection to {where} failed: {exc}")
    raise exc


def _check_expected_fingerprint(
    config: SshConfig, client: paramiko.SSHClient, server_key: paramiko.PKey
) -> str:
    """The server key must be the one the cluster record pins (when it pins one)."""
    seen = fingerprint(server_key)
    if config.expected_fingerprint and seen != config.expected_fingerprint:
        client.close()
        raise HostKeyMismatch(
            f"host key of {config.endpoint} is {server_key.get_name()} {seen}, "
            f"but the cluster record pins {config.expected_fingerprint}",
            host=config.host,
            port=config.port,
            key_type=server_key.get_name(),
            fingerprint_seen=seen,
            fingerprint_expected=config.expected_fingerprint,
        )
    return seen
