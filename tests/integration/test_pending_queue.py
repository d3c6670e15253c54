"""The watcher and pending jobs on the real dev cluster: one extra remote command
(``squeue --start``) per refresh, whatever the number of pending jobs, none when the
estimates are fresh; and hold/release through Gantry as real ``scontrol`` calls."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from jobs.models import Job
from jobs.pending_queue import job_hold, job_release
from runs.lifecycle.requests import slurm_request_carry_out
from runs.models import SlurmRequest
from watcher.cycle import cluster_reconcile

pytestmark = pytest.mark.django_db(transaction=True)


def carry_out_latest(job: Job) -> str:
    """The worker's part of the job's newest request (a shared worker may have done it
    already: then this sends nothing); the request's status after it."""
    request = SlurmRequest.objects.filter(object_id=str(job.id)).latest("id")
    if request.status == "open":
        slurm_request_carry_out(request_id=request.id)
    request.refresh_from_db()
    return request.status


def held_slurm_jobs(devcluster: Any, partition: str, count: int) -> list[str]:
    """Jobs that stay pending without using anything (``--hold``), as the service user."""
    return [
        devcluster.run_as_cluster_user(
            [
                "sbatch",
                "--parsable",
                "--hold",
                f"--partition={partition}",
                "--time=5",
                f"--job-name=gantry-test-pending-{index}",
                "--wrap",
                "true",
            ]
        ).stdout.strip()
        for index in range(count)
    ]


def pending_rows(cluster: Any, owner: Any, slurm_ids: list[str], partition: str) -> list[Job]:
    now = timezone.now()
    return [
        Job.objects.create(
            owner=owner,
            cluster=cluster,
            name=f"pending-{slurm_id}",
            partition=partition,
            state=Job.State.PENDING,
            slurm_job_id=slurm_id,
            submitted_at=now,
            config={"preset": "tiny"},
        )
        for slurm_id in slurm_ids
    ]


@pytest.mark.nodes(0)
def test_one_squeue_start_per_refresh_whatever_the_number_of_jobs(
    dev_cluster_registered: Any, devcluster: Any, researcher: Any, settings: Any
) -> None:
    cluster = dev_cluster_registered
    partition = cluster.default_partition
    settings.PENDING_REFRESH_SECONDS = 3600
    ids = held_slurm_jobs(devcluster, partition, 6)
    try:
        jobs = pending_rows(cluster, researcher, ids[:1], partition)
        with_refresh = cluster_reconcile(cluster_id=cluster.pk)
        fresh = cluster_reconcile(cluster_id=cluster.pk)
        assert not with_refresh.errors and not fresh.errors, (with_refresh.errors, fresh.errors)
        # The refresh is one command on top of the cycle's own; fresh estimates cost none.
        assert with_refresh.commands == fresh.commands + 1, (with_refresh, fresh)
        job = Job.objects.get(pk=jobs[0].pk)
        assert job.pending_checked_at is not None
        assert job.queue_position is not None and job.queue_length is not None
        assert job.state_reason.startswith("JobHeld")

        # Five more pending jobs: still one squeue --start for all of them.
        more = pending_rows(cluster, researcher, ids[1:], partition)
        Job.objects.filter(pk=jobs[0].pk).update(pending_checked_at=None)
        six = cluster_reconcile(cluster_id=cluster.pk)
        assert six.commands == with_refresh.commands, (six, with_refresh)
        places = sorted(
            Job.objects.filter(pk__in=[j.pk for j in [*jobs, *more]]).values_list(
                "queue_position", flat=True
            )
        )
        # Held jobs all have priority 0: places 1..6 among (at least) these six.
        assert places == sorted(set(places)) and len(places) == 6 and None not in places
    finally:
        devcluster.slurm(["scancel", *ids], check=False)


@pytest.mark.nodes(0)
def test_hold_and_release_reach_slurm(
    dev_cluster_registered: Any, devcluster: Any, operator: Any
) -> None:
    cluster = dev_cluster_registered
    partition = cluster.default_partition
    # A job waiting for its start time, as the service account (run_as "").
    slurm_id = devcluster.run_as_cluster_user(
        [
            "sbatch",
            "--parsable",
            "--begin=now+1hour",
            f"--partition={partition}",
            "--time=5",
            "--job-name=gantry-test-hold",
            "--wrap",
            "true",
        ]
    ).stdout.strip()
    try:
        (job,) = pending_rows(cluster, operator, [slurm_id], partition)

        def reason() -> str:
            return devcluster.slurm(["squeue", "-h", "-j", slurm_id, "-o", "%r"]).stdout.strip()

        # The request records; the worker's part (run here, as the worker would) sends
        # the real scontrol as the job's account.
        assert job_hold(actor=operator, job=job) == "hold requested"
        assert carry_out_latest(job) == "done"
        assert reason().startswith("JobHeld")
        assert devcluster.slurm(["squeue", "-h", "-j", slurm_id, "-o", "%Q"]).stdout.strip() == "0"
        assert job_release(actor=operator, job=job) == "release requested"
        assert carry_out_latest(job) == "done"
        assert not reason().startswith("JobHeld")
    finally:
        devcluster.slurm(["scancel", slurm_id], check=False)
