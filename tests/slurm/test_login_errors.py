"""Which login failures pass and which need a person, through the adapter's real code paths
(``open_client``, ``SshTransport.connect``, ``signed_key``, ``load_private_key``,
``fetch_host_key``), with stand-ins only for what cannot fail on demand here: a name server
that does not answer, a disk that returns EIO, a process out of file descriptors, a login
node too slow to answer the key authentication."""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import Any

import paramiko
import pytest

from slurm import hostkeys
from slurm.certificates import CertificateSpec, generate_ca_private_key, signed_key
from slurm.connect import SshConfig, open_client
from slurm.errors import (
    TRANSIENT_ERRORS,
    LocalResourceUnavailable,
    SshAuthenticationError,
    SshConfigurationError,
    SshTransientError,
    describe_cluster_error,
    is_transient,
    local_file_error,
    resolution_error,
)
from slurm.hostkeys import load_private_key, public_key_line
from slurm.transport import SshTransport


def _write_key(path: Path) -> paramiko.PKey:
    from slurm.certificates import generate_key_pair

    private, _ = generate_key_pair("test")
    path.write_bytes(private)
    path.chmod(0o600)
    return load_private_key(str(path))


@pytest.fixture
def config(tmp_path: Path) -> SshConfig:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    key = tmp_path / "id_ed25519"
    _write_key(key)
    return SshConfig(
        host="login.example.org",
        port=22,
        user="alice",
        key_path=str(key),
        known_hosts_path=str(known_hosts),
        connect_timeout=2,
    )


