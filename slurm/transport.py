"""SSH transport to a cluster's login host: pinned host key, key or certificate auth,
exec with stdin, bounded in time and in the output kept (``slurm.channel``), SFTP
(``slurm.sftp``); and the pool: one connection per login identity (the service account,
each cluster account Gantry acts as) per process, closed when idle, at most so many per
login node.

Failures become ``slurm.errors`` classes: a dead link is retried once
transparently (only where no command can have run twice), then surfaces as
``SshTransientError``; host key, authentication and configuration problems are
permanent errors with a plain-words message. A certificate the login node refuses (it
expired by the node's clock, the CA changed) is signed again once.
"""

from __future__ import annotations

import logging
import os
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import paramiko

from slurm.certificates import CertificateSpec, SignedKey, signed_key
from slurm.channel import Bounds, drive
from slurm.connect import LINK_ERRORS, SshConfig, open_client
from slurm.errors import (
    SshAuthenticationError,
    SshError,
    SshOutcomeUnknown,
    SshTransientError,
    command_error,
)
from slurm.sftp import SftpOperations, StatResult

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class ExecResult:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str


__all__ = ["ExecResult", "PoolLimits", "SshTransport", "StatResult", "close_all", "get_transport"]


class SshTransport(SftpOperations):
    """One SSH connection (and one SFTP session on it), reused, thread-safe.

    Counters: ``connections_opened``, ``commands_run``, ``sftp_operations``,
    ``bytes_read`` (stdout+stderr+SFTP reads), for the per-cycle performance goals;
    ``command_seconds`` (wall time of commands, from opening the channel to the exit
    status) and ``command_errors`` (commands that failed at the SSH level: no link, a
    timeout, an unknown outcome; not a non-zero exit), which callers export as metrics;
    ``certificates_signed`` and ``idle_closes``.
    """

    def __init__(self, config: SshConfig) -> None:
        self.config = config
        self._lock = threading.RLock()
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        # The certificate (and the in-memory key it certifies) reconnects reuse while it
        # has some life left; refused or near its end, a new one is signed.
        self._signed: SignedKey | None = None
        # Operations in flight (exec channels run outside the lock) and when the last ended:
        # the pool closes only connections that are idle.
        self._active = 0
        self.last_used = time.monotonic()
        # Set by the pool: makes room under the per-login-node limit before connecting.
        self.before_connect: Callable[[SshTransport], None] | None = None
        self.connections_opened = 0
        self.commands_run = 0
        self.command_seconds = 0.0
        self.command_errors = 0
        self.sftp_operations = 0
        self.bytes_read = 0
        self.certificates_signed = 0
        self.idle_closes = 0
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
        if self.before_connect is not None:
            self.before_connect(self)
        spec = self.config.certificate
        if spec is None:
            client, seen = open_client(self.config)
        else:
            client, seen = self._open_with_certificate(spec)
        self.server_fingerprint = seen
        self.connections_opened += 1
        return client

    def _open_with_certificate(self, spec: CertificateSpec) -> tuple[paramiko.SSHClient, str]:
        signed = self._signed
        margin = min(60.0, spec.valid_seconds / 4)
        fresh = signed is None or signed.valid_before - time.time() < margin
        if fresh or signed is None:
            signed = self._sign(spec)
        try:
            return open_client(self.config, signed.key)
        except SshAuthenticationError:
            if fresh:
                raise
            # The login node refused the certificate we held (expired by its clock, or the
            # CA was replaced): sign a new one, once.
            logger.info(
                "%s refused certificate serial %s; signing a new one",
                self.config.endpoint,
                signed.serial,
            )
            return open_client(self.config, self._sign(spec).key)

    def _sign(self, spec: CertificateSpec) -> SignedKey:
        self._signed = signed_key(spec)
        self.certificates_signed += 1
        logger.info(
            "signed a %d s certificate for %s (serial %s)",
            spec.valid_seconds,
            self.config.endpoint,
            self._signed.serial,
        )
        return self._signed

    @property
    def idle(self) -> bool:
        return self._active == 0

    def close_if_idle(self, max_idle_seconds: float | None = None) -> bool:
        """Close the connection if no operation uses it (and, with ``max_idle_seconds``,
        none did for that long); never waits for a busy one. True if it closed one."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._active or not self.connected:
                return False
            if (
                max_idle_seconds is not None
                and time.monotonic() - self.last_used < max_idle_seconds
            ):
                return False
            self._drop()
            self.idle_closes += 1
            return True
        finally:
            self._lock.release()

    def _begin(self) -> None:
        with self._lock:
            self._active += 1

    def _end(self) -> None:
        with self._lock:
            self._active -= 1
            self.last_used = time.monotonic()

    def _with_link(
        self, what: str, operation: Callable[[paramiko.SSHClient], T], *, retry: bool
    ) -> T:
        """Run ``operation`` on a live connection; reconnect once if the link was dead."""
        with self._lock:
            self._begin()
            try:
                return self._with_link_locked(what, operation, retry=retry)
            finally:
                self._end()

    def _with_link_locked(
        self, what: str, operation: Callable[[paramiko.SSHClient], T], *, retry: bool
    ) -> T:
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
        max_output: int | None = None,
    ) -> ExecResult:
        """Run ``argv`` on the login host; every element reaches the program literally.

        ``check=True`` raises ``SlurmCommandError`` (or a subclass) on a non-zero exit.
        ``timeout`` (default ``command_timeout``) bounds the whole command from opening its
        channel, so a login file that sleeps before the command starts counts against it;
        ``max_output`` (default ``max_output_bytes``) bounds the stdout kept
        (``CommandOutputTooLarge`` past it).
        """
        argv = [str(part) for part in argv]
        if not argv:
            raise ValueError("empty argv")
        if any("\x00" in part for part in argv):
            # A NUL cannot travel in an SSH exec request; refuse rather than cut it short.
            raise ValueError("an argument contains a NUL byte")
        return self._run(
            shlex.join(argv), argv, stdin=stdin, timeout=timeout, check=check, max_output=max_output
        )

    def exec_shell(
        self,
        script: str,
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = True,
        max_output: int | None = None,
    ) -> ExecResult:
        """Run a fixed shell script. Only for trusted text; quote values with shlex.quote."""
        return self._run(
            script,
            ["sh", "-c", script],
            stdin=stdin,
            timeout=timeout,
            check=check,
            max_output=max_output,
        )

    def _run(
        self,
        command: str,
        argv: list[str],
        *,
        stdin: bytes | None,
        timeout: float | None,
        check: bool,
        max_output: int | None,
    ) -> ExecResult:
        if max_output is not None and max_output <= 0:
            raise ValueError("max_output must be > 0")
        bounds = Bounds(
            seconds=self.config.command_timeout if timeout is None else timeout,
            stdout=self.config.max_output_bytes if max_output is None else max_output,
            stderr=self.config.max_stderr_bytes,
        )
        started = time.monotonic()
        self._begin()
        try:
            result = self._run_once(command, argv, stdin=stdin, bounds=bounds)
        except Exception:
            with self._lock:
                self.command_errors += 1
            raise
        finally:
            with self._lock:
                self.command_seconds += time.monotonic() - started
            self._end()
        if check and result.rc != 0:
            raise command_error(argv, result.rc, result.stdout, result.stderr)
        return result

    def _run_once(
        self, command: str, argv: list[str], *, stdin: bytes | None, bounds: Bounds
    ) -> ExecResult:
        deadline = 0.0

        def open_channel(client: paramiko.SSHClient) -> paramiko.Channel:
            nonlocal deadline
            transport = client.get_transport()
            if transport is None or not transport.is_active():
                raise EOFError("SSH transport is not active")
            # The command's time starts once the link is up (logging in has its own
            # timeouts, ``open_client``): opening the channel, the exec request, a login
            # file that sleeps or floods before the command, and the command itself.
            deadline = time.monotonic() + bounds.seconds
            return transport.open_session(timeout=min(self.config.connect_timeout, bounds.seconds))

        # Opening a channel runs nothing, so a dead link there is safe to retry.
        channel = self._with_link("opening a channel", open_channel, retry=True)
        with self._lock:
            self.commands_run += 1
        try:
            rc, stdout, stderr = drive(
                channel,
                command,
                argv,
                stdin=stdin,
                bounds=bounds,
                deadline=deadline,
                endpoint=self.config.endpoint,
            )
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
            # Past a bound this is what stops the command: the remote side gets EOF/SIGPIPE.
            channel.close()
        with self._lock:
            self.bytes_read += len(stdout) + len(stderr)
        return ExecResult(
            argv=argv,
            rc=rc,
            stdout=stdout.decode("utf-8", errors="replace"),
            stderr=stderr.decode("utf-8", errors="replace"),
        )


# ---------------------------------------------------------------- pool


@dataclass(frozen=True)
class PoolLimits:
    """How many SSH connections a process keeps: one per identity that is in use, each
    closed after ``idle_seconds`` without an operation, at most ``max_per_login_node`` open
    to one login node (the least recently used idle one is closed to make room)."""

    idle_seconds: float = 300
    max_per_login_node: int = 8


_pool: dict[SshConfig, SshTransport] = {}
_pool_pid = os.getpid()
_pool_lock = threading.Lock()
_limits = PoolLimits()
_reaper_pid: int | None = None


def _forget_pool_after_fork() -> None:
    # A forked child must not share the parent's socket; it opens its own.
    global _pool_pid, _pool_lock, _reaper_pid
    _pool.clear()
    _pool_pid = os.getpid()
    _pool_lock = threading.Lock()
    _reaper_pid = None


os.register_at_fork(after_in_child=_forget_pool_after_fork)


def get_transport(config: SshConfig, *, limits: PoolLimits | None = None) -> SshTransport:
    """The process-wide transport for ``config``: one connection per login identity per
    worker process, under ``limits`` (the last given is the one in force)."""
    global _pool_pid, _limits
    with _pool_lock:
        if _pool_pid != os.getpid():
            _pool.clear()
            _pool_pid = os.getpid()
        if limits is not None:
            _limits = limits
        _start_reaper()
        transport = _pool.get(config)
        if transport is None:
            transport = SshTransport(config)
            transport.before_connect = _make_room
            _pool[config] = transport
        return transport


def _open_to(login_node: tuple[str, int], *, besides: SshTransport) -> list[SshTransport]:
    with _pool_lock:
        return [
            transport
            for transport in _pool.values()
            if transport is not besides
            and transport.config.login_node == login_node
            and transport.connected
        ]


def _make_room(opening: SshTransport) -> None:
    """Before ``opening`` connects: under the limit of open connections to its login node,
    closing the least recently used idle one if need be. When every one is busy, wait for
    one to become idle up to the connect timeout, then refuse (a transient error: the task
    that wanted it retries)."""
    deadline = time.monotonic() + opening.config.connect_timeout
    while True:
        limit = _limits.max_per_login_node
        open_now = _open_to(opening.config.login_node, besides=opening)
        if len(open_now) < limit:
            return
        for candidate in sorted(open_now, key=lambda transport: transport.last_used):
            if candidate.close_if_idle():
                logger.info(
                    "closed idle SSH connection %s to stay within %d per login node",
                    candidate.config.endpoint,
                    limit,
                )
                return
        if time.monotonic() >= deadline:
            host, port = opening.config.login_node
            raise SshTransientError(
                f"all {len(open_now)} SSH connections to {host}:{port} are busy "
                f"(at most {limit} per login node: GANTRY_SSH_POOL_MAX_PER_CLUSTER)"
            )
        time.sleep(0.05)


def close_idle() -> int:
    """Close every pooled connection idle for longer than the idle timeout; how many."""
    with _pool_lock:
        transports = list(_pool.values())
        idle_seconds = _limits.idle_seconds
    return sum(transport.close_if_idle(idle_seconds) for transport in transports)


def _start_reaper() -> None:
    """One daemon thread per process closes idle connections (called with the pool lock)."""
    global _reaper_pid
    if _reaper_pid == os.getpid():
        return
    _reaper_pid = os.getpid()

    def reap() -> None:
        while True:
            time.sleep(max(1.0, min(30.0, _limits.idle_seconds / 2)))
            try:
                closed = close_idle()
            except Exception:
                logger.exception("closing idle SSH connections failed")
                continue
            if closed:
                logger.info("closed %d idle SSH connection(s)", closed)

    threading.Thread(target=reap, name="gantry-ssh-reaper", daemon=True).start()


def pool_connections(login_node: tuple[str, int]) -> list[SshTransport]:
    """The pooled transports of one login node that hold an open connection."""
    with _pool_lock:
        return [t for t in _pool.values() if t.config.login_node == login_node and t.connected]


def pool_counters(login_node: tuple[str, int]) -> tuple[int, float, int]:
    """Commands run, their seconds and SSH-level errors, summed over every pooled
    transport (every identity) of one login node in this process."""
    with _pool_lock:
        transports = [t for t in _pool.values() if t.config.login_node == login_node]
    return (
        sum(t.commands_run for t in transports),
        sum(t.command_seconds for t in transports),
        sum(t.command_errors for t in transports),
    )


def pool_logins(login_node: tuple[str, int]) -> int:
    """SSH logins (connections opened) to one login node in this process, every identity."""
    with _pool_lock:
        transports = [t for t in _pool.values() if t.config.login_node == login_node]
    return sum(t.connections_opened for t in transports)


def close_all() -> None:
    with _pool_lock:
        transports = list(_pool.values())
        _pool.clear()
    for transport in transports:
        transport.close()
