"""One watcher cycle's run directories over the batched reader (``runs.rundir_batch``):
remote commands and logins that do not grow with the number of accounts, the fallback to
the owner's own login where the service account may not read, and an answer that is not
what the reader writes refused whole. The reader program itself runs for real in
``test_rundir_program.py``; here the service account's side is a fake that answers from
an in-memory tree, and the owners' side counts its logins."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from factories import ClusterFactory, JobFactory
from jobs.models import Job, MetricPoint
from jobs.rundir import run_files_read
from runs.rundir import RunDirectories
from runs.rundir_batch import (
    BatchOutputError,
    BatchReader,
    FileRequest,
    Target,
    batch_target,
    parse_answer,
)
from slurm.errors import SlurmCommandError, SshTransientError

WORKDIR = "/srv/gantry"


@dataclass
class _Result:
    rc: int
    stdout: str
    stderr: str = ""


@dataclass
class FakeService:
    """The service account's login: answers the reader's request from ``files`` (path ->
    bytes) as the program would; directories of ``denied`` accounts are denied."""

    files: dict[str, bytes] = field(default_factory=dict)
    denied: set[str] = field(default_factory=set)
    commands: int = 0
    stdout: str | None = None
    fail: Exception | None = None

    def exec(self, argv: Sequence[str], *, stdin: bytes | None = None, **_: Any) -> _Result:
        self.commands += 1
        if self.fail is not None:
            raise self.fail
        assert argv[1:4] == ["-I", "-S", "-c"] and stdin is not None
        if self.stdout is not None:
            return _Result(0, self.stdout)
        request = json.loads(stdin)
        return _Result(0, json.dumps({"v": 1, "dirs": [self._one(d) for d in request["dirs"]]}))

    def _one(self, item: dict[str, Any]) -> dict[str, Any]:
        if item["owner"] in self.denied:
            return {"id": item["id"], "error": "permission denied", "code": "denied"}
        directory = "/".join([item["root"], *item["parts"]])
        answer: dict[str, Any] = {"id": item["id"], "reads": []}
        if item["list"]:
            metrics = self.files.get(f"{directory}/metrics.jsonl")
            answer["listing"] = {
                "metrics": None if metrics is None else len(metrics),
                "acceptance": False,
                "exits": {},
                "outputs": [],
                "manifests": [],
            }
        for read in item["reads"]:
            data = self.files[f"{directory}/{read['name']}"][read["offset"] :][: read["max"]]
            answer["reads"].append(
                {
                    "name": read["name"],
                    "offset": read["offset"],
                    "data": base64.b64encode(data).decode(),
                }
            )
        return answer


@dataclass
class FakeOwner:
    """An account's own login: counts logins and listing commands (everything is empty)."""

    user: str
    log: list[str]

    @property
    def config(self) -> Any:
        return type("Config", (), {"user": self.user})()

    def exec_shell(self, script: str, **_: Any) -> _Result:
        self.log.append(self.user)
        return _Result(0, "")

    def read_from(self, path: str, offset: int, max_bytes: int) -> bytes:
        self.log.append(self.user)
        return b""


def _owners(monkeypatch: pytest.MonkeyPatch, logins: list[str]) -> None:
    """Each account's login, one per account (as the pool keeps them)."""
    owners: dict[str, FakeOwner] = {}

    def transport_as(_cluster: Any, account: str) -> FakeOwner:
        return owners.setdefault(account, FakeOwner(account, logins))

    monkeypatch.setattr("jobs.rundir.transport_as", transport_as)


def _reader(service: FakeService) -> BatchReader:
    return BatchReader(
        service, workdir=WORKDIR, service_account="gantry", python="/usr/bin/python3"
    )


METRICS = b"".join(
    json.dumps({"step": step, "time": 1_800_000_000 + step, "loss": 2.5}).encode() + b"\n"
    for step in range(1, 6)
)


