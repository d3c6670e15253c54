"""A cluster account's area (<workdir>/users/<account>): made as the account, 0700, and
refused when it is not the account's own (another account made it, or it is a link)."""

from __future__ import annotations

import stat
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from runs.runtime import (
    UserAreaError,
    run_dir,
    service_read_grant,
    user_area,
    user_area_ensure,
)
from slurm.errors import SftpError, SshTransientError
from slurm.sftp import StatResult


@dataclass
class _Ran:
    rc: int
    stderr: str = ""


@dataclass
class FakeFiles:
    """A login node's file system as seen by one account: who owns what."""

    owners: dict[str, str]
    modes: dict[str, int]
    links: set[str] = field(default_factory=set)


@dataclass
class FakeTransport:
    files: FakeFiles
    account: str
    calls: list[str] = field(default_factory=list)
    fail_with: Exception | None = None
    # What its commands (setfacl) exit with.
    rc: int = 0

    def lstat(self, path: str) -> StatResult | None:
        self.calls.append(f"lstat {path}")
        if self.fail_with is not None:
            raise self.fail_with
        if path in self.files.links:
            return StatResult(path=path, size=0, mtime=0, mode=stat.S_IFLNK | 0o777)
        if path not in self.files.owners:
            return None
        return StatResult(path=path, size=0, mtime=0, mode=stat.S_IFDIR | self.files.modes[path])

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        self.calls.append(f"mkdir {path} {mode:o}")
        parent = path.rsplit("/", 1)[0]
        if parent in self.files.modes and not self.files.modes[parent] & 0o002:
            if self.files.owners.get(parent) != self.account:
                raise SftpError(f"mkdir: permission denied on {path}")
        self.files.owners.setdefault(path, self.account)
        self.files.modes.setdefault(path, mode)

    def chmod(self, path: str, mode: int) -> None:
        self.calls.append(f"chmod {path} {mode:o}")
        if self.files.owners.get(path) != self.account:
            raise SftpError(f"chmod: permission denied on {path} (as {self.account})")
        self.files.modes[path] = mode

    def exists(self, path: str) -> bool:
        return path in self.files.owners

    def put_bytes(self, path: str, data: bytes, mode: int = 0o644) -> None:
        raise AssertionError("not used")

    def exec(
        self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True
    ) -> _Ran:
        self.calls.append(" ".join(argv))
        return _Ran(self.rc, "setfacl: Operation not supported" if self.rc else "")


def _cluster() -> tuple[FakeFiles, FakeTransport, FakeTransport, FakeTransport]:
    files = FakeFiles(owners={"/w": "gantry"}, modes={"/w": 0o755})
    return (
        files,
        FakeTransport(files, "gantry"),
        FakeTransport(files, "alice"),
        FakeTransport(files, "bob"),
    )


def test_the_first_job_makes_users_sticky_and_the_area_0700_as_the_account() -> None:
    files, service, alice, _ = _cluster()
    assert user_area_ensure(service, alice, "/w", "alice") == "/w/users/alice"
    assert files.owners["/w/users"] == "gantry" and files.modes["/w/users"] == 0o1777
    assert files.owners["/w/users/alice"] == "alice" and files.modes["/w/users/alice"] == 0o700
    # Once per process and account: no more remote calls.
    calls = len(alice.calls)
    user_area_ensure(service, alice, "/w", "alice")
    assert len(alice.calls) == calls


def test_an_area_another_account_made_in_its_name_is_refused() -> None:
    files, service, _, bob = _cluster()
    files.owners["/w/users"], files.modes["/w/users"] = "gantry", 0o1777
    # alice squats bob's name before bob's first job.
    files.owners["/w/users/bob"], files.modes["/w/users/bob"] = "alice", 0o777
    with pytest.raises(UserAreaError, match="owned by bob with mode 0700"):
        user_area_ensure(service, bob, "/w", "bob")


def test_a_link_in_the_accounts_place_is_refused() -> None:
    files, service, _, bob = _cluster()
    files.owners["/w/users"], files.modes["/w/users"] = "gantry", 0o1777
    files.links.add("/w/users/bob")
    with pytest.raises(UserAreaError, match="not a directory of bob's own"):
        user_area_ensure(service, bob, "/w", "bob")


def test_a_dropped_link_is_not_taken_for_a_bad_area() -> None:
    _, service, _, bob = _cluster()
    bob.fail_with = SshTransientError("link lost")
    with pytest.raises(SshTransientError):
        user_area_ensure(service, bob, "/w", "bob")


def test_paths_refuse_anything_but_an_account_name() -> None:
    assert run_dir("/w/", "j1", "alice") == "/w/users/alice/runs/j1"
    assert run_dir("/w", "j1") == "/w/runs/j1"
    for bad in ("../x", "a/b", "alice\n", "", "Alice", "a b"):
        with pytest.raises(ValueError):
            user_area("/w", bad)


# ---------------------------------------------------------------- the service account's grant


def test_the_area_is_opened_to_the_service_account_after_its_chmod() -> None:
    files = FakeFiles(owners={"/w": "gantry"}, modes={"/w": 0o755})
    service, alice = FakeTransport(files, "gantry"), FakeTransport(files, "alice")
    user_area_ensure(service, alice, "/w", "alice", service_account="gantry")
    # A chmod leaves the ACL mask at nothing: the grant (setfacl recomputes it) comes after.
    chmod = alice.calls.index("chmod /w/users/alice 700")
    grant = alice.calls.index("setfacl -m u:gantry:rX,d:u:gantry:rX -- /w/users/alice")
    assert chmod < grant and files.modes["/w/users/alice"] == 0o700
    assert not any("setfacl" in call for call in service.calls)


def test_a_login_node_without_acls_still_gets_its_area() -> None:
    files = FakeFiles(owners={"/w": "gantry"}, modes={"/w": 0o755})
    service, alice = FakeTransport(files, "gantry"), FakeTransport(files, "alice", rc=1)
    assert user_area_ensure(service, alice, "/w", "alice", service_account="gantry")
    assert service_read_grant(alice, area="/w/users/alice", service_account="gantry") is False


def test_a_run_directory_is_granted_from_the_area_down() -> None:
    files = FakeFiles(owners={"/w": "gantry"}, modes={"/w": 0o755})
    alice = FakeTransport(files, "alice")
    area = "/w/users/alice"
    assert service_read_grant(
        alice, area=area, directory=f"{area}/runs/j1", service_account="gantry"
    )
    assert alice.calls == [
        f"setfacl -m u:gantry:rX,d:u:gantry:rX -- {area} {area}/runs {area}/runs/j1"
    ]
    for outside in ("/w/users/bob/runs/j1", f"{area}/../bob/runs", f"{area}x/runs"):
        with pytest.raises(ValueError):
            service_read_grant(alice, area=area, directory=outside, service_account="gantry")
