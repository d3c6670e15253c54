"""Driving one exec channel to its end within bounds: the seconds the command may take
from opening its channel, and the bytes of stdout and stderr kept. ``SshTransport.exec``
opens the channel and turns link failures into ``slurm.errors`` classes; this module feeds
stdin, reads both streams and stops at the first bound passed."""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import paramiko

from slurm.errors import CommandOutputTooLarge, SshCommandTimeout

# Bytes asked of the channel per read, and sent per write of stdin.
_READ = 65536
_WRITE = 32768


@dataclass(frozen=True)
class Bounds:
    """One command's limits: seconds from opening its channel, bytes kept per stream."""

    seconds: float
    stdout: int
    stderr: int


class KeptOutput:
    """What is kept of one output stream, never more than ``limit`` bytes: past it, the
    command fails (``CommandOutputTooLarge``) rather than return a truncated success."""

    def __init__(self, *, endpoint: str, argv: list[str], stream: str, limit: int) -> None:
        self.endpoint = endpoint
        self.argv = argv
        self.stream = stream
        self.limit = limit
        # One growing buffer, not a list of chunks joined at the end (twice the memory).
        self.data = bytearray()

    def take(self, ready: Callable[[], bool], receive: Callable[[int], bytes]) -> bool:
        """Read what has arrived; whether anything had."""
        progressed = False
        while ready():
            # Never ask for more than one byte past the bound: that byte proves it passed.
            chunk = receive(min(_READ, self.limit + 1 - len(self.data)))
            if not chunk:
                break
            if len(self.data) + len(chunk) > self.limit:
                raise CommandOutputTooLarge(
                    f"{self.argv[0]} printed more than {self.limit} bytes on {self.stream} on "
                    f"{self.endpoint}: Gantry stopped reading, ended the command and discarded "
                    "its output (the command, or a login file of the account such as "
                    "~/.ssh/rc or a shell startup file, prints too much)",
                    argv=self.argv,
                    stream=self.stream,
                    limit=self.limit,
                )
            self.data += chunk
            progressed = True
        return progressed


def timed_out(argv: list[str], seconds: float, endpoint: str) -> SshCommandTimeout:
    return SshCommandTimeout(
        f"{argv[0]} did not finish within {seconds:g}s on {endpoint}",
        argv=argv,
        timeout=seconds,
    )


def _start(
    channel: paramiko.Channel,
    command: str,
    argv: list[str],
    *,
    bounds: Bounds,
    deadline: float,
    endpoint: str,
) -> None:
    """Send the exec request. paramiko waits for the server's answer without a limit, so a
    watchdog closes the channel at the deadline, which ends that wait."""
    watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), channel.close)
    watchdog.daemon = True
    watchdog.start()
    try:
        channel.exec_command(command)
    except paramiko.SSHException:
        if time.monotonic() >= deadline:
            raise timed_out(argv, bounds.seconds, endpoint) from None
        raise
    finally:
        watchdog.cancel()


def drive(
    channel: paramiko.Channel,
    command: str,
    argv: list[str],
    *,
    stdin: bytes | None,
    bounds: Bounds,
    deadline: float,
    endpoint: str,
) -> tuple[int, bytearray, bytearray]:
    """Run ``command`` on the open ``channel``: its exit status, stdout and stderr.
    Raises ``SshCommandTimeout`` at ``deadline`` and ``CommandOutputTooLarge`` past a byte
    bound; the caller closes the channel, which ends the command on the remote side."""
    channel.settimeout(max(0.001, deadline - time.monotonic()))
    _start(channel, command, argv, bounds=bounds, deadline=deadline, endpoint=endpoint)
    pending = memoryview(stdin or b"")
    if not pending:
        channel.shutdown_write()
    stdout = KeptOutput(endpoint=endpoint, argv=argv, stream="stdout", limit=bounds.stdout)
    stderr = KeptOutput(endpoint=endpoint, argv=argv, stream="stderr", limit=bounds.stderr)
    while True:
        progressed = stdout.take(channel.recv_ready, channel.recv)
        progressed = stderr.take(channel.recv_stderr_ready, channel.recv_stderr) or progressed
        if pending and channel.send_ready():
            sent = channel.send(bytes(pending[:_WRITE]))
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
                if time.monotonic() >= deadline:
                    # The watchdog closed it as the exec request was answered.
                    raise timed_out(argv, bounds.seconds, endpoint)
                raise EOFError("channel closed before the command reported its exit status")
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise timed_out(argv, bounds.seconds, endpoint)
        if not progressed:
            # The channel's fileno becomes readable on stdout, stderr or EOF.
            select.select([channel], [], [], min(remaining, 0.5 if pending else 5.0))
    status = channel.recv_exit_status()
    if status == -1:
        # paramiko's "no exit status": the connection died under the command.
        raise EOFError("the connection closed before the command reported its exit status")
    return status, stdout.data, stderr.data
