"""The batched run-directory reader (``runs/rundir_program.py``) for real: run as an
unprivileged service account on a tree owned by two other accounts, each attack its own
directory, through ``runs.rundir_batch.BatchReader`` (which also parses the answer).

Needs root (to own files as other accounts and to run the program as ``nobody``) and
``setfacl``: skipped elsewhere. The accounts are ones every Debian-like system has:
``daemon`` and ``bin`` are the researchers, ``nobody`` the service account.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from reader_support import (
    OTHER,
    OWNER,
    PYTHON,
    SERVICE,
    AsService,
    Result,
    grant,
    own,
    tree,
    usable,
)

from runs.rundir import list_run_directories, parse_entry
from runs.rundir_batch import BatchReader, FileRequest, Target
from runs.runtime import service_read_grant

pytestmark = pytest.mark.skipif(
    not usable(), reason="needs root, setfacl, runuser and the accounts daemon, bin, nobody"
)


@pytest.fixture
def top() -> Iterator[Path]:
    # Not pytest's tmp_path: it lies under a 0700 directory of root's.
    path = Path(tempfile.mkdtemp(prefix="gantry-reader-"))
    path.chmod(0o755)
    (path / "users").mkdir()
    (path / "users").chmod(0o1777)
    yield path
    shutil.rmtree(path)


def _reader(transport: Any, top: Path, budget: int = 1 << 20) -> BatchReader:
    return BatchReader(
        transport, workdir=str(top), service_account=SERVICE, python=PYTHON, budget=budget
    )


def _target(reader: BatchReader, top: Path, account: str, job: str) -> Target:
    target = reader.target(f"{top}/users/{account}/runs/{job}", account)
    assert target is not None
    return target


EXIT = b'{"slurm_job_id": "41", "exit_code": 3, "signal": null}\n'
METRICS = b"".join(b'{"step": %d, "loss": 1.0}\n' % step for step in range(100))
MANIFEST = b'{"files": [], "step": 10}'


def test_an_honest_directory_is_listed_and_read_exactly(top: Path) -> None:
    area = tree(
        top,
        OWNER,
        {
            "runs/j1/metrics.jsonl": METRICS,
            "runs/j1/acceptance.json": b"{}",
            "runs/j1/gantry-exit-41.json": EXIT,
            "runs/j1/slurm-41.out": b"hello\n",
            "runs/j1/checkpoints/step-000010/manifest.json": MANIFEST,
            "runs/j1/checkpoints/step-000020/rank-0.pt": b"no manifest yet",
        },
    )
    grant(area)
    transport = AsService()
    reader = _reader(transport, top)
    target = _target(reader, top, OWNER, "j1")
    reads = {
        target.directory: [
            FileRequest("metrics.jsonl", 50, offset=26),
            FileRequest("checkpoints/step-000010/manifest.json", 1024, whole=True),
            FileRequest("acceptance.json", 1, whole=True),
        ]
    }
    answer = reader.list_dirs([target], reads)[target.directory]
    assert answer.entries is not None and transport.commands == 1
    listed = parse_entry(answer.entries)
    assert listed.metrics_size == len(METRICS) and listed.acceptance
    assert listed.exit_record("41") == {"slurm_job_id": "41", "exit_code": 3, "signal": None}
    assert listed.outputs == {"41"}
    assert listed.manifests == [f"{target.directory}/checkpoints/step-000010/manifest.json"]
    # Exactly the bytes asked for: 50 from offset 26, the whole manifest; a file over its
    # bound is refused, not cut.
    assert answer.reads["metrics.jsonl"].data == METRICS[26:76]
    assert answer.reads["checkpoints/step-000010/manifest.json"].data == MANIFEST
    refused = answer.reads["acceptance.json"]
    assert refused.data is None and refused.code == "refused" and "over the 1" in refused.error


def test_links_other_owners_and_odd_files_are_never_read(top: Path) -> None:
    other = tree(top, OTHER, {"runs/b1/metrics.jsonl": b"secret of bin\n"})
    area = tree(
        top,
        OWNER,
        {
            "runs/j1/gantry-exit-42.json": b'{"slurm_job_id": "42", "pad": "' + b"x" * 2000 + b'"}',
            "runs/j1/acceptance.json": b"{}",
            "runs/j1/own.jsonl": b"mine\n",
            "runs/j3/metrics.jsonl": b"in a directory bin owns\n",
        },
    )
    j1 = area / "runs" / "j1"
    # A symlinked file, a hard link to another account's file, a file of another owner, a
    # FIFO, a hard-linked own file, a manifest whose step directory is a file.
    (j1 / "metrics.jsonl").symlink_to(other / "runs" / "b1" / "metrics.jsonl")
    os.link(other / "runs" / "b1" / "metrics.jsonl", j1 / "stolen.jsonl")
    own(j1 / "acceptance.json", OTHER)
    os.mkfifo(j1 / "gantry-exit-43.json")
    os.link(j1 / "own.jsonl", j1 / "twice.jsonl")
    (j1 / "checkpoints").mkdir()
    (j1 / "checkpoints" / "step-000030").write_bytes(b"a file, not a directory")
    # A symlinked directory (to bin's run directory) and a directory bin owns.
    (area / "runs" / "j2").symlink_to(other / "runs" / "b1")
    own(area / "runs" / "j3", OTHER)
    for path in [j1, *j1.iterdir(), area / "runs" / "j2"]:
        if path.name not in ("acceptance.json", "stolen.jsonl"):
            own(path, OWNER)
    grant(area)
    grant(other)
    reader = _reader(AsService(), top)
    targets = [_target(reader, top, OWNER, job) for job in ("j1", "j2", "j3")]
    names = ["metrics.jsonl", "stolen.jsonl", "acceptance.json", "twice.jsonl"]
    reads = {targets[0].directory: [FileRequest(name, 1 << 10, whole=True) for name in names]}
    reads[targets[0].directory].append(FileRequest("gantry-exit-43.json", 1 << 10))
    answers = reader.list_dirs(targets, reads)
    first = answers[targets[0].directory]
    assert first.entries is not None
    listed = parse_entry(first.entries)
    assert listed.metrics_size is None and not listed.acceptance
    assert listed.exits == {} and listed.manifests == []
    for name in [*names, "gantry-exit-43.json"]:
        read = first.reads[name]
        assert read.data is None and read.code == "refused", (name, read)
    # Directories through a link, or of another owner: unknown, with the reason.
    for target in targets[1:]:
        answer = answers[target.directory]
        assert answer.entries is None and answer.code == "refused", answer
    assert "link" in answers[targets[1].directory].error
    assert "owner" in answers[targets[2].directory].error


def test_a_directory_replaced_by_a_file_is_refused(top: Path) -> None:
    area = tree(top, OWNER, {"runs/j1": b"not a directory"})
    grant(area)
    reader = _reader(AsService(), top)
    target = _target(reader, top, OWNER, "j1")
    answer = reader.list_dirs([target])[target.directory]
    assert answer.entries is None and answer.code == "refused"


def test_without_the_grant_the_directory_is_denied_and_absent_is_absent(top: Path) -> None:
    tree(top, OWNER, {"runs/j1/metrics.jsonl": METRICS})
    reader = _reader(AsService(), top)
    present = _target(reader, top, OWNER, "j1")
    answer = reader.list_dirs([present])[present.directory]
    assert answer.entries is None and answer.code == "denied"
    gone = _target(reader, top, OTHER, "nothing")
    assert reader.list_dirs([gone])[gone.directory].code == "absent"


def test_what_does_not_fit_the_budget_comes_in_the_next_command(top: Path) -> None:
    files = {f"runs/j{i}/metrics.jsonl": METRICS for i in range(6)}
    area = tree(top, OWNER, files)
    grant(area)
    transport = AsService()
    reader = _reader(transport, top, budget=4096)
    targets = [_target(reader, top, OWNER, f"j{i}") for i in range(6)]
    reads = {t.directory: [FileRequest("metrics.jsonl", len(METRICS))] for t in targets}
    answers = reader.list_dirs(targets, reads)
    assert 1 < transport.commands <= reader.max_commands
    read = [answers[t.directory].reads["metrics.jsonl"] for t in targets]
    # Every tail came back, whole or in part (from the offset asked), or deferred.
    assert any(each.data == METRICS for each in read)
    for each in read:
        assert each.code == "deferred" or (each.data is not None and METRICS.startswith(each.data))


class AsOwner:
    """The owner's own login: the shell listing (``runs.rundir.list_run_directories``) and
    the grant (``runs.runtime.service_read_grant``)."""

    def exec(self, argv: Sequence[str], **_: Any) -> Result:
        done = subprocess.run(["runuser", "-u", OWNER, "--", *argv], capture_output=True)
        return Result(done.returncode, done.stdout.decode(), done.stderr.decode())

    def exec_shell(self, script: str, **_: Any) -> Result:
        done = subprocess.run(
            ["runuser", "-u", OWNER, "--", "bash", "-c", script], capture_output=True, timeout=30
        )
        return Result(done.returncode, done.stdout.decode(), done.stderr.decode())


def test_the_batch_lists_what_the_owners_own_listing_lists(top: Path) -> None:
    beat = b'{"rank": %d, "node": "n%d", "pid": 7, "step": 12, "time": 1.5}\n'
    area = tree(
        top,
        OWNER,
        {
            "runs/j1/metrics.jsonl": METRICS,
            "runs/j1/acceptance.json": b"{}",
            "runs/j1/gantry-exit-41.json": EXIT,
            "runs/j1/slurm-41.out": b"x" * 20000
            + b"\nsrun: error: n2: task 1: Killed\nother\nsrun: error: n3: tasks 2-3: Exited\n",
            "runs/j1/checkpoints/step-000010/manifest.json": MANIFEST,
            "runs/j1/checkpoints/step-000020/manifest.json": MANIFEST,
            "runs/j1/ranks/rank-0.beat": beat % (0, 1),
            "runs/j1/ranks/rank-1.beat": beat % (1, 2),
        },
    )
    grant(area)
    reader = _reader(AsService(), top)
    target = _target(reader, top, OWNER, "j1")
    entries = reader.list_dirs([target])[target.directory].entries
    assert entries is not None
    batched = parse_entry(entries)
    shell = list_run_directories(AsOwner(), [target.directory])[target.directory]  # type: ignore[arg-type]
    assert batched == shell
    assert batched.srun_errors == {"41": [("n2", "1", "Killed"), ("n3", "2-3", "Exited")]}
    assert sorted(batched.beats) == [0, 1] and batched.beats[1].node == "n2"
    assert len(batched.manifests) == 2 and batched.exit_record("41") is not None


def test_the_grant_holds_for_what_gantry_and_the_trainer_make_later(top: Path) -> None:
    """As Gantry does it: the area 0700 (a chmod, which voids the mask), the grant, a run
    directory made 0700 over SFTP and granted, then the trainer's files and directories
    (its umask, 0644 files, 0777 directories). The service account reads them all; another
    account reads nothing."""
    area = top / "users" / OWNER
    area.mkdir()
    own(area, OWNER)
    owner = AsOwner()
    assert owner.exec(["chmod", "0700", str(area)]).rc == 0
    assert service_read_grant(owner, area=str(area), service_account=SERVICE)
    run = area / "runs" / "j1"
    assert owner.exec(["mkdir", "-m", "0700", "-p", str(run)]).rc == 0
    assert service_read_grant(owner, area=str(area), directory=str(run), service_account=SERVICE)
    write = (
        "import os; os.umask(0o077); os.makedirs('checkpoints/step-000010');"
        "fd = os.open('metrics.jsonl', os.O_WRONLY | os.O_CREAT, 0o644); os.write(fd, b'1\\n');"
        "open('checkpoints/step-000010/manifest.json', 'w').write('{}')"
    )
    done = subprocess.run(["runuser", "-u", OWNER, "--", PYTHON, "-c", write], cwd=run)
    assert done.returncode == 0
    reader = _reader(AsService(), top)
    target = _target(reader, top, OWNER, "j1")
    answer = reader.list_dirs([target], {target.directory: [FileRequest("metrics.jsonl", 100)]})[
        target.directory
    ]
    assert answer.entries is not None and answer.entries["metrics_size"] == 2
    assert answer.reads["metrics.jsonl"].data == b"1\n" and len(answer.entries["manifests"]) == 1
    # The other account: not even the area.
    peek = subprocess.run(["runuser", "-u", OTHER, "--", "ls", str(area)], capture_output=True)
    assert peek.returncode != 0
