"""Exactly once when Slurm is slow, and a watcher that survives partial failures.

Each test puts a stand-in for a login-node command in place (``DevCluster.shim``): an
sbatch that answers after Gantry's command timeout (then really submits), an sbatch whose
answer is lost (it submits, then the SSH connection drops), a sacct whose database is
down, a sacct of a cluster without accounting. Against the real dev cluster, a real
Celery worker and beat: 0 duplicate Slurm jobs, 0 lost jobs, every job reaches its true
final state.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from celery_support import database_url_for, flush_test_broker, start_beat, start_worker
from devcluster_support import DevCluster, LoginNode
from drills.models import RestoreDrill
from fault_support import (
    ACCOUNTING_DISABLED,
    LOST_ANSWER_SBATCH,
    SACCT_DOWN,
    SLOW_SBATCH,
    SUBMIT_FAULT_ENV,
    SUBMIT_TRIALS,
    FaultReport,
    duplicates_and_lost,
    slurm_jobs_by_tag,
    submit_tiny,
    unknown_outcomes,
    wait_all,
)
from jobs.models import Job, JobEvent
from nodes.models import Cluster
from slurm import commands as slurm_commands

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fault_stack(transactional_db: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    flush_test_broker()
    url = database_url_for(connection.settings_dict)
    worker = start_worker(
        database_url=url, log_path=tmp_path / "worker.log", extra_env=SUBMIT_FAULT_ENV
    )
    beat = start_beat(database_url=url, log_path=tmp_path / "beat.log", extra_env=SUBMIT_FAULT_ENV)
    yield {"worker": worker, "beat": beat}
    worker.stop()
    beat.stop()


def _all_final(job_ids: list[str], timeout: float) -> bool:
    return wait_all(
        lambda: Job.objects.filter(id__in=job_ids, files_final=True).count() == len(job_ids),
        timeout=timeout,
    )


def _states(job_ids: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job in Job.objects.filter(id__in=job_ids):
        counts[job.state] = counts.get(job.state, 0) + 1
    return counts


@pytest.mark.nodes(2)
def test_slow_sbatch_is_never_sent_twice(
    dev_cluster_registered: Cluster,
    fault_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
    fault_report: FaultReport,
    own_login_node: LoginNode,
) -> None:
    """sbatch answers only after Gantry's command timeout: the outcome is unknown, the job
    waits in submit_unknown, its Slurm job lands late and is adopted, never submitted again."""
    with own_login_node.shim("sbatch", SLOW_SBATCH):
        job_ids = submit_tiny(researcher_api, SUBMIT_TRIALS, name="slow-sbatch")
        done = _all_final(job_ids, timeout=120 + SUBMIT_TRIALS * 25)
    duplicates, lost, details = duplicates_and_lost(devcluster, job_ids)
    unknown = unknown_outcomes(Job, job_ids)
    row = fault_report.row("slow sbatch (answer after the command timeout)")
    row.trials, row.faults_injected, row.duplicates, row.lost = (
        len(job_ids),
        unknown,
        duplicates,
        lost,
    )
    states = _states(job_ids)
    row.wrong = len(job_ids) - states.get("completed", 0)
    row.notes = f"final states {states}"
    assert done, _states(job_ids)
    assert unknown >= 1, "no sbatch outcome was unknown: the trial proves nothing"
    assert duplicates == 0 and lost == 0, details
    assert states == {"completed": len(job_ids)}, details


@pytest.mark.nodes(2)
def test_lost_answer_is_adopted_not_resubmitted(
    dev_cluster_registered: Cluster,
    fault_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
    fault_report: FaultReport,
    own_login_node: LoginNode,
) -> None:
    """sbatch submits, then the SSH connection drops before its answer: the job is found by
    its tag and adopted."""
    with own_login_node.shim("sbatch", LOST_ANSWER_SBATCH):
        job_ids = submit_tiny(researcher_api, SUBMIT_TRIALS, name="lost-answer")
        done = _all_final(job_ids, timeout=90 + SUBMIT_TRIALS * 15)
    duplicates, lost, details = duplicates_and_lost(devcluster, job_ids)
    unknown = unknown_outcomes(Job, job_ids)
    states = _states(job_ids)
    row = fault_report.row("sbatch answer lost (SSH connection dropped)")
    row.trials, row.faults_injected, row.duplicates, row.lost = (
        len(job_ids),
        unknown,
        duplicates,
        lost,
    )
    row.wrong = len(job_ids) - states.get("completed", 0)
    row.notes = f"final states {states}"
    assert done, states
    assert unknown == len(job_ids), "every answer should have been lost"
    assert duplicates == 0 and lost == 0, details
    assert states == {"completed": len(job_ids)}, details


@pytest.mark.nodes(2)
def test_sacct_down_the_queue_is_still_applied(
    dev_cluster_registered: Cluster,
    fault_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
    fault_report: FaultReport,
    own_login_node: LoginNode,
) -> None:
    """The accounting database is down: squeue is still applied every cycle, the cluster
    shows the failure, jobs finish from their exit records (no job is declared lost), and
    when sacct answers again the failure clears."""
    cluster_id = dev_cluster_registered.pk
    with own_login_node.shim("sacct", SACCT_DOWN):
        job_ids = submit_tiny(researcher_api, SUBMIT_TRIALS, name="sacct-down")
        job_ids += submit_tiny(
            researcher_api,
            1,
            name="sacct-down-failing",
            config={"preset": "tiny", "steps": 4, "checkpoint_every": 2},
            environment={"TRAINER_FAULT": "crash_before_manifest@2"},
        )
        shows = wait_all(
            lambda: bool(Cluster.objects.get(pk=cluster_id).accounting_error), timeout=60
        )
        done = _all_final(job_ids, timeout=120 + SUBMIT_TRIALS * 10)
        error = Cluster.objects.get(pk=cluster_id).accounting_error
    cleared = wait_all(
        lambda: not Cluster.objects.get(pk=cluster_id).accounting_error, timeout=360, every=2
    )
    duplicates, lost, details = duplicates_and_lost(devcluster, job_ids)
    failing = Job.objects.get(id=job_ids[-1])
    states = _states(job_ids[:-1])
    row = fault_report.row("sacct down (accounting database)")
    row.trials, row.faults_injected, row.duplicates, row.lost = len(job_ids), 1, duplicates, lost
    row.wrong = (len(job_ids) - 1 - states.get("completed", 0)) + (failing.state != "failed")
    row.notes = f"finished from exit records; failing job exit code {failing.exit_code}"
    assert shows and "database" in error, error
    assert done, _states(job_ids)
    assert states == {"completed": len(job_ids) - 1}, details
    assert failing.state == "failed" and failing.exit_code not in (None, 0), failing.state_reason
    assert duplicates == 0 and lost == 0, details
    assert cleared, "the accounting error should clear once sacct answers"


@pytest.mark.nodes(2)
def test_a_cluster_without_accounting_sees_jobs_finish(
    dev_cluster_registered: Cluster,
    fault_stack: Any,
    researcher_api: APIClient,
    operator_api: APIClient,
    devcluster: DevCluster,
    fault_report: FaultReport,
    own_login_node: LoginNode,
) -> None:
    """A cluster whose sacct says accounting is disabled is supported: the probe records it,
    and jobs are resolved from squeue and the exit record their batch script writes."""
    cluster_id = dev_cluster_registered.pk
    try:
        with own_login_node.shim("sacct", ACCOUNTING_DISABLED):
            probe = operator_api.post(f"/api/v1/clusters/{cluster_id}/probe/")
            assert probe.status_code == 200, probe.json()
            assert probe.json()["accounting_available"] is False
            good = submit_tiny(researcher_api, 2, name="no-accounting")
            bad = submit_tiny(
                researcher_api,
                1,
                name="no-accounting-failing",
                config={"preset": "tiny", "steps": 4, "checkpoint_every": 2},
                environment={"TRAINER_FAULT": "crash_before_manifest@2"},
            )
            done = _all_final(good + bad, timeout=150)
    finally:
        assert operator_api.post(f"/api/v1/clusters/{cluster_id}/probe/").status_code == 200
    assert Cluster.objects.get(pk=cluster_id).accounting_available is True
    duplicates, lost, details = duplicates_and_lost(devcluster, good + bad)
    failing = Job.objects.get(id=bad[0])
    row = fault_report.row("cluster without accounting")
    row.trials, row.faults_injected, row.duplicates, row.lost = 3, 3, duplicates, lost
    row.wrong = (_states(good) != {"completed": 2}) + (failing.state != "failed")
    row.notes = f"exit codes {[Job.objects.get(id=i).exit_code for i in good + bad]}"
    assert done, _states(good + bad)
    assert _states(good) == {"completed": 2}
    assert all(Job.objects.get(id=i).exit_code == 0 for i in good)
    assert failing.state == "failed" and failing.exit_code not in (None, 0)
    assert duplicates == 0 and lost == 0, details


@pytest.mark.nodes(2)
def test_an_extra_slurm_job_with_a_taken_tag_is_cancelled(
    dev_cluster_registered: Cluster,
    fault_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
    fault_report: FaultReport,
) -> None:
    """Defence in depth: a second Slurm job carrying a tag that already has one (a late
    duplicate) is cancelled by the watcher and recorded on the job's timeline; the second
    trainer could not have started anyway (the run directory is locked)."""
    [job_id] = submit_tiny(
        researcher_api, 1, name="duplicated", config={"preset": "tiny", "steps": 3000}
    )
    assert wait_all(lambda: Job.objects.get(id=job_id).state == "running", timeout=180), (
        Job.objects.get(id=job_id).state
    )
    job = Job.objects.get(id=job_id)
    tag = slurm_commands.job_tag(job_id)
    # A late duplicate is the job's own account's sbatch landing twice.
    script = f"{job.cluster.workdir}/users/{job.run_as}/runs/{job_id}/job.sbatch"
    extra = devcluster.run_as(
        job.run_as, ["sbatch", "--parsable", f"--job-name={tag}", f"--comment={tag}", script]
    ).stdout.strip()
    cancelled = wait_all(
        lambda: JobEvent.objects.filter(job_id=job_id, kind="duplicate").exists(), timeout=60
    )

    # slurmdbd records the cancel a moment after scancel returns: read until it has.
    def extra_state_now() -> str:
        return devcluster.slurm(["sacct", "-n", "-X", "-P", "-j", extra, "-o", "State"]).stdout

    wait_all(lambda: "CANCELLED" in extra_state_now(), timeout=30)
    extra_state = extra_state_now()
    devcluster.slurm(["scancel", job.slurm_job_id], check=False)
    assert wait_all(lambda: Job.objects.get(id=job_id).files_final, timeout=60)
    row = fault_report.row("extra Slurm job with a taken tag")
    row.trials, row.faults_injected = 1, 1
    row.duplicates = 0 if cancelled else 1
    row.notes = f"extra job {extra}: {extra_state.strip()}"
    assert cancelled, slurm_jobs_by_tag(devcluster).get(tag)
    assert "CANCELLED" in extra_state
    assert Job.objects.get(id=job_id).slurm_job_id != extra


@pytest.mark.slow
@pytest.mark.nodes(2)
def test_worker_killed_inside_the_drill_submit_path(
    dev_cluster_registered: Cluster,
    researcher_api: APIClient,
    devcluster: DevCluster,
    tmp_path: Path,
    fault_report: FaultReport,
) -> None:
    """SIGKILL at the fault points of the drill submit path (after the claim, before
    sbatch, after sbatch before the database knows): every drill ends with a verdict and
    exactly one Slurm job, the same lifecycle as jobs."""
    flush_test_broker()
    url = database_url_for(connection.settings_dict)
    count = SUBMIT_TRIALS
    beat = start_beat(database_url=url, log_path=tmp_path / "beat.log", extra_env=SUBMIT_FAULT_ENV)
    plain = start_worker(
        database_url=url, log_path=tmp_path / "plain.log", extra_env=SUBMIT_FAULT_ENV
    )
    workers = []
    kills = 0
    try:
        [job_id] = submit_tiny(
            researcher_api,
            1,
            name="drilled",
            config={
                "preset": "tiny",
                "steps": 4 * (count + 1),
                "checkpoint_every": 4,
                "checkpoint_keep": count + 2,
            },
        )
        assert wait_all(lambda: Job.objects.get(id=job_id).files_final, timeout=120)
        plain.stop()
        job = Job.objects.get(id=job_id)
        assert job.state == "completed", job.state_reason
        env = {
            **SUBMIT_FAULT_ENV,
            "GANTRY_FAULTPOINTS": (
                "drill_submit.after_claim:0.2,drill_submit.before_sbatch:0.2,"
                "drill_submit.after_sbatch:0.4"
            ),
        }
        workers.append(start_worker(database_url=url, log_path=tmp_path / "w0.log", extra_env=env))
        drill_ids = []
        for checkpoint in job.checkpoints.order_by("step")[:count]:
            response = researcher_api.post(
                f"/api/v1/checkpoints/{checkpoint.pk}/drills/", {"steps": 2}, format="json"
            )
            assert response.status_code == 202, response.json()
            drill_ids.append(response.json()["id"])

        def restart_dead_worker() -> None:
            nonlocal kills
            if workers[-1].process.poll() is not None:
                kills += 1
                log = tmp_path / f"w{len(workers)}.log"
                workers.append(start_worker(database_url=url, log_path=log, extra_env=env))

        done = wait_all(
            lambda: not RestoreDrill.objects.filter(id__in=drill_ids, verdict="").exists(),
            timeout=120 + count * 20,
            every=0.3,
            on_tick=restart_dead_worker,
        )
    finally:
        for worker in workers:
            worker.stop()
        plain.stop()
        beat.stop()
    by_tag = slurm_jobs_by_tag(devcluster)
    drills = list(RestoreDrill.objects.filter(id__in=drill_ids))
    duplicates = [d.id for d in drills if len(by_tag.get(slurm_commands.job_tag(d.id), ())) > 1]
    lost = [
        d.id for d in drills if d.slurm_job_id not in by_tag.get(slurm_commands.job_tag(d.id), ())
    ]
    verdicts = sorted(d.verdict for d in drills)
    row = fault_report.row("worker SIGKILL in the drill submit path")
    row.trials, row.faults_injected = len(drills), kills
    row.duplicates, row.lost = len(duplicates), len(lost)
    row.wrong = sum(1 for d in drills if d.verdict != "passed")
    row.notes = f"verdicts {verdicts}"
    assert done, [(d.state, d.verdict) for d in drills]
    assert kills >= 1, "no fault was injected: the trial proves nothing"
    assert not duplicates and not lost, (duplicates, lost)
    assert verdicts == ["passed"] * len(drills), [(d.reason_code, d.reason) for d in drills]
