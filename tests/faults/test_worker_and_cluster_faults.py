"""Faults of the worker, the login node's sshd, slurmctld, and concurrent watchers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from celery_support import (
    STACK_ENV,
    database_url_for,
    flush_test_broker,
    start_beat,
    start_worker,
)
from devcluster_support import DevCluster, LoginNode
from fault_support import (
    TRIALS,
    FaultReport,
    duplicates_and_lost,
    submit_tiny,
    wait_all,
    wrong_transitions,
)
from jobs.models import Checkpoint, Job, JobEvent, MetricPoint
from jobs.services import job_submit_to_slurm
from nodes.models import Cluster
from watcher.tasks import cluster_reconcile_task

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {**STACK_ENV, "GANTRY_SUBMIT_LEASE": "5", "GANTRY_SUBMIT_REQUEUE_AFTER": "5"}


@pytest.mark.slow
@pytest.mark.nodes(2)
def test_worker_killed_mid_submit(
    dev_cluster_registered: Cluster,
    researcher_api: APIClient,
    devcluster: DevCluster,
    tmp_path: Path,
    fault_report: FaultReport,
) -> None:
    """SIGKILL at fault points inside job_submit_task (after the claim, before sbatch, and
    in the window after sbatch before the database knows): every job ends with exactly one
    Slurm job; a restarted worker and the watcher finish what the dead one started."""
    flush_test_broker()
    url = database_url_for(connection.settings_dict)
    env = {
        **FAST,
        "GANTRY_FAULTPOINTS": (
            "job_submit.after_claim:0.15,job_submit.before_sbatch:0.15,job_submit.after_sbatch:0.35"
        ),
    }
    beat = start_beat(database_url=url, log_path=tmp_path / "beat.log", extra_env=FAST)
    workers = [start_worker(database_url=url, log_path=tmp_path / "worker-0.log", extra_env=env)]
    kills = 0
    try:
        job_ids = submit_tiny(researcher_api, TRIALS, name="killed")

        def restart_dead_worker() -> None:
            nonlocal kills
            if workers[-1].process.poll() is not None:
                kills += 1
                log = tmp_path / f"worker-{len(workers)}.log"
                workers.append(start_worker(database_url=url, log_path=log, extra_env=env))

        def all_submitted() -> bool:
            pending = Job.objects.filter(id__in=job_ids, slurm_job_id="").exclude(state="failed")
            return not pending.exists()

        done = wait_all(
            all_submitted, timeout=60 + TRIALS * 8, every=0.3, on_tick=restart_dead_worker
        )
    finally:
        for worker in workers:
            worker.stop()
        beat.stop()
    duplicates, lost, details = duplicates_and_lost(devcluster, job_ids)
    row = fault_report.row("worker SIGKILL mid-submit")
    row.trials, row.faults_injected, row.duplicates, row.lost = TRIALS, kills, duplicates, lost
    row.notes = f"{len(workers)} worker starts" + ("" if done else "; timed out")
    assert done, "some jobs never reached Slurm"
    assert kills >= 1, "no fault was injected: the trial proves nothing"
    assert duplicates == 0, details
    assert lost == 0, details


@pytest.mark.nodes(2)
def test_sshd_down_during_submits_and_reconciles(
    dev_cluster_registered: Cluster,
    celery_stack: Any,
    researcher_api: APIClient,
    operator_api: APIClient,
    devcluster: DevCluster,
    fault_report: FaultReport,
    own_login_node: LoginNode,
) -> None:
    """sshd (and every SSH session) gone for a while: tasks back off, the cluster shows the
    error, nothing is marked failed; when sshd returns everything completes."""
    own_login_node.sshd_stop()
    try:
        job_ids = submit_tiny(researcher_api, 3, name="sshd-down")
        assert (
            operator_api.post(f"/api/v1/clusters/{dev_cluster_registered.pk}/sync/").status_code
            == 202
        )
        shows_error = wait_all(
            lambda: Cluster.objects.get(pk=dev_cluster_registered.pk).sync_status == "error",
            timeout=30,
        )
        error = Cluster.objects.get(pk=dev_cluster_registered.pk).last_sync_error
        time.sleep(5)
        assert not Job.objects.filter(id__in=job_ids, state__in=["failed", "lost"]).exists()
    finally:
        own_login_node.sshd_start()
    completed = wait_all(
        lambda: (
            Job.objects.filter(id__in=job_ids, state="completed", files_final=True).count()
            == len(job_ids)
        ),
        timeout=150,
    )
    wrong = wrong_transitions(job_ids)
    duplicates, lost, details = duplicates_and_lost(devcluster, job_ids)
    row = fault_report.row("sshd down (submits, reconciles)")
    row.trials, row.faults_injected, row.duplicates, row.lost, row.wrong = (
        3,
        1,
        duplicates,
        lost,
        len(wrong),
    )
    assert shows_error and "unreachable" in error.lower(), error
    assert completed, [Job.objects.get(id=i).state for i in job_ids]
    assert not wrong and not duplicates and not lost, (wrong, details)


@pytest.mark.exclusive
def test_slurmctld_restarted_while_jobs_run(
    dev_cluster_registered: Cluster,
    celery_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
    fault_report: FaultReport,
) -> None:
    """slurmctld restarts under running jobs: Gantry's view converges, no wrong change."""
    job_ids = submit_tiny(researcher_api, 2, name="ctld-restart", steps=300)
    running = wait_all(
        lambda: Job.objects.filter(id__in=job_ids, state="running").count() == 2, timeout=90
    )
    assert running
    devcluster.restart_slurmctld()
    restarted_at = time.monotonic()

    def converged() -> bool:
        return Job.objects.filter(id__in=job_ids, state="completed", files_final=True).count() == 2

    assert wait_all(converged, timeout=150)
    # Time from the controller answering again to Gantry knowing the final states: the jobs
    # themselves still had to finish, so this bounds the convergence from above.
    convergence_s = time.monotonic() - restarted_at
    wrong = wrong_transitions(job_ids)
    row = fault_report.row("slurmctld restart")
    row.trials, row.faults_injected, row.wrong = 2, 1, len(wrong)
    row.notes = f"final states known {convergence_s:.0f} s after the restart"
    assert not wrong, wrong
    for job_id in job_ids:
        assert MetricPoint.objects.filter(job_id=job_id).count() == 300


