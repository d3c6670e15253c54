"""The batched run-directory reader's real surroundings for tests: accounts every
Debian-like system has (``daemon`` and ``bin`` the researchers, ``nobody`` the service
account), a transport that runs the reader as the service account here, and trees of
files owned by the researchers, granted to the service account as Gantry grants them."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm.errors import SlurmCommandError

OWNER, OTHER, SERVICE = "daemon", "bin", "nobody"
PYTHON = "/usr/bin/python3"


def usable() -> bool:
    try:
        for name in (OWNER, OTHER, SERVICE):
            pwd.getpwnam(name)
    except KeyError:
        return False
    return (
        os.geteuid() == 0
        and shutil.which("setfacl") is not None
        and shutil.which("runuser") is not None
        and os.access(PYTHON, os.X_OK)
    )


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str


class AsService:
    """A transport whose ``exec`` runs the argv here, as the service account."""

    def __init__(self) -> None:
        self.commands = 0

    def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = True,
        max_output: int | None = None,
    ) -> Result:
        self.commands += 1
        done = subprocess.run(
            ["runuser", "-u", SERVICE, "--", *argv], input=stdin, capture_output=True, timeout=30
        )
        if check and done.returncode != 0:
            raise SlurmCommandError("failed", argv=list(argv), rc=done.returncode)
        return Result(done.returncode, done.stdout.decode(), done.stderr.decode())


def own(path: Path, account: str) -> None:
    entry = pwd.getpwnam(account)
    os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)


def tree(top: Path, account: str, files: dict[str, bytes]) -> Path:
    """``top/users/<account>/runs/...`` with ``files``, all the account's, 0700 area."""
    area = top / "users" / account
    for name, data in files.items():
        path = area / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for path in [area, *area.rglob("*")]:
        own(path, account)
    area.chmod(0o700)
    return area


def grant(area: Path) -> None:
    subprocess.run(["setfacl", "-R", "-m", f"u:{SERVICE}:rX", str(area)], check=True)
