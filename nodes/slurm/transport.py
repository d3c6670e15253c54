"""SSH transport to a cluster's login host: pinned host key, key auth, one pooled
connection per cluster per process, exec with stdin, SFTP.

Failures become ``nodes.slurm.errors`` classes: a dead link is retried once
transparently (only where no command can have run twice), then surfaces as
``SshTransientError``; host key, authentication and configuration problems are
permanent errors with a plain-words message.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import secrets
import select
import shlex
import socket
import stat as stat_module
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import paramiko

from nodes.slurm.connect import LINK_ERRORS, SshConfig, open_client
from nodes.slurm.errors import (
    RemoteFileNotFound,
    SftpError,
    SshCommandTimeout,
    SshError,
    SshOutcomeUnknown,
    SshTransientError,
    command_error,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class ExecResult:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class StatResult:
    path: str
    size: int
    mtime: float
    mode: int

    @property
    def is_dir(self) -> bool:
        return stat_module.S_ISDIR(self.mode)


class SshTransport:
    """One SSH connection (and one SFTP session on it), reused, thread-safe.

    Counters: ``connections_opened``, ``commands_run``, ``sftp_operations``,
    ``bytes_read`` (stdout+stderr+SFTP reads), for the per-cycle performance goals;
    ``command_seconds`` (wall time of commands, from opening the channel to the exit
    status) and ``command_errors`` (commands that failed at the SSH level: no link, a
    timeout, an unknown outcome; not a non-zero exit), which callers export as metrics.
    """

    def __init__(self, config: SshConfig) -> None:
        self.config = config
        self._lock = threading.RLock()
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self.connections_opened = 0
        self.commands_run = 0
        self.command_seconds = 0.0
        self.command_errors = 0
        self.sftp_operations = 0
        self.bytes_read = 0
        self.server_fingerprint: str | None = None

    # ------------------------------------------------------------ connection

    def __enter__(self) -> SshTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        client = self._client
        if client is None:
            return False
        transport = client.get_transport()
        return transport is not None and transport.is_active()

    def connect(self) -> None:
        """Open the connection now (normally done lazily by the first call)."""
        with self._lock:
            self._ensure_client()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        sftp, client = self._sftp, self._client
        self._sftp = None
        self._client = None
        for closable in (sftp, client):
            if closable is not None:
                try:
                    closable.close()
                except Exception:
                    logger.debug("error closing SSH object", exc_info=True)

    def _ensure_client(self) -> paramiko.SSHClient:
        if self._client is not None and self.connected:
            return self._client
        self._drop()
        self._client = self._open()
        return self._client

    def _open(self) -> paramiko.SSHClient:
        client, seen = open_client(self.config)
        self.server_fingerprint = seen
        self.connections_opened += 1
        return client

    def _with_link(
        self, what: str, operation: Callable[[paramiko.SSHClient], T], *, retry: bool
    ) -> T:
        """Run ``operation`` on a live connection; reconnect once if the link was dead."""
        with self._lock:
            attempts = 2 if retry else 1
            for attempt in range(attempts):
                client = self._ensure_client()
                try:
                    return operation(client)
                except SshError:
                    raise
                except LINK_ERRORS as exc:
                    self._drop()
                    if attempt + 1 < attempts:
                        logger.info(
                            "SSH link to %s lost during %s (%s); reconnecting",
                            self.config.endpoint,
                            what,
                            exc,
                        )
                        continue
                    raise SshTransientError(
                        f"SSH link to {self.config.endpoint} failed during {what}: "
                        f"{exc or type(exc).__name__}"
                    ) from exc
            raise AssertionError("unreachable")

    # ------------------------------------------------------------ exec

    def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> ExecResult:
        """Run ``argv`` on the login host; every element reaches the program literally.

        ``check=True`` raises ``SlurmCommandError`` (or a subclass) on a non-zero exit.
        """
        argv = [str(part) for part in argv]
        if not argv:
            raise ValueError("empty argv")
        if any("\x00" in part for part in argv):
            # A NUL cannot travel in an SSH exec request; refuse rather than cut it short.
            raise ValueError("an argument contains a NUL byte")
        return self._run(shlex.join(argv), argv, stdin=stdin, timeout=timeout, check=check)

    def exec_shell(
        self,
        script: str,
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> ExecResult:
        """Run a fixed shell script. Only for trusted text; quote values with shlex.quote."""
        return self._run(script, ["sh", "-c", script], stdin=stdin, timeout=timeout, check=check)

    def _run(
        self,
        command: str,
        argv: list[str],
        *,
        stdin: bytes | None,
        timeout: float | None,
        check: bool,
    ) -> ExecResult:
        started = time.monotonic()
        try:
            result = self._run_once(command, argv, stdin=stdin, timeout=timeout)
        except Exception:
            with self._lock:
                self.command_errors += 1
            raise
        finally:
            with self._lock:
                self.command_seconds += time.monotonic() - started
        if check and result.rc != 0:
            raise command_error(argv, result.rc, result.stdout, result.stderr)
        return result

    def _run_once(
        self, command: str, argv: list[str], *, stdin: bytes | None, timeout: float | None
    ) -> ExecResult:
        limit = self.config.command_timeout if timeout is None else timeout

        def open_channel(client: paramiko.SSHClient) -> paramiko.Channel:
            transport = client.get_transport()
            if transport is None or not transport.is_active():
                raise EOFError("SSH transport is not active")
            return transport.open_session(timeout=self.config.connect_timeout)

        # Opening a channel runs nothing, so a dead link there is safe to retry.
        channel = self._with_link("opening a channel", open_channel, retry=True)
        with self._lock:
            self.commands_run += 1
        try:
            rc, stdout, stderr = self._drive(channel, command, argv, stdin, limit)
        except SshError:
            raise
        except LINK_ERRORS as exc:
            # The command may have run: never re-run it here (sbatch!), let the caller decide.
            with self._lock:
                self._drop()
            raise SshOutcomeUnknown(
                f"SSH link to {self.config.endpoint} failed while running {argv[0]}: "
                f"{exc or type(exc).__name__}"
            ) from exc
        finally:
            channel.close()
        with self._lock:
            self.bytes_read += len(stdout) + len(stderr)
        return ExecResult(
            argv=argv,
            rc=rc,
            stdout=stdout.decode("utf-8", errors="replace"),
            stderr=stderr.decode("utf-8", errors="replace"),
        )

    def _drive(
        self,
        channel: paramiko.Channel,
        command: str,
        argv: list[str],
        stdin: bytes | None,
        limit: float,
    ) -> tuple[int, bytes, bytes]:
        deadline = time.monotonic() + limit
        channel.settimeout(limit)
        channel.exec_command(command)
        pending = memoryview(stdin or b"")
        if not pending:
            channel.shutdown_write()
        stdout: list[bytes] = []
        stderr: list[bytes] = []
        while True:
            progressed = False
            while channel.recv_ready():
                chunk = channel.recv(65536)
                if not chunk:
                    break
                stdout.append(chunk)
                progressed = True
            while channel.recv_stderr_ready():
                chunk = channel.recv_stderr(65536)
                if not chunk:
                    break
                stderr.append(chunk)
                progressed = True
            if pending and channel.send_ready():
                sent = channel.send(bytes(pending[:32768]))
                pending = pending[sent:]
                if not pending:
                    channel.shutdown_write()
                progressed = True
            if (
                channel.exit_status_ready()
                and channel.eof_received
                and not channel.recv_ready()
                and not channel.recv_stderr_ready()
            ):
                break
            if channel.closed and not channel.recv_ready() and not channel.recv_stderr_ready():
                if not channel.exit_status_ready():
                    raise EOFError("channel closed before the command reported its exit status")
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SshCommandTimeout(
                    f"{argv[0]} did not finish within {limit:g}s on {self.config.endpoint}",
                    argv=argv,
                    timeout=limit,
                )
            if not progressed:
                # The channel's fileno becomes readable on stdout, stderr or EOF.
                select.select([channel], [], [], min(remaining, 0.5 if pending else 5.0))
        status = channel.recv_exit_status()
        if status == -1:
            # paramiko's "no exit status": the connection died under the command.
            raise EOFError("the connection closed before the command reported its exit status")
        return status, b"".join(stdout), b"".join(stderr)

    # ------------------------------------------------------------ SFTP

    def _sftp_call(self, what: str, path: str, operation: Callable[[paramiko.SFTPClient], T]) -> T:
        def run(client: paramiko.SSHClient) -> T:
            if self._sftp is None:
                self._sftp = client.open_sftp()
                channel = self._sftp.get_channel()
                if channel is not None:
                    channel.settimeout(self.config.command_timeout)
            self.sftp_operations += 1
            try:
                return operation(self._sftp)
            except FileNotFoundError as exc:
                raise RemoteFileNotFound(
                    f"{what}: {path} does not exist on {self.config.host}", path=path
                ) from exc
            except PermissionError as exc:
                raise SftpError(f"{what}: permission denied on {path}") from exc
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    raise RemoteFileNotFound(f"{what}: {path} does not exist", path=path) from exc
                if (
                    isinstance(exc, socket.timeout | TimeoutError | ConnectionError)
                    or exc.errno is None
                ):
                    # paramiko reports a dead SFTP channel as a bare OSError/EOFError.
                    self._sftp = None
                    raise
                raise SftpError(f"{what} {path} failed: {exc}") from exc
            except (EOFError, paramiko.SSHException):
                self._sftp = None
                raise

        # SFTP operations are idempotent (writes go to a temp name, then rename).
        return self._with_link(f"SFTP {what}", run, retry=True)

    def get_bytes(self, path: str) -> bytes:
        def read(sftp: paramiko.SFTPClient) -> bytes:
            with sftp.open(path, "rb") as handle:
                handle.prefetch()
                return handle.read()

        data = self._sftp_call("read", path, read)
        self.bytes_read += len(data)
        return data

    def read_from(self, path: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        """Up to ``max_bytes`` from ``offset`` (b"" at or past the end): for log tailing."""
        if offset < 0 or max_bytes <= 0:
            raise ValueError("offset must be >= 0 and max_bytes > 0")

        def read(sftp: paramiko.SFTPClient) -> bytes:
            with sftp.open(path, "rb") as handle:
                handle.seek(offset)
                chunks: list[bytes] = []
                remaining = max_bytes
                while remaining > 0:
                    chunk = handle.read(min(remaining, 32768))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    remaining -= len(chunk)
                return b"".join(chunks)

        data = self._sftp_call("read", path, read)
        self.bytes_read += len(data)
        return data

    def put_bytes(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` atomically: a temp file in the same directory, then rename."""
        directory, name = posixpath.split(path)
        temporary = posixpath.join(directory, f".{name}.tmp-{secrets.token_hex(6)}")

        def write(sftp: paramiko.SFTPClient) -> None:
            try:
                with sftp.open(temporary, "wb") as handle:
                    handle.set_pipelined(True)
                    handle.write(data)
                sftp.chmod(temporary, mode)
                sftp.posix_rename(temporary, path)
            except BaseException:
                # Best effort: do not leave temp files behind.
                with contextlib.suppress(Exception):
                    sftp.remove(temporary)
                raise

        self._sftp_call("write", path, write)

    def stat(self, path: str) -> StatResult | None:
        """Size, mtime and mode of ``path``; None if it does not exist."""

        def run(sftp: paramiko.SFTPClient) -> StatResult | None:
            try:
                attributes = sftp.stat(path)
            except FileNotFoundError:
                return None
            return StatResult(
                path=path,
                size=attributes.st_size or 0,
                mtime=float(attributes.st_mtime or 0),
                mode=attributes.st_mode or 0,
            )

        return self._sftp_call("stat", path, run)

    def exists(self, path: str) -> bool:
        return self.stat(path) is not None

    def listdir(self, path: str) -> list[str]:
        return sorted(self._sftp_call("list", path, lambda sftp: sftp.listdir(path)))

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        """``mkdir -p`` over SFTP."""

        def run(sftp: paramiko.SFTPClient) -> None:
            parts: list[str] = []
            current = path.rstrip("/") or "/"
            while current not in ("", "/"):
                try:
                    attributes = sftp.stat(current)
                except FileNotFoundError:
                    parts.append(current)
                    current = posixpath.dirname(current)
                    continue
                if not stat_module.S_ISDIR(attributes.st_mode or 0):
                    raise SftpError(f"{current} exists and is not a directory")
                break
            for directory in reversed(parts):
                try:
                    sftp.mkdir(directory, mode)
                except OSError:
                    # Someone else may have created it meanwhile.
                    if not stat_module.S_ISDIR(sftp.stat(directory).st_mode or 0):
                        raise

        self._sftp_call("mkdir", path, run)

    def remove(self, path: str) -> None:
        self._sftp_call("remove", path, lambda sftp: sftp.remove(path))


# ---------------------------------------------------------------- pool

_pool: dict[SshConfig, SshTransport] = {}
_pool_pid = os.getpid()
_pool_lock = threading.Lock()


def _forget_pool_after_fork() -> None:
    # A forked child must not share the parent's socket; it opens its own.
    global _pool_pid, _pool_lock
    _pool.clear()
    _pool_pid = os.getpid()
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_after_fork)


def get_transport(config: SshConfig) -> SshTransport:
    """The process-wide transport for ``config`` (one connection per cluster per worker)."""
    global _pool_pid
    with _pool_lock:
        if _pool_pid != os.getpid():
            _pool.clear()
            _pool_pid = os.getpid()
        transport = _pool.get(config)
        if transport is None:
            transport = SshTransport(config)
            _pool[config] = transport
        return transport


def close_all() -> None:
    with _pool_lock:
        transports = list(_pool.values())
        _pool.clear()
    for transport in transports:
        transport.close()