def _connect_raises(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> list[str]:
    asked: list[str] = []

    def connect(self: Any, hostname: str, *args: Any, **kwargs: Any) -> None:
        asked.append(hostname)
        raise error

    monkeypatch.setattr(paramiko.SSHClient, "connect", connect)
    return asked


def _read_fails(monkeypatch: pytest.MonkeyPatch, path: Path, code: int) -> None:
    original = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if Path(self) == path:
            raise OSError(code, f"{errno.errorcode[code]} (stand-in)", str(self))
        return original(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)


# ---------------------------------------------------------------- the name server


@pytest.mark.parametrize(
    ("code", "transient"),
    [
        (socket.EAI_AGAIN, True),  # no answer in time (also glibc's SERVFAIL): passes
        (socket.EAI_MEMORY, True),
        (socket.EAI_NONAME, False),  # the name does not exist: a typo or a missing record
        (socket.EAI_FAIL, False),
        (getattr(socket, "EAI_NODATA", socket.EAI_NONAME), False),
    ],
)
def test_a_failed_lookup_passes_only_when_the_name_server_did_not_answer(
    config: SshConfig, monkeypatch: pytest.MonkeyPatch, code: int, transient: bool
) -> None:
    asked = _connect_raises(monkeypatch, socket.gaierror(code, "stand-in resolver answer"))
    with pytest.raises((SshTransientError, SshConfigurationError)) as raised:
        open_client(config)
    assert asked == ["login.example.org"]
    assert is_transient(raised.value) is transient
    assert isinstance(raised.value, TRANSIENT_ERRORS) is transient
    assert "cannot resolve host 'login.example.org'" in str(raised.value)
    assert isinstance(raised.value, SshConfigurationError) is not transient


def test_fetching_a_host_key_classifies_the_lookup_the_same_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def create_connection(address: Any, timeout: Any = None) -> Any:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(hostkeys.socket, "create_connection", create_connection)
    with pytest.raises(LocalResourceUnavailable):
        hostkeys.fetch_host_key("login.example.org", 22)


def test_resolution_error_names_the_host_and_says_it_is_retried() -> None:
    error = resolution_error("h", socket.gaierror(socket.EAI_AGAIN, "Temporary failure"))
    assert "retried" in str(error) and "Gantry could not set up" in describe_cluster_error(error)


# ---------------------------------------------------------------- the user CA, when signing


def _spec(tmp_path: Path) -> CertificateSpec:
    ca = tmp_path / "user_ca"
    ca.write_bytes(generate_ca_private_key())
    return CertificateSpec(
        cluster="t",
        account="alice",
        service_account="gantry",
        key_id="gantry:t:alice",
        ca_key_path=str(ca),
    )


@pytest.mark.parametrize("code", [errno.EIO, errno.EMFILE, errno.ENFILE, errno.ESTALE])
def test_a_ca_read_that_fails_for_a_while_is_transient(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    spec = _spec(tmp_path)
    _read_fails(monkeypatch, Path(spec.ca_key_path), code)
    with pytest.raises(LocalResourceUnavailable, match="cannot read the user CA key"):
        signed_key(spec)


def test_a_ca_that_is_missing_forbidden_or_garbage_is_permanent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(tmp_path)
    ca = Path(spec.ca_key_path)
    ca.write_bytes(b"not a key")
    with pytest.raises(SshConfigurationError, match="unusable"):
        signed_key(spec)
    ca.unlink()
    with pytest.raises(SshConfigurationError, match="does not exist"):
        signed_key(spec)
    ca.mkdir()
    with pytest.raises(SshConfigurationError) as raised:
        signed_key(spec)
    assert not raised.value.transient
    ca.rmdir()
    ca.write_bytes(generate_ca_private_key())
    # Root reads any file: EACCES from a stand-in.
    _read_fails(monkeypatch, ca, errno.EACCES)
    with pytest.raises(SshConfigurationError) as raised:
        signed_key(spec)
    assert not raised.value.transient


def test_a_transport_that_cannot_read_the_ca_now_raises_a_retried_error_before_connecting(
    config: SshConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    spec = _spec(tmp_path)
    asked = _connect_raises(monkeypatch, AssertionError("never reached"))
    _read_fails(monkeypatch, Path(spec.ca_key_path), errno.EIO)
    transport = SshTransport(dataclasses.replace(config, key_path="", certificate=spec))
    with pytest.raises(TRANSIENT_ERRORS):
        transport.connect()
    assert asked == [] and transport.connections_opened == 0


# ---------------------------------------------------------------- private key, known_hosts


def test_a_private_key_read_io_error_is_transient_a_bad_key_is_not(
    config: SshConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = Path(config.key_path)
    with monkeypatch.context() as patched:
        _read_fails(patched, key, errno.EIO)
        with pytest.raises(LocalResourceUnavailable, match="cannot read private key"):
            load_private_key(str(key))
    key.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\ngarbage\n")
    with pytest.raises(SshAuthenticationError, match="cannot load private key"):
        load_private_key(str(key))
    key.unlink()
    with pytest.raises(SshConfigurationError, match="does not exist"):
        load_private_key(str(key))


def test_a_known_hosts_read_io_error_is_transient_a_missing_file_is_not(
    config: SshConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    _connect_raises(monkeypatch, AssertionError("never reached"))
    original = open

    def failing_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if str(file) == config.known_hosts_path:
            raise OSError(errno.EIO, "Input/output error (stand-in)", str(file))
        return original(file, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr("builtins.open", failing_open)
        with pytest.raises(LocalResourceUnavailable, match="known_hosts"):
            open_client(config)
    Path(config.known_hosts_path).unlink()
    with pytest.raises(SshConfigurationError, match="does not exist"):
        open_client(config)


@pytest.mark.parametrize(
    ("code", "transient"),
    [
        (errno.EIO, True),
        (errno.EAGAIN, True),
        (errno.EMFILE, True),
        (errno.ETIMEDOUT, True),
        (errno.ENOENT, False),
        (errno.EACCES, False),
        (errno.EISDIR, False),
        (errno.ELOOP, False),
    ],
)
def test_local_file_errors_by_errno(code: int, transient: bool) -> None:
    error = local_file_error("reading x", OSError(code, "stand-in"))
    assert error.transient is transient
    assert isinstance(error, SshConfigurationError) is not transient


# ---------------------------------------------------------------- authentication


def test_an_authentication_timeout_is_transient_a_refusal_is_not(
    config: SshConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    _connect_raises(monkeypatch, paramiko.AuthenticationException("Authentication timeout."))
    with pytest.raises(SshTransientError, match="did not answer the key authentication"):
        open_client(config)
    _connect_raises(monkeypatch, paramiko.AuthenticationException("Authentication failed."))
    with pytest.raises(SshAuthenticationError, match="refused key authentication"):
        open_client(config)


def test_a_key_file_that_is_not_the_pair_of_the_given_out_key_is_refused_before_login(
    config: SshConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    asked = _connect_raises(monkeypatch, ConnectionRefusedError("stand-in: no server"))
    other = _write_key(tmp_path / "other")
    mismatched = dataclasses.replace(config, public_key=f"{public_key_line(other)} gantry:t:alice")
    with pytest.raises(SshAuthenticationError, match="not the pair") as raised:
        open_client(mismatched)
    assert asked == [] and not raised.value.transient
    # The pair: the check passes and the login goes ahead (to the stand-in's refusal).
    own = load_private_key(config.key_path)
    paired = dataclasses.replace(config, public_key=f"{public_key_line(own)} gantry:t:alice")
    with pytest.raises(SshTransientError):
        open_client(paired)
    assert asked == ["login.example.org"]


def test_sacct_start_times_are_relative_to_the_login_nodes_clock() -> None:
    """sacct reads an absolute --starttime in the login node's local zone, which Gantry
    does not know: an hour ago in UTC is sent as "now-3600seconds", whatever that zone."""
    from datetime import UTC, datetime, timedelta

    from slurm import commands

    argv = commands.sacct_json(["1"], start=datetime.now(UTC) - timedelta(hours=1))
    value = argv[argv.index("--starttime") + 1]
    assert value.startswith("now-") and value.endswith("seconds")
    assert 3599 <= int(value.removeprefix("now-").removesuffix("seconds")) <= 3605
    naive = commands.sacct_json(["1"], start=datetime.now(UTC).replace(tzinfo=None))
    assert naive[naive.index("--starttime") + 1] in {"now-0seconds", "now-1seconds"}
