"""Redis restarted under load, and the trainer killed in the middle of a checkpoint."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from celery_support import STACK_ENV, database_url_for, start_beat, start_worker
from controlplane.celery import app as celery_app
from devcluster_support import DevCluster
from fault_support import FaultReport, duplicates_and_lost, submit_tiny, wait_all
from jobs.models import Checkpoint, Job
from nodes.models import Cluster

pytestmark = pytest.mark.django_db(transaction=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """A redis-server of this test's own, so restarting it disturbs nobody else."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.process = subprocess.Popen(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        def answers() -> bool:
            try:
                return bool(redis.Redis.from_url(self.url, socket_connect_timeout=0.5).ping())
            except redis.RedisError:
                return False

        assert wait_all(answers, timeout=10, every=0.1)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.kill()


def use_broker(url: str) -> None:
    """Point this process's Celery app at another broker (what the web app publishes to)."""
    celery_app.conf.broker_url = url
    celery_app.conf.result_backend = url
    celery_app.pool.force_close_all()
    celery_app._pool = None  # type: ignore[attr-defined]
    # The producer pool and the result backend hold on to the old connections too.
    celery_app.amqp._producer_pool = None
    celery_app.__dict__.pop("backend", None)
    celery_app._local.__dict__.pop("backend", None)  # type: ignore[attr-defined]


@pytest.mark.exclusive
def test_redis_restart_loses_no_work_and_pages_keep_serving(
    dev_cluster_registered: Cluster,
    researcher_api: APIClient,
    researcher: Any,
    devcluster: DevCluster,
    private_redis: PrivateRedis,
    tmp_path: Path,
    fault_report: FaultReport,
) -> None:
    from django.conf import settings

    original = settings.CELERY_BROKER_URL
    env = {
        **STACK_ENV,
        "REDIS_URL": private_redis.url,
        "CELERY_BROKER_URL": private_redis.url,
        "CELERY_RESULT_BACKEND": private_redis.url,
        "GANTRY_SUBMIT_REQUEUE_AFTER": "5",
    }
    url = database_url_for(connection.settings_dict)
    use_broker(private_redis.url)
    worker = start_worker(database_url=url, log_path=tmp_path / "worker.log", extra_env=env)
    beat = start_beat(database_url=url, log_path=tmp_path / "beat.log", extra_env=env)
    try:
        before = submit_tiny(researcher_api, 2, name="before-restart")
        # Redis dies (nothing is persisted: every queued message is gone) ...
        private_redis.kill()
        started = time.monotonic()
        during = submit_tiny(researcher_api, 2, name="redis-down")
        submit_took = time.monotonic() - started
        pages = Client()
        pages.force_login(researcher)
        statuses = {
            path: pages.get(path).status_code for path in ("/", "/jobs/", "/nodes/", "/drills/")
        }
        # ... and comes back empty.
        private_redis.start()
        job_ids = before + during
        done = wait_all(
            lambda: Job.objects.filter(id__in=job_ids, state="completed").count() == len(job_ids),
            timeout=180,
        )
    finally:
        worker.stop()
        beat.stop()
        use_broker(original)
    duplicates, lost, details = duplicates_and_lost(devcluster, job_ids)
    row = fault_report.row("Redis killed and restarted empty")
    row.trials, row.faults_injected, row.duplicates, row.lost = len(job_ids), 1, duplicates, lost
    row.notes = (
        f"submit while down answered in {submit_took:.1f} s; pages {sorted(set(statuses.values()))}"
    )
    assert all(code == 200 for code in statuses.values()), statuses
    # Each enqueue gives up after redis-py's own connection retries (~10 s): slow, but it
    # answers 202 and the watcher re-enqueues the job once Redis is back.
    assert submit_took < 45, "a submit must not hang while Redis is down"
    assert done, [(Job.objects.get(id=i).name, Job.objects.get(id=i).state) for i in job_ids]
    assert duplicates == 0 and lost == 0, details


@pytest.mark.nodes(1)
def test_trainer_killed_mid_checkpoint(
    dev_cluster_registered: Cluster,
    celery_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
    fault_report: FaultReport,
) -> None:
    """The trainer dies after writing step 20's files but before its manifest: that partial
    checkpoint is never registered, and resuming uses the newest complete one."""
    [job_id] = submit_tiny(
        researcher_api,
        1,
        name="killed-mid-checkpoint",
        config={"preset": "tiny", "steps": 30, "checkpoint_every": 10},
        environment={"TRAINER_FAULT": "crash_before_manifest@20"},
    )
    assert wait_all(lambda: Job.objects.get(id=job_id).files_final, timeout=120)
    job = Job.objects.get(id=job_id)
    assert job.state == "failed", (job.state, job.state_reason)
    run = Path(job.checkpoints.get().path).parent
    partial = run / "step-000020"
    assert partial.is_dir() and not (partial / "manifest.json").exists()
    assert list(job.checkpoints.values_list("step", flat=True)) == [10]

    # Without the fault: a resumed job keeps its parent's environment unless told otherwise.
    response = researcher_api.post(
        f"/api/v1/jobs/{job_id}/resume/",
        {"checkpoint_step": 10, "environment": {}},
        format="json",
    )
    assert response.status_code == 202, response.json()
    resumed_id = str(response.json()["id"])
    assert wait_all(lambda: Job.objects.get(id=resumed_id).files_final, timeout=120)
    resumed = Job.objects.get(id=resumed_id)
    assert resumed.state == "completed", (resumed.state, resumed.state_reason)
    assert resumed.acceptance["resumed_step"] == 10
    assert resumed.metric_points.order_by("step").first().step == 11
    assert Checkpoint.objects.filter(job=resumed, step=30).exists()
    row = fault_report.row("trainer killed mid-checkpoint")
    row.trials, row.faults_injected = 1, 1
    row.notes = "partial step 20 never registered; resumed from step 10"
