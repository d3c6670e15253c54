"""One account's volume cannot starve another's reads (``jobs.read_shares``), and a read
that was deferred or cut short is no evidence: the batched reader program for real
(``runs/rundir_program.py`` run as an unprivileged service account over files two other
accounts own), a budget small enough that one account's growth fills it.

Needs what ``tests/runs/test_rundir_program.py`` needs (root, setfacl, runuser, the
accounts daemon, bin and nobody): skipped elsewhere."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from reader_support import OTHER, OWNER, PYTHON, SERVICE, AsService, grant, tree, usable

from factories import ClusterFactory, JobFactory
from jobs.models import Job, MetricPoint
from jobs.read_shares import fair_shares, interleaved, water_fill
from jobs.rundir import RunFilesResult, run_files_read
from recovery.detect import hung_jobs, policy_for, progress_update
from runs.rundir import RunDirectories
from runs.rundir_batch import BatchReader

# The hog's four jobs each grow by this much a cycle; the reader answers a quarter of it.
HOG_GROWTH = 96 << 10
BUDGET = 64 << 10


def _lines(start: int, count: int, pad: int = 0) -> bytes:
    return b"".join(
        json.dumps(
            {"step": step, "time": 1_800_000_000 + step, "loss": 1.0, "pad": "x" * pad}
        ).encode()
        + b"\n"
        for step in range(start, start + count)
    )


@pytest.fixture
def top() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gantry-fair-"))
    path.chmod(0o755)
    (path / "users").mkdir()
    (path / "users").chmod(0o1777)
    yield path
    shutil.rmtree(path)


def _grow(top: Path, job: Job, data: bytes) -> None:
    path = top / "users" / job.run_as / "runs" / str(job.id) / "metrics.jsonl"
    with path.open("ab") as handle:
        handle.write(data)


class _NoOwnerLogin:
    """An account's own login: the batched reader lists and reads everything here."""

    def __init__(self, _cluster: Any, account: str) -> None:
        self.config = type("Config", (), {"user": account})()

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"read as the owner ({name}): the service account may read")


