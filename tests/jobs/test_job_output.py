"""Whole logs: the Slurm output and each rank's, streamed with range requests, from paths
built only from Gantry's own ids; and the batch script writing each rank's file."""

from __future__ import annotations

import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from factories import JobFactory
from jobs import output
from jobs.lifecycle import JOBS
from jobs.models import Job
from jobs.output import RangeNotSatisfiable, byte_range
from runs.runtime import TRAINER_BOOTSTRAP, ScriptSpec, render_sbatch
from slurm.errors import RemoteFileNotFound

pytestmark = pytest.mark.django_db


@dataclass
class FakeStat:
    size: int


@dataclass
class FakeTransport:
    """SFTP over a dict of path -> bytes; records every path it is asked about."""

    files: dict[str, bytes] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)
    reads: list[tuple[int, int]] = field(default_factory=list)

    def stat(self, path: str) -> FakeStat | None:
        self.paths.append(path)
        return FakeStat(len(self.files[path])) if path in self.files else None

    def read_from(self, path: str, offset: int, max_bytes: int) -> bytes:
        self.paths.append(path)
        self.reads.append((offset, max_bytes))
        return self.files[path][offset : offset + max_bytes]

    def listdir(self, path: str) -> list[str]:
        self.paths.append(path)
        prefix = path.rstrip("/") + "/"
        names = [name[len(prefix) :] for name in self.files if name.startswith(prefix)]
        if not names:
            raise RemoteFileNotFound(f"{path} does not exist", path=path)
        return names


LOG = b"".join(f"line {n:05d} of the job\n".encode() for n in range(40000))


@pytest.fixture
def job(researcher: Any) -> Job:
    return JobFactory(
        owner=researcher,
        state=Job.State.RUNNING,
        slurm_job_id="4242",
        nodes=1,
        tasks_per_node=2,
    )


@pytest.fixture
def cluster_files(job: Job, monkeypatch: pytest.MonkeyPatch) -> FakeTransport:
    directory = JOBS.run_directory(job)
    transport = FakeTransport(
        files={
            f"{directory}/slurm-4242.out": LOG,
            f"{directory}/rank-4242-0.out": b"rank zero\n",
            f"{directory}/rank-4242-1.out": b"rank one\n",
            f"{directory}/rank-4241-0.out": b"an earlier Slurm job\n",
            f"{directory}/metrics.jsonl": b"{}\n",
        }
    )
    monkeypatch.setattr(JOBS, "transport_of", lambda obj: transport)
    return transport


def body(response: Any) -> bytes:
    return b"".join(response.streaming_content)


