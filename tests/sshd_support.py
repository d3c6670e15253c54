"""A throwaway OpenSSH server of a test's (or a bench's) own on 127.0.0.1: its own host
key, client key, known_hosts and port, for the current user, with nothing of the dev cluster.
Plain Python, no Django.

A researcher's login files are stood in for by ``login_file``: a shell snippet the server
runs before every command (its ``ForceCommand`` wrapper sources it, then runs the command
the client asked for), the way ``~/.ssh/rc`` or a shell startup file runs before the
command on a real login node; the user's real ``~/.ssh/rc`` is never run or touched
(``PermitUserRC no``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from slurm.connect import SshConfig

SSHD = "/usr/sbin/sshd"


def available() -> str:
    """Why no private sshd can start here ("" when it can)."""
    for tool in (SSHD, shutil.which("ssh-keygen") or "ssh-keygen"):
        if not os.access(tool, os.X_OK):
            return f"{tool} is not installed"
    return ""


def listener_stop(process: subprocess.Popen[bytes] | None) -> None:
    """Stop an sshd listener this test started and the sessions it forked (its own
    children only): like a login node going away."""
    if process is None or process.poll() is not None:
        return
    sessions = subprocess.run(
        ["pgrep", "-P", str(process.pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    process.terminate()
    process.wait(timeout=10)
    for session in sessions:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(session), 15)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateSshd:
    """``start()`` it, use ``config(...)`` for an ``SshConfig``, ``close()`` it."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = _free_port()
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.host_key = directory / "host_ed25519"
        self.client_key = directory / "client_ed25519"
        self.known_hosts = directory / "known_hosts"
        self.login_file = directory / "login-file"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> PrivateSshd:
        self.dir.mkdir(parents=True, exist_ok=True)
        for key in (self.host_key, self.client_key):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                check=True,
                stdin=subprocess.DEVNULL,
            )
        authorized = self.dir / "authorized_keys"
        authorized.write_text(self.client_key.with_suffix(".pub").read_text())
        host_public = self.host_key.with_suffix(".pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {host_public[0]} {host_public[1]}\n")
        self.login_file.write_text("")
        wrapper = self.dir / "login"
        # The command the client asked for runs after the login file, as a login shell would.
        wrapper.write_text(
            "#!/bin/sh\n"
            'if [ "$SSH_ORIGINAL_COMMAND" = sftp ]; then exec /usr/lib/openssh/sftp-server; fi\n'
            f'. "{self.login_file}"\n'
            'exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n'
        )
        wrapper.chmod(0o755)
        config = self.dir / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.host_key}",
                    f"PidFile {self.dir / 'sshd.pid'}",
                    f"AuthorizedKeysFile {authorized}",
                    f"AllowUsers {self.user}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "PermitUserRC no",
                    "Subsystem sftp /usr/lib/openssh/sftp-server",
                    f"ForceCommand {wrapper}",
                    "MaxSessions 50",
                    "LogLevel ERROR",
                ]
            )
            + "\n"
        )
        self.process = subprocess.Popen(
            [SSHD, "-D", "-f", str(config), "-E", str(self.dir / "sshd.log")],
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.dir / "sshd.log").read_text(errors="replace")
                raise RuntimeError(f"the private sshd exited: {log}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 1),
            ):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"the private sshd did not listen on port {self.port}")

    def set_login_file(self, script: str) -> None:
        """What the account's login files do before each command from now on."""
        self.login_file.write_text(script)

    def config(self, **overrides: Any) -> SshConfig:
        """An ``SshConfig`` for this server (``overrides``: any of its fields)."""
        config = SshConfig(
            host="127.0.0.1",
            port=self.port,
            user=self.user,
            key_path=str(self.client_key),
            known_hosts_path=str(self.known_hosts),
            connect_timeout=5,
            command_timeout=30,
        )
        return dataclasses.replace(config, **overrides)

    def close(self) -> None:
        """Stop the listener and the sessions it forked (its own children only)."""
        listener_stop(self.process)