@pytest.fixture(autouse=True)
def _owners(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("jobs.rundir.transport_as", _NoOwnerLogin)


def _cycle(cluster: Any, jobs: list[Job]) -> RunFilesResult:
    reader = BatchReader(
        AsService(),
        workdir=cluster.workdir,
        service_account=SERVICE,
        python=PYTHON,
        budget=BUDGET,
        max_commands=1,
    )
    return run_files_read(
        cluster=cluster,
        # The hogs first, as they came first to the reader before it shared its budget.
        jobs=list(
            Job.objects.filter(id__in=[j.id for j in jobs])
            .select_related("cluster")
            .order_by("slurm_job_id")
        ),
        listing=RunDirectories(batch=reader),
    )


@pytest.mark.django_db
@pytest.mark.skipif(not usable(), reason="needs root, setfacl, runuser, daemon, bin, nobody")
def test_a_flood_of_one_account_neither_starves_nor_convicts_another(top: Path) -> None:
    cluster = ClusterFactory(personas=False, workdir=str(top))
    hogs = [
        JobFactory(cluster=cluster, state=Job.State.RUNNING, slurm_job_id=str(10 + i), run_as=OWNER)
        for i in range(4)
    ]
    quiet = JobFactory(cluster=cluster, state=Job.State.RUNNING, slurm_job_id="99", run_as=OTHER)
    tree(top, OWNER, {f"runs/{j.id}/metrics.jsonl": b"" for j in hogs})
    tree(top, OTHER, {f"runs/{quiet.id}/metrics.jsonl": b""})
    grant(top / "users" / OWNER)
    grant(top / "users" / OTHER)
    step = 0
    for _cycle_number in range(4):
        for hog in hogs:
            _grow(top, hog, _lines(step, HOG_GROWTH // 100, pad=40)[:HOG_GROWTH])
        _grow(top, quiet, _lines(step, 3))
        step += 3
        files = _cycle(cluster, [*hogs, quiet])
        quiet.refresh_from_db()
        # Every cycle, the quiet job's new lines are read whole, and it counts as seen.
        size = (top / "users" / OTHER / "runs" / str(quiet.id) / "metrics.jsonl").stat().st_size
        assert quiet.metrics_offset == size
        assert quiet.id in files.seen and quiet.id not in files.incomplete
        # The hogs were read only in part: no evidence of anything this cycle.
        assert {h.id for h in hogs} <= files.incomplete
        assert not {h.id for h in hogs} & files.seen
    assert MetricPoint.objects.filter(job=quiet).count() == step

    # Recovery's clock, after the hang floor: the quiet job grew, so it is not hung; the
    # hogs were never seen whole, so their quiet is never judged either.
    policy = policy_for(cluster)
    running = list(Job.objects.filter(cluster=cluster).select_related("cluster", "resume_from"))
    later = timezone.now() + timedelta(seconds=policy.hang_floor_seconds + 60)
    progress = progress_update(jobs=running, seen=files.seen, now=later)
    assert hung_jobs(jobs=running, progress=progress, policy=policy, now=later) == []


@pytest.mark.django_db
@pytest.mark.skipif(not usable(), reason="needs root, setfacl, runuser, daemon, bin, nobody")
def test_an_ended_job_read_in_part_is_not_final_until_its_tail_is_read(top: Path) -> None:
    cluster = ClusterFactory(personas=False, workdir=str(top))
    ended = JobFactory(cluster=cluster, state=Job.State.COMPLETED, slurm_job_id="41", run_as=OWNER)
    data = _lines(0, 2000, pad=40)
    tree(top, OWNER, {f"runs/{ended.id}/metrics.jsonl": data})
    grant(top / "users" / OWNER)
    cycles = 0
    while True:
        files = _cycle(cluster, [ended])
        cycles += 1
        ended.refresh_from_db()
        if ended.files_final:
            break
        assert ended.id in files.incomplete and ended.metrics_offset < len(data)
        assert cycles < 20
    # Not final after the first, cut-short read; final once the last line was read.
    assert cycles > 1 and ended.metrics_offset == len(data)
    assert MetricPoint.objects.filter(job=ended).count() == 2000


def test_fair_shares_bound_every_job_whatever_the_others_want() -> None:
    capacity = 1000
    wants = {f"hog{i}": ("alice", 10_000) for i in range(5)}
    wants.update({"b1": ("bob", 50), "b2": ("bob", 10_000), "c1": ("carol", 300)})
    shares = fair_shares(wants, capacity)
    # Three accounts: each gets at least capacity // 3 (or all it wants), whatever alice asks.
    assert shares["c1"] == 300 and shares["b1"] == 50
    assert shares["b1"] + shares["b2"] >= capacity // 3
    assert sum(shares.values()) <= capacity
    # Alice's five jobs share her part equally; she gets what is left, not more.
    alice = [shares[f"hog{i}"] for i in range(5)]
    assert max(alice) - min(alice) <= 1 and sum(alice) <= capacity - 300 - 50 - shares["b2"] + 5
    # More of alice's jobs cannot take bytes from bob or carol.
    more = dict(wants, **{f"hog{i}": ("alice", 10_000) for i in range(5, 500)})
    again = fair_shares(more, capacity)
    assert (again["b1"], again["b2"], again["c1"]) == (shares["b1"], shares["b2"], shares["c1"])


def test_water_fill_is_max_min_fair() -> None:
    assert water_fill({"a": 10, "b": 500, "c": 500}, 600) == {"a": 10, "b": 295, "c": 295}
    assert water_fill({"a": 10, "b": 20}, 600) == {"a": 10, "b": 20}
    assert water_fill({}, 600) == {}
    assert water_fill({"a": 10}, 0) == {"a": 0}


def test_interleaving_turns_so_no_account_is_always_last() -> None:
    items = [("alice", 1), ("alice", 2), ("alice", 3), ("bob", 1), ("carol", 1)]
    firsts = {interleaved(items, lambda item: item[0], turn)[0][0] for turn in range(3)}
    assert firsts == {"alice", "bob", "carol"}
    # Each account's first item comes before any account's second.
    order = interleaved(items, lambda item: item[0], 1)
    assert [item[0] for item in order[:3]] == ["bob", "carol", "alice"]
