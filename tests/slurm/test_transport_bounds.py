"""Every remote command is bounded in the output kept and in time, against a real OpenSSH
server of the test's own on 127.0.0.1 (``tests/sshd_support.py``; no dev cluster): a command
or a login file that floods fails with ``CommandOutputTooLarge`` without the process holding
the flood, output under the bound comes back whole, and a login file that sleeps costs the
caller the command timeout, no more."""

from __future__ import annotations

import subprocess
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
import sshd_support
from sshd_support import PrivateSshd

from slurm.channel import Bounds, drive
from slurm.errors import CommandOutputTooLarge, SshCommandTimeout, describe_cluster_error
from slurm.transport import SshTransport

pytestmark = pytest.mark.skipif(bool(sshd_support.available()), reason=sshd_support.available())

CAP = 1 << 20
STDERR_CAP = 256 << 10
FLOOD = 64 << 20


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSshd]:
    server = PrivateSshd(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.close()


@pytest.fixture
def transport(sshd: PrivateSshd) -> Iterator[SshTransport]:
    sshd.set_login_file("")
    config = sshd.config(max_output_bytes=CAP, max_stderr_bytes=STDERR_CAP, command_timeout=20)
    with SshTransport(config) as connected:
        connected.connect()
        yield connected
    sshd.set_login_file("")


def _peak_python_bytes(call: object) -> tuple[int, BaseException | None]:
    """Python's peak allocations (every thread: paramiko's reader too) while ``call`` ran."""
    tracemalloc.start()
    caught: BaseException | None = None
    try:
        call()  # type: ignore[operator]
    except Exception as error:
        caught = error
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, caught


def test_a_stdout_flood_fails_naming_the_command_and_the_bound(transport: SshTransport) -> None:
    peak, caught = _peak_python_bytes(
        lambda: transport.exec(["head", "-c", str(FLOOD), "/dev/zero"])
    )
    assert isinstance(caught, CommandOutputTooLarge)
    assert caught.stream == "stdout" and caught.limit == CAP and caught.argv[0] == "head"
    assert f"head printed more than {CAP} bytes on stdout" in str(caught)
    assert not caught.transient
    assert "printed too much" in describe_cluster_error(caught)
    # The bound, paramiko's channel window (2 MiB) and slack; never the 64 MiB printed.
    assert peak < 8 << 20, peak
    assert transport.bytes_read == 0
    # The channel was ended, the connection kept: the next command runs on it.
    assert transport.exec(["echo", "next"]).stdout == "next\n"
    assert transport.connections_opened == 1


def test_output_up_to_the_bound_comes_back_whole(transport: SshTransport) -> None:
    exact = transport.exec(["sh", "-c", f"head -c {CAP} /dev/zero | tr '\\0' a"])
    assert exact.stdout == "a" * CAP
    with pytest.raises(CommandOutputTooLarge):
        transport.exec(["sh", "-c", f"head -c {CAP + 1} /dev/zero | tr '\\0' a"])


def test_one_call_may_keep_more_than_the_config_says(transport: SshTransport) -> None:
    size = CAP + CAP // 2
    result = transport.exec(["head", "-c", str(size), "/dev/zero"], max_output=2 * CAP)
    assert len(result.stdout) == size
    with pytest.raises(CommandOutputTooLarge) as caught:
        transport.exec(["head", "-c", str(size), "/dev/zero"], max_output=CAP // 4)
    assert caught.value.limit == CAP // 4


def test_a_stderr_flood_fails_under_its_own_bound(transport: SshTransport) -> None:
    peak, caught = _peak_python_bytes(
        lambda: transport.exec_shell(f"head -c {FLOOD} /dev/zero >&2; echo done")
    )
    assert isinstance(caught, CommandOutputTooLarge)
    assert caught.stream == "stderr" and caught.limit == STDERR_CAP
    assert peak < 8 << 20, peak
    small = transport.exec_shell(f"head -c {STDERR_CAP} /dev/zero >&2; echo done")
    assert len(small.stderr) == STDERR_CAP and small.stdout == "done\n"


def test_a_flooding_login_file_is_stopped_before_the_command(
    sshd: PrivateSshd, transport: SshTransport
) -> None:
    # Endless: only the closed channel (EOF, SIGPIPE) ends it.
    marker = f"gantry-flood-{uuid.uuid4().hex}"
    sshd.set_login_file(f"yes {marker}\n")
    started = time.monotonic()
    with pytest.raises(CommandOutputTooLarge) as caught:
        transport.exec(["echo", "never"])
    assert caught.value.argv == ["echo", "never"]
    assert time.monotonic() - started < 10

    def still_running() -> bool:
        found = subprocess.run(["pgrep", "-f", marker], capture_output=True, check=False)
        return found.returncode == 0

    deadline = time.monotonic() + 10
    while still_running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not still_running(), "the flooding login file kept running after Gantry closed"
    sshd.set_login_file("")
    assert transport.exec(["echo", "fine"]).stdout == "fine\n"


def test_a_sleeping_login_file_costs_the_command_timeout_and_no_more(
    sshd: PrivateSshd, transport: SshTransport
) -> None:
    sshd.set_login_file("sleep 60\n")
    started = time.monotonic()
    with pytest.raises(SshCommandTimeout) as caught:
        transport.exec(["echo", "never"], timeout=2)
    elapsed = time.monotonic() - started
    assert 1.9 <= elapsed < 4, elapsed
    assert caught.value.timeout == 2


class _UnansweredChannel:
    """A channel whose exec request the server never answers (paramiko would wait on it
    forever): only ``close`` ends the wait, as paramiko's does."""

    def __init__(self) -> None:
        self.closed_event = threading.Event()

    def settimeout(self, seconds: float) -> None:
        pass

    def exec_command(self, command: str) -> None:
        self.closed_event.wait()
        raise paramiko.SSHException("Channel closed.")

    def close(self) -> None:
        self.closed_event.set()


def test_an_exec_request_never_answered_times_out_at_the_deadline() -> None:
    channel = _UnansweredChannel()
    started = time.monotonic()
    with pytest.raises(SshCommandTimeout):
        drive(
            channel,  # type: ignore[arg-type]
            "true",
            ["true"],
            stdin=None,
            bounds=Bounds(seconds=0.5, stdout=CAP, stderr=CAP),
            deadline=started + 0.5,
            endpoint="test",
        )
    assert 0.45 <= time.monotonic() - started < 3


def test_sftp_whole_file_reads_are_bounded(transport: SshTransport, tmp_path: Path) -> None:
    from slurm.errors import RemoteFileRefused

    small, large = tmp_path / "small", tmp_path / "large"
    small.write_bytes(b"x" * CAP)
    large.write_bytes(b"x" * (CAP + 1))
    assert transport.get_bytes(str(small)) == b"x" * CAP
    with pytest.raises(RemoteFileRefused):
        transport.get_bytes(str(large))
    assert transport.get_bytes(str(large), max_bytes=2 * CAP) == b"x" * (CAP + 1)
