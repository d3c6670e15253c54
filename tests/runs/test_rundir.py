"""The one listing of run directories (``runs.rundir``): one command per account for a
whole cycle, only regular files, exit records bounded and checked against their file name,
and evidence taken from an object's own directory only."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from factories import JobFactory
from jobs.models import Job
from runs.lifecycle import ACCOUNTING_NONE, slurm_views
from runs.rundir import EXIT_RECORD_MAX_BYTES, RunDirectories, list_run_directories, parse_listing
from slurm.errors import SshError
from slurm.parsers import SlurmJob


@dataclass
class _Result:
    stdout: str


@dataclass
class LocalShell:
    """A transport whose commands run in a local bash: the listing script for real."""

    user: str = "alice"
    scripts: list[str] = field(default_factory=list)

    @property
    def config(self) -> Any:
        return type("Config", (), {"user": self.user})()

    def exec_shell(self, script: str, **_: Any) -> _Result:
        self.scripts.append(script)
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
        return _Result(done.stdout)


def _exit(directory: Path, name_id: str, content_id: str, code: int = 0) -> None:
    (directory / f"gantry-exit-{name_id}.json").write_text(
        f'{{"slurm_job_id": "{content_id}", "exit_code": {code}, "signal": null}}\n'
    )


def test_the_listing_shows_what_a_run_directory_holds(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints" / "step-000010").mkdir(parents=True)
    (run / "checkpoints" / "step-000010" / "manifest.json").write_text("{}")
    (run / "metrics.jsonl").write_bytes(b"x" * 123)
    (run / "acceptance.json").write_text("{}")
    (run / "slurm-41.out").write_text("")
    _exit(run, "41", "41", code=3)
    listed = list_run_directories(LocalShell(), [str(run)])  # type: ignore[arg-type]
    entry = listed[str(run)]
    assert entry.metrics_size == 123 and entry.acceptance
    assert entry.manifests == [f"{run}/checkpoints/step-000010/manifest.json"]
    assert entry.outputs == {"41"}
    assert entry.exit_record("41") == {"slurm_job_id": "41", "exit_code": 3, "signal": None}


def test_an_exit_record_counts_only_under_its_own_id(tmp_path: Path) -> None:
    # The owner writes a record named for one Slurm job that claims to be another's.
    run = tmp_path / "run"
    run.mkdir()
    _exit(run, "50", "51")
    _exit(run, "52", "52")
    (run / "gantry-exit-53.json").write_text('["not", "an", "object"]')
    (run / "gantry-exit-x54.json").write_text('{"slurm_job_id": "x54"}')
    entry = list_run_directories(LocalShell(), [str(run)])[str(run)]  # type: ignore[arg-type]
    assert set(entry.exits) == {"52"}
    assert entry.exit_record("51") is None and entry.exit_record("50") is None


def test_links_and_other_files_are_not_followed_and_reads_are_bounded(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "gantry-exit-60.json").symlink_to("/dev/zero")
    (run / "metrics.jsonl").symlink_to("/dev/zero")
    (run / "acceptance.json").mkdir()
    os.mkfifo(run / "slurm-61.out")
    # A long exit record: only its head is read, so it is not a record at all.
    (run / "gantry-exit-62.json").write_text(
        '{"slurm_job_id": "62", "exit_code": 0, "pad": "' + "x" * 10 * EXIT_RECORD_MAX_BYTES + '"}'
    )
    shell = LocalShell()
    entry = list_run_directories(shell, [str(run)])[str(run)]  # type: ignore[arg-type]
    assert entry.exits == {} and entry.metrics_size is None
    assert not entry.acceptance and entry.outputs == set()


def test_a_sparse_metrics_file_is_sized_not_read(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "metrics.jsonl", "wb") as sparse:
        sparse.truncate(1 << 40)
    entry = list_run_directories(LocalShell(), [str(run)])[str(run)]  # type: ignore[arg-type]
    assert entry.metrics_size == 1 << 40


def test_a_manifest_path_outside_the_directory_is_not_taken() -> None:
    output = "D /runs/a\nC /runs/a/checkpoints/step-1/manifest.json\nC /etc/passwd\n"
    assert parse_listing(output)["/runs/a"].manifests == [
        "/runs/a/checkpoints/step-1/manifest.json"
    ]


def test_one_command_per_account_for_the_whole_cycle(tmp_path: Path) -> None:
    alice, bob = LocalShell("alice"), LocalShell("bob")
    dirs = {name: tmp_path / name for name in ("a1", "a2", "b1", "a3")}
    for path in dirs.values():
        path.mkdir()
    listing = RunDirectories()
    listing.want([(str(dirs["a1"]), lambda: alice), (str(dirs["b1"]), lambda: bob)])
    listing.want([(str(dirs["a2"]), lambda: alice)])
    errors: list[str] = []
    first = listing.look([(str(dirs["a1"]), lambda: alice)], errors)
    assert set(first) == {str(dirs["a1"])} and not errors
    # The first look listed every wanted directory: one command per account.
    assert len(alice.scripts) == 1 and len(bob.scripts) == 1 and listing.commands == 2
    again = listing.look([(str(dirs["a2"]), lambda: alice), (str(dirs["b1"]), lambda: bob)], errors)
    assert set(again) == {str(dirs["a2"]), str(dirs["b1"])} and listing.commands == 2
    # A directory nobody named costs one more command, for it alone.
    listing.look([(str(dirs["a3"]), lambda: alice)], errors)
    assert listing.commands == 3 and str(dirs["a1"]) not in alice.scripts[-1]


def test_an_account_gantry_cannot_reach_is_unknown_not_empty(tmp_path: Path) -> None:
    def unreachable() -> Any:
        raise SshError("connection refused")

    alice = LocalShell("alice")
    (tmp_path / "a").mkdir()
    errors: list[str] = []
    found = RunDirectories().look(
        [(str(tmp_path / "a"), lambda: alice), ("/runs/of/bob", unreachable)], errors
    )
    assert set(found) == {str(tmp_path / "a")}
    assert len(errors) == 1 and "/runs/of/bob" in errors[0]


@dataclass
class NoAccountingClient:
    queue: dict[str, SlurmJob] = field(default_factory=dict)

    def jobs_in_queue(self, ids: list[str]) -> dict[str, SlurmJob]:
        return {}


@pytest.mark.django_db
def test_one_researcher_cannot_end_anothers_job(tmp_path: Path) -> None:
    """Without accounting, jobs finish from exit records. Bob writes, in his own run
    directory, a record for Alice's Slurm job (under its own file name): it is not
    evidence about her job, which waits (or is declared lost) on her directory alone."""
    alice_job: Job = JobFactory(state=Job.State.RUNNING, slurm_job_id="70")
    bob_job: Job = JobFactory(state=Job.State.RUNNING, slurm_job_id="71")
    alice_dir, bob_dir = tmp_path / "alice", tmp_path / "bob"
    alice_dir.mkdir()
    bob_dir.mkdir()
    _exit(bob_dir, "70", "70", code=9)
    _exit(bob_dir, "71", "71", code=0)
    shells = {alice_job.id: LocalShell("alice"), bob_job.id: LocalShell("bob")}
    views = slurm_views(
        NoAccountingClient(),  # type: ignore[arg-type]
        LocalShell("gantry"),  # type: ignore[arg-type]
        [(alice_job, str(alice_dir)), (bob_job, str(bob_dir))],
        accounting=ACCOUNTING_NONE,
        owner_of=lambda obj: shells[obj.id],  # type: ignore[arg-type,return-value]
    )
    assert set(views.exits) == {"71"}