@pytest.mark.django_db
@pytest.mark.parametrize("accounts", [1, 10, 100])
def test_a_cycle_costs_the_same_for_1_10_and_100_accounts(
    accounts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = ClusterFactory(personas=False)
    jobs = [
        JobFactory(
            cluster=cluster,
            state=Job.State.RUNNING,
            slurm_job_id=str(100 + i),
            run_as=f"u{i % accounts:03d}",
        )
        for i in range(100)
    ]
    service = FakeService(
        files={f"{WORKDIR}/users/{j.run_as}/runs/{j.id}/metrics.jsonl": METRICS for j in jobs}
    )
    logins: list[str] = []
    _owners(monkeypatch, logins)
    listing = RunDirectories(batch=_reader(service))
    files = run_files_read(cluster=cluster, jobs=jobs, listing=listing)
    assert not files.errors
    # One listing and one command of reads, as the service account; no owner logged in.
    assert service.commands == 2 and listing.commands == 2 and logins == []
    assert listing.fallbacks == 0 and files.owner_reads == 0
    assert files.metric_points == 5 * 100 == MetricPoint.objects.count()
    assert set(Job.objects.values_list("metrics_offset", flat=True)) == {len(METRICS)}


@pytest.mark.django_db
def test_an_area_without_the_grant_falls_back_to_its_owner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = ClusterFactory(personas=False)
    jobs = [
        JobFactory(
            cluster=cluster, state=Job.State.RUNNING, slurm_job_id=str(i), run_as=f"u{i % 10}"
        )
        for i in range(30)
    ]
    service = FakeService(
        files={f"{WORKDIR}/users/{j.run_as}/runs/{j.id}/metrics.jsonl": METRICS for j in jobs},
        denied={"u3", "u7"},
    )
    logins: list[str] = []
    _owners(monkeypatch, logins)
    listing = RunDirectories(batch=_reader(service))
    files = run_files_read(cluster=cluster, jobs=jobs, listing=listing)
    # The two accounts without a grant: one listing each as themselves (their 6 directories
    # counted as fallbacks); the other 24 read in the batch.
    assert sorted(logins) == ["u3", "u7"] and listing.fallbacks == 6
    assert service.commands == 2 and listing.commands == 4
    assert files.metric_points == 5 * 24 and len(files.seen) == 30


def test_a_failed_batch_command_falls_back_but_a_dead_link_does_not() -> None:
    log: list[str] = []
    owners = {name: FakeOwner(name, log) for name in ("alice", "bob")}
    items = [
        (f"{WORKDIR}/users/{name}/runs/j{i}", (lambda o=owners[name]: o))
        for name in owners
        for i in range(3)
    ]
    # No Python there (the command fails): every account is listed as itself.
    service = FakeService(fail=SlurmCommandError("no python", argv=["python"], rc=127))
    listing = RunDirectories(batch=_reader(service))
    errors: list[str] = []
    assert len(listing.look(items, errors)) == 6 and not errors  # type: ignore[arg-type]
    assert sorted(log) == ["alice", "bob"] and listing.fallbacks == 6
    # The login node unreachable: unknown for the cycle, not 200 more logins.
    log.clear()
    service = FakeService(fail=SshTransientError("connection reset"))
    listing = RunDirectories(batch=_reader(service))
    assert listing.look(items, errors) == {} and log == []  # type: ignore[arg-type]
    assert errors and "connection reset" in errors[0]


def _targets() -> list[Target]:
    target = batch_target(
        f"{WORKDIR}/users/alice/runs/j1", workdir=WORKDIR, account="alice", service_account="gantry"
    )
    assert target is not None
    return [target]


@pytest.mark.parametrize(
    "stdout",
    [
        "not json",
        json.dumps({"v": 2, "dirs": []}),
        json.dumps({"v": 1, "dirs": [{"id": 5}]}),
        json.dumps({"v": 1, "dirs": [{"id": 0, "listing": {}}, {"id": 0, "listing": {}}]}),
        json.dumps({"v": 1, "dirs": [{"id": 0, "error": "x", "code": "fine"}]}),
        json.dumps({"v": 1, "dirs": [{"id": 0, "listing": {"metrics": -1}}]}),
        json.dumps({"v": 1, "dirs": [{"id": 0, "listing": {"exits": []}}]}),
        # A file nobody asked for, and more bytes than asked.
        json.dumps({"v": 1, "dirs": [{"id": 0, "reads": [{"name": "/etc/shadow", "data": ""}]}]}),
        json.dumps(
            {
                "v": 1,
                "dirs": [
                    {
                        "id": 0,
                        "reads": [
                            {
                                "name": "metrics.jsonl",
                                "offset": 0,
                                "data": base64.b64encode(b"x" * 11).decode(),
                            }
                        ],
                    }
                ],
            }
        ),
        "[" * 100_000 + "]" * 100_000,
        " " * (3 << 20),
    ],
)
def test_an_answer_that_is_not_the_readers_is_refused_whole(stdout: str) -> None:
    reads = {_targets()[0].directory: [FileRequest("metrics.jsonl", 10)]}
    with pytest.raises(BatchOutputError):
        parse_answer(stdout, _targets(), reads, limit=2 << 20)


def test_names_the_shell_listing_would_not_take_are_dropped() -> None:
    listing = {
        "metrics": 3,
        "exits": {"gantry-exit-7.json": '{"slurm_job_id": "7"}', "../x.json": "{}"},
        "outputs": ["slurm-7.out", "slurm-../../x.out", 3],
        "manifests": ["step-000010", "step-1/../../../etc", "x"],
    }
    stdout = json.dumps({"v": 1, "dirs": [{"id": 0, "listing": listing}]})
    entries = parse_answer(stdout, _targets(), {}, limit=1 << 20)[_targets()[0].directory].entries
    assert entries is not None
    assert entries["exits"] == ['gantry-exit-7.json {"slurm_job_id": "7"}']
    assert entries["outputs"] == ["slurm-7.out"]
    assert entries["manifests"] == [
        f"{WORKDIR}/users/alice/runs/j1/checkpoints/step-000010/manifest.json"
    ]


def test_only_directories_inside_an_accounts_own_area_are_batched() -> None:
    def target(directory: str, account: str) -> Target | None:
        return batch_target(directory, workdir=WORKDIR, account=account, service_account="gantry")

    ok = target(f"{WORKDIR}/users/alice/runs/j1/drills/d1", "alice")
    assert ok is not None and ok.root == f"{WORKDIR}/users"
    assert ok.parts == ("alice", "runs", "j1", "drills", "d1") and ok.owner == "alice"
    service = target(f"{WORKDIR}/runs/j1", "gantry")
    assert service is not None and service.root == WORKDIR and service.owner == "gantry"
    for directory, account in [
        (f"{WORKDIR}/users/bob/runs/j1", "alice"),
        (f"{WORKDIR}/users/alice/../bob/runs/j1", "alice"),
        (f"{WORKDIR}/users/alice", "alice"),
        ("/elsewhere/runs/j1", "alice"),
        (f"{WORKDIR}/runs/j1", "alice"),
        (f"{WORKDIR}/users/alice/runs/j1", "Alice"),
    ]:
        assert target(directory, account) is None, directory


def test_an_accounts_own_listing_comes_in_commands_a_shell_accepts() -> None:
    """sshd hands the listing to the shell as one argument (Linux: at most 128 KiB): an
    account with hundreds of directories is listed in chunks, every one of them."""
    log: list[str] = []
    scripts: list[str] = []
    alice = FakeOwner("alice", log)

    def exec_shell(script: str, **_: Any) -> _Result:
        scripts.append(script)
        return _Result(0, "")

    alice.exec_shell = exec_shell  # type: ignore[method-assign]
    items = [(f"{WORKDIR}/users/alice/runs/j{i:03d}", lambda: alice) for i in range(200)]
    listing = RunDirectories()
    assert len(listing.look(items, [])) == 200  # type: ignore[arg-type]
    assert listing.commands == len(scripts) == 4
    assert max(len(script) for script in scripts) < 128 << 10