@pytest.mark.nodes(2)
def test_two_watchers_apply_each_change_once(
    dev_cluster_registered: Cluster,
    researcher_api: APIClient,
    tmp_path: Path,
    fault_report: FaultReport,
) -> None:
    """Two workers run reconcile cycles of the same cluster at the same time: every state
    change, metric point and checkpoint is applied exactly once."""
    flush_test_broker()
    url = database_url_for(connection.settings_dict)
    workers = [
        start_worker(
            database_url=url, log_path=tmp_path / f"w{n}.log", extra_env=FAST, name=f"w{n}"
        )
        for n in range(2)
    ]
    try:
        job_ids = submit_tiny(
            researcher_api,
            3,
            name="two-watchers",
            steps=40,
            config={"preset": "tiny", "steps": 40, "checkpoint_every": 10},
        )
        for job_id in job_ids:
            job_submit_to_slurm(job_id=job_id)

        def hammer() -> None:
            for _ in range(2):
                cluster_reconcile_task.delay(dev_cluster_registered.pk)

        done = wait_all(
            lambda: Job.objects.filter(id__in=job_ids, files_final=True).count() == 3,
            timeout=150,
            every=0.4,
            on_tick=hammer,
        )
    finally:
        for worker in workers:
            worker.stop()
    assert done
    doubled = []
    for job_id in job_ids:
        states = list(
            JobEvent.objects.filter(job_id=job_id, kind="state").values_list("to_state", flat=True)
        )
        if len(states) != len(set(states)):
            doubled.append(f"{job_id}: {states}")
        # Each registered checkpoint once. The trainer keeps its newest three: one it
        # rotated out before any cycle listed it was rightly never registered.
        checkpoints = JobEvent.objects.filter(job_id=job_id, kind="checkpoint").count()
        steps = set(Checkpoint.objects.filter(job_id=job_id).values_list("step", flat=True))
        if checkpoints != len(steps) or not {20, 30, 40} <= steps:
            doubled.append(f"{job_id}: {checkpoints} checkpoint events, steps {sorted(steps)}")
        if MetricPoint.objects.filter(job_id=job_id).count() != 40:
            doubled.append(f"{job_id}: metric points")
    row = fault_report.row("two concurrent watchers")
    row.trials, row.wrong = 3, len(doubled)
    assert not doubled, doubled