def test_the_whole_output_streams_in_chunks(
    job: Job,
    cluster_files: FakeTransport,
    researcher_api: APIClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A chunk smaller than the log (the real one is 4 MiB), so it takes several reads.
    monkeypatch.setattr(output, "CHUNK_BYTES", 64 * 1024)
    response = researcher_api.get(f"/api/v1/jobs/{job.id}/output/")
    assert response.status_code == 200
    assert response["Content-Length"] == str(len(LOG))
    assert response["Accept-Ranges"] == "bytes"
    assert response["Content-Disposition"] == 'attachment; filename="slurm-4242.out"'
    assert body(response) == LOG
    # Read through the transport a chunk at a time, never the whole file at once.
    assert len(cluster_files.reads) == -(-len(LOG) // output.CHUNK_BYTES) > 1
    assert max(size for _, size in cluster_files.reads) <= output.CHUNK_BYTES


@pytest.mark.parametrize(
    ("header", "start", "end"),
    [("bytes=0-99", 0, 99), ("bytes=1000-", 1000, None), ("bytes=-50", None, None)],
)
def test_ranges_answer_206(
    job: Job,
    cluster_files: FakeTransport,
    researcher_api: APIClient,
    header: str,
    start: int | None,
    end: int | None,
) -> None:
    response = researcher_api.get(f"/api/v1/jobs/{job.id}/output/", HTTP_RANGE=header)
    assert response.status_code == 206
    size = len(LOG)
    first = start if start is not None else size - 50
    last = end if end is not None else size - 1
    assert response["Content-Range"] == f"bytes {first}-{last}/{size}"
    assert body(response) == LOG[first : last + 1]
    assert response["Content-Length"] == str(last - first + 1)


@pytest.mark.parametrize(
    "header", ["bytes=9999999-", "bytes=50-10", "bytes=0-1,5-9", "lines=1-2", "bytes=-0", "bytes=-"]
)
def test_bad_ranges_answer_416(
    job: Job, cluster_files: FakeTransport, researcher_api: APIClient, header: str
) -> None:
    response = researcher_api.get(f"/api/v1/jobs/{job.id}/output/", HTTP_RANGE=header)
    assert response.status_code == 416
    assert response["Content-Range"] == f"bytes */{len(LOG)}"
    assert set(response.json()) == {"message", "extra"}
    assert cluster_files.reads == []


def test_byte_range_rules() -> None:
    assert byte_range(None, 10) is None
    assert byte_range("bytes=2-100", 10) == (2, 9)
    assert byte_range("bytes=-100", 10) == (0, 9)
    with pytest.raises(RangeNotSatisfiable):
        byte_range("bytes=0-", 0)


def test_each_ranks_output(
    job: Job, cluster_files: FakeTransport, researcher_api: APIClient
) -> None:
    listed = researcher_api.get(f"/api/v1/jobs/{job.id}/output/ranks/").json()
    # Only this Slurm job's rank files, not an earlier one's in the same directory.
    assert listed == [
        {"rank": 0, "name": "rank-4242-0.out", "size": 10},
        {"rank": 1, "name": "rank-4242-1.out", "size": 9},
    ]
    one = researcher_api.get(f"/api/v1/jobs/{job.id}/output/ranks/1/")
    assert one.status_code == 200 and body(one) == b"rank one\n"
    assert researcher_api.get(f"/api/v1/jobs/{job.id}/output/ranks/2/").status_code == 404
    page = Client()
    page.force_login(job.owner)
    downloaded = page.get(f"/jobs/{job.id}/output/rank/0/", HTTP_RANGE="bytes=0-3")
    assert downloaded.status_code == 206 and body(downloaded) == b"rank"


@pytest.mark.parametrize(
    "suffix",
    [
        "output/ranks/../../../../etc/passwd/",
        "output/ranks/-1/",
        "output/ranks/0%2F..%2F..%2Fetc%2Fpasswd/",
        "output/ranks/%2e%2e/",
        "output/..%2F..%2Fmetrics.jsonl/",
    ],
)
def test_paths_come_only_from_gantrys_ids(
    job: Job, cluster_files: FakeTransport, researcher_api: APIClient, suffix: str
) -> None:
    response = researcher_api.get(f"/api/v1/jobs/{job.id}/{suffix}")
    assert response.status_code == 404
    directory = JOBS.run_directory(job)
    for path in cluster_files.paths:
        assert path == directory or path.rsplit("/", 1)[0] == directory, path
        assert ".." not in path and "passwd" not in path


def test_every_path_asked_for_is_an_own_file(
    job: Job, cluster_files: FakeTransport, researcher_api: APIClient
) -> None:
    researcher_api.get(f"/api/v1/jobs/{job.id}/output/")
    researcher_api.get(f"/api/v1/jobs/{job.id}/output/ranks/")
    researcher_api.get(f"/api/v1/jobs/{job.id}/output/ranks/1/")
    directory = JOBS.run_directory(job)
    allowed = {
        directory,
        f"{directory}/slurm-4242.out",
        f"{directory}/rank-4242-0.out",
        f"{directory}/rank-4242-1.out",
    }
    assert set(cluster_files.paths) <= allowed


def test_no_output_before_slurm_has_the_job(researcher: Any, researcher_api: APIClient) -> None:
    queued = JobFactory(owner=researcher, state=Job.State.QUEUED)
    response = researcher_api.get(f"/api/v1/jobs/{queued.id}/output/")
    assert response.status_code == 404
    assert "no Slurm job" in response.json()["message"]


def test_a_missing_file_is_404_and_others_jobs_are_hidden(
    job: Job,
    cluster_files: FakeTransport,
    researcher_api: APIClient,
    other_researcher: Any,
    outsider: Any,
) -> None:
    cluster_files.files.clear()
    assert researcher_api.get(f"/api/v1/jobs/{job.id}/output/").status_code == 404
    other = APIClient()
    other.force_authenticate(other_researcher)
    assert other.get(f"/api/v1/jobs/{job.id}/output/").status_code == 404
    page = Client()
    page.force_login(other_researcher)
    assert page.get(f"/jobs/{job.id}/output/").status_code == 404
    nobody = APIClient()
    nobody.force_authenticate(outsider)
    assert nobody.get(f"/api/v1/jobs/{job.id}/output/").status_code == 403


def _spec(tmp_path: Path) -> ScriptSpec:
    return ScriptSpec(
        job_id="j",
        job_name="ranks",
        run_dir=str(tmp_path / "run dir"),
        trainer_dir=str(tmp_path),
        python=str(tmp_path / "bin" / "python"),
        partition="batch",
        nodes=1,
        tasks_per_node=2,
        cpus_per_task=1,
        gpus_per_node=0,
        gpu_type="",
        memory_mb=None,
        time_limit_minutes=5,
        nodelist="",
        switches="",
        trainer_args=("train", "--config", "c.json"),
        rank_output=True,
    )


def test_each_rank_writes_its_own_file_and_keeps_its_exit_status(tmp_path: Path) -> None:
    """The script runs in bash with a stand-in srun that starts two tasks, as Slurm does:
    each task's lines reach both the job's output and the rank's own file, and the task's
    exit status (3) is the script's."""
    spec = _spec(tmp_path)
    (tmp_path / "run dir").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(
        "#!/bin/bash\n"
        "while [[ $1 == --* ]]; do shift; done\n"
        'rc=0; for t in 0 1; do SLURM_PROCID=$t "$@" || rc=$?; done; exit $rc\n'
    )
    scontrol = bin_dir / "scontrol"
    scontrol.write_text("#!/bin/sh\necho n1\n")
    # The trainer, as far as this test cares: a line on stdout, one on stderr, exit 3.
    python = bin_dir / "python"
    python.write_text(
        '#!/bin/bash\necho "hello from rank $SLURM_PROCID"; echo "warning $SLURM_PROCID" >&2; exit 3\n'
    )
    for tool in (srun, scontrol, python):
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(spec))
    done = subprocess.run(
        ["bash", str(script)],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "99", "SLURM_JOB_NODELIST": "n1"},
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert "hello from rank 0" in done.stdout and "hello from rank 1" in done.stdout
    run = tmp_path / "run dir"
    assert (run / "rank-99-0.out").read_text() == "hello from rank 0\nwarning 0\n"
    assert (run / "rank-99-1.out").read_text() == "hello from rank 1\nwarning 1\n"


def test_drills_keep_the_plain_srun_line(tmp_path: Path) -> None:
    from dataclasses import replace

    plain = render_sbatch(replace(_spec(tmp_path), rank_output=False))
    assert "tee -a" not in plain
    assert (
        f"srun --export=ALL --kill-on-bad-exit=1 {tmp_path}/bin/python -I -u -c "
        f"'{TRAINER_BOOTSTRAP}' {tmp_path} train --config c.json\n"
    ) in plain
