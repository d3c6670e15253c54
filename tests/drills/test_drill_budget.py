"""The owner's drill budget (issue 37, item 5): drills a researcher starts run as the
verifier account, so Gantry bounds them per owner and cluster (active drills, GPUs at
once, GPU-hours a day) and keeps them to partitions the owner's own jobs ran on.

Through the API and the page, asserted on the database and the audit log; two starts
at the last slot race on PostgreSQL (threads with their own connections)."""

from __future__ import annotations

import contextlib
import itertools
import threading
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from core.audit import AuditAction
from core.errors import FieldError
from core.models import AuditEvent
from drills import budgets
from drills.budgets import drill_usage
from drills.lifecycle import DRILLS
from drills.models import DrillBudget, RestoreDrill, drill_gpu_hours
from drills.services import restore_drill_start
from factories import (
    CheckpointFactory,
    ClusterFactory,
    GpuFactory,
    JobFactory,
    NodeFactory,
    PartitionFactory,
)
from jobs.models import Checkpoint, Job, MetricPoint, StateFingerprint
from nodes.models import Cluster

STEPS = 3
# Slurm job ids of the jobs made here, unique per cluster.
SLURM_IDS = itertools.count(500)


def _cluster(name: str) -> Cluster:
    """Two partitions of two nodes, four GPUs a node."""
    cluster = ClusterFactory(name=name)
    for partition in ("batch", "gpu"):
        PartitionFactory(cluster=cluster, name=partition, max_time_minutes=120)
        for index in range(2):
            node = NodeFactory(cluster=cluster, name=f"{partition}{index}", partitions=[partition])
            for gpu in range(4):
                GpuFactory(node=node, index=gpu)
    return cluster


@pytest.fixture
def cluster(db: Any) -> Cluster:
    return _cluster("budgeted")


def _job(owner: Any, cluster: Cluster, account: str, **values: Any) -> Job:
    """A completed job of ``owner`` on batch (1 node × 2 GPUs) whose checkpoints at 100,
    200, ... a drill can judge."""
    fields: dict[str, Any] = {
        "state": Job.State.COMPLETED,
        "partition": "batch",
        "nodes": 1,
        "gpus_per_node": 2,
        "time_limit_minutes": 60,
        "last_step": 1000,
        "slurm_job_id": str(next(SLURM_IDS)),
        **values,
    }
    job = JobFactory(owner=owner, cluster=cluster, run_as=account, **fields)
    MetricPoint.objects.bulk_create(
        MetricPoint(job=job, step=step, wall_time=timezone.now(), loss=2.5)
        for step in range(1, 1001)
    )
    return job


def _checkpoint(job: Job, step: int) -> Checkpoint:
    StateFingerprint.objects.create(
        job=job, step=step, data={"tensors": {}}, tensors=0, source="event"
    )
    return CheckpointFactory(job=job, step=step)


@pytest.fixture
def job(cluster: Cluster, researcher: Any) -> Job:
    return _job(researcher, cluster, "alice")


def _hold(job: Job, *, state: str = RestoreDrill.State.RUNNING, **values: Any) -> RestoreDrill:
    """A drill of ``job``'s as Gantry would hold it (by default running, 2 GPUs, 30 min)."""
    checkpoint = _checkpoint(job, 100 * (RestoreDrill.objects.count() + 50))
    fields: dict[str, Any] = {
        "gpus": 2,
        "time_limit_minutes": 30,
        "trigger": RestoreDrill.Trigger.MANUAL,
        "slurm_job_id": "9",
        **values,
    }
    return RestoreDrill.objects.create(
        checkpoint=checkpoint,
        cluster=job.cluster,
        requested_by=job.owner,
        allocation_key=f"held-{checkpoint.step}",
        state=state,
        verdict="passed" if state == RestoreDrill.State.FINISHED else "",
        **fields,
    )


def _post(api: APIClient, checkpoint: Checkpoint, **body: Any) -> Any:
    return api.post(
        f"/api/v1/checkpoints/{checkpoint.pk}/drills/", {"steps": STEPS, **body}, format="json"
    )


def _refused(response: Any, field: str) -> str:
    assert response.status_code == 400, response.json()
    body = response.json()
    assert set(body["extra"]["fields"]) == {field}, body
    return str(body["extra"]["fields"][field][0])


def _budget(cluster: Cluster, **values: Any) -> DrillBudget:
    return DrillBudget.objects.create(cluster=cluster, **values)


# ---------------------------------------------------------------- under and over the limits


def test_a_drill_under_the_budget_is_accepted_and_counted(
    job: Job, researcher_api: APIClient
) -> None:
    response = _post(researcher_api, _checkpoint(job, 100))
    assert response.status_code == 202, response.json()
    drill = RestoreDrill.objects.get(id=response.json()["id"])
    # 1 node × 2 GPUs, the job's 60 minutes cut to a drill's 30.
    assert (drill.gpus, drill.time_limit_minutes) == (2, 30)
    usage = drill_usage(owner_id=job.owner_id, cluster=job.cluster, now=timezone.now())
    assert (usage.active_drills, usage.gpus, usage.gpu_hours_today) == (1, 2, 1.0)
    # A cluster without a budget row is still bounded, by the defaults.
    assert usage.budget.pk is None and usage.budget.max_active_drills == 3


def test_the_last_active_slot_is_taken_once_then_refused_with_the_field(
    job: Job, researcher_api: APIClient
) -> None:
    _budget(job.cluster, max_active_drills=2)
    _hold(job)
    accepted = _post(researcher_api, _checkpoint(job, 100))
    assert accepted.status_code == 202, accepted.json()
    why = _refused(_post(researcher_api, _checkpoint(job, 200)), "budget")
    assert why.startswith("2 active drills, the most for you on budgeted is 2"), why
    assert RestoreDrill.objects.filter(checkpoint__job=job).count() == 2


def test_more_gpus_at_once_than_the_budget_are_refused(job: Job, researcher_api: APIClient) -> None:
    _budget(job.cluster, max_gpus=3)
    _hold(job, gpus=2)
    checkpoint = _checkpoint(job, 100)
    why = _refused(_post(researcher_api, checkpoint), "budget")
    assert "hold 2 GPU(s) and this one asks for 2" in why and "3 at once" in why
    assert not checkpoint.drills.exists()
    # One GPU fits exactly.
    assert _post(researcher_api, checkpoint, gpus_per_node=1).status_code == 202
    # Queued and pending drills hold their GPUs too: the fourth is refused.
    RestoreDrill.objects.filter(checkpoint=checkpoint).update(state=RestoreDrill.State.PENDING)
    _refused(_post(researcher_api, _checkpoint(job, 200), gpus_per_node=1), "budget")


def test_gpu_hours_of_the_last_24_hours_are_bounded(job: Job, researcher_api: APIClient) -> None:
    _budget(job.cluster, max_gpu_hours_per_day=2.0)
    now = timezone.now()
    # Ended today after 45 minutes on 2 GPUs: 1.5 GPU-hours, not its hour's limit.
    _hold(
        job,
        state=RestoreDrill.State.FINISHED,
        time_limit_minutes=60,
        started_at=now - timedelta(minutes=50),
        finished_at=now - timedelta(minutes=5),
    )
    # Neither counts: one started over a day ago, one that ended before Slurm had it.
    old = _hold(job, state=RestoreDrill.State.FINISHED, gpus=8, time_limit_minutes=30)
    RestoreDrill.objects.filter(pk=old.pk).update(created_at=now - timedelta(hours=25))
    _hold(job, state=RestoreDrill.State.FINISHED, gpus=8, slurm_job_id="")
    checkpoint = _checkpoint(job, 100)
    # 1.5 + 2 GPUs × 30 min = 2.5 > 2.
    why = _refused(_post(researcher_api, checkpoint), "budget")
    assert "count 1.5 GPU-hours" in why and "up to 1" in why and "2 a day" in why, why
    # 1.5 + 1 GPU × 30 min = 2.0: at the limit, accepted.
    assert _post(researcher_api, checkpoint, gpus_per_node=1).status_code == 202


def test_what_one_drill_counts() -> None:
    now = timezone.now()

    def hours(
        state: str, submitted: bool, started: datetime | None, ended: datetime | None
    ) -> float:
        return drill_gpu_hours(
            state=state,
            gpus=4,
            time_limit_minutes=30,
            submitted=submitted,
            started_at=started,
            finished_at=ended,
        )

    ran = now - timedelta(minutes=15)
    finished = RestoreDrill.State.FINISHED
    # Active: its whole limit, even before Slurm has it.
    assert hours(RestoreDrill.State.QUEUED, False, None, None) == 2.0
    assert hours(finished, True, ran, now) == pytest.approx(1.0)
    # Never more than the limit (clocks), never less than zero.
    assert hours(finished, True, now - timedelta(hours=5), now) == 2.0
    assert hours(finished, True, now, now - timedelta(minutes=1)) == 0.0
    assert hours(finished, False, None, now) == 0.0
    # Slurm had it but Gantry never saw it start: it may have run its whole limit.
    assert hours(finished, True, None, now) == 2.0


# ---------------------------------------------------------------- whose drills count


def test_another_owners_drills_do_not_count_against_you(
    job: Job, researcher_api: APIClient, other_researcher: Any, researcher: Any
) -> None:
    _budget(job.cluster, max_active_drills=1, max_gpus=2, max_gpu_hours_per_day=1.0)
    theirs = _job(other_researcher, job.cluster, "bob")
    _hold(theirs)
    # Yours on another cluster count there, not here.
    elsewhere = _job(researcher, _cluster("elsewhere"), "alice")
    _hold(elsewhere)
    response = _post(researcher_api, _checkpoint(job, 100))
    assert response.status_code == 202, response.json()
    # Bob's own budget is full: his next one is refused.
    assert (
        drill_usage(owner_id=other_researcher.pk, cluster=job.cluster, now=timezone.now())
    ).active_drills == 1


def test_an_operators_drill_of_your_checkpoint_counts_as_yours(
    job: Job, operator_api: APIClient, researcher: Any
) -> None:
    _budget(job.cluster, max_active_drills=1)
    _hold(job)
    _refused(_post(operator_api, _checkpoint(job, 100)), "budget")


def test_gantrys_own_drills_neither_count_nor_are_refused(job: Job) -> None:
    _budget(job.cluster, max_active_drills=0)
    with pytest.raises(FieldError) as refused:
        restore_drill_start(actor=job.owner, checkpoint=_checkpoint(job, 100), steps=STEPS)
    assert refused.value.field == "budget"
    drill = restore_drill_start(
        actor=None,
        checkpoint=_checkpoint(job, 200),
        steps=STEPS,
        trigger=RestoreDrill.Trigger.POLICY_RUNNING,
    )
    assert drill.is_active and drill.gpus == 2
    usage = drill_usage(owner_id=job.owner_id, cluster=job.cluster, now=timezone.now())
    assert usage.active_drills == 0 and usage.gpus == 0


# ---------------------------------------------------------------- the partition


def test_a_partition_the_owners_jobs_never_ran_on_is_refused(
    job: Job, researcher_api: APIClient, other_researcher: Any
) -> None:
    checkpoint = _checkpoint(job, 100)
    why = _refused(_post(researcher_api, checkpoint, partition="gpu"), "partition")
    assert "alice" in why and "'gpu'" in why
    # Bob's job there, and one of alice's that Slurm never accepted, are no evidence.
    _job(other_researcher, job.cluster, "bob", partition="gpu")
    JobFactory(owner=job.owner, cluster=job.cluster, run_as="alice", partition="gpu")
    _refused(_post(researcher_api, checkpoint, partition="gpu"), "partition")
    assert not checkpoint.drills.exists()
    # Once Slurm ran a job of alice's there, her drills may go there too.
    JobFactory(
        owner=job.owner,
        cluster=job.cluster,
        run_as="alice",
        partition="gpu",
        slurm_job_id=str(next(SLURM_IDS)),
    )
    accepted = _post(researcher_api, checkpoint, partition="gpu")
    assert accepted.status_code == 202, accepted.json()
    assert RestoreDrill.objects.get(id=accepted.json()["id"]).allocation["partition"] == "gpu"


# ---------------------------------------------------------------- operators set it


def test_operators_change_the_budget_audited_researchers_cannot(
    cluster: Cluster, operator_api: APIClient, researcher_api: APIClient, operator: Any
) -> None:
    url = f"/api/v1/clusters/{cluster.pk}/drill-budget/"
    read = researcher_api.get(url)
    assert read.status_code == 200
    assert read.json()["max_active_drills"] == 3 and read.json()["yours"]["active_drills"] == 0
    assert researcher_api.put(url, {"max_active_drills": 50}, format="json").status_code == 403
    bad = operator_api.put(url, {"max_gpu_hours_per_day": -1}, format="json")
    assert bad.status_code == 400 and "max_gpu_hours_per_day" in bad.json()["extra"]["fields"]
    changed = operator_api.put(url, {"max_active_drills": 1, "max_gpus": 4}, format="json")
    assert changed.status_code == 200, changed.json()
    assert changed.json()["max_gpus"] == 4
    budget = DrillBudget.objects.get(cluster=cluster)
    assert (budget.max_active_drills, budget.max_gpus, budget.updated_by) == (1, 4, operator)
    event = AuditEvent.objects.get(action=AuditAction.DRILL_BUDGET_UPDATE)
    assert event.actor == operator
    assert event.details["before"]["max_active_drills"] == 3
    assert event.details["after"] == {
        "max_active_drills": 1,
        "max_gpus": 4,
        "max_gpu_hours_per_day": 32.0,
    }


def test_operators_edit_the_budget_in_the_admin_through_the_service(
    cluster: Cluster, operator: Any
) -> None:
    client = Client()
    client.force_login(operator)
    form = {"cluster": cluster.pk, "max_active_drills": 5, "max_gpus": 8}
    response = client.post(
        "/admin/drills/drillbudget/add/", {**form, "max_gpu_hours_per_day": 12.5}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    budget = DrillBudget.objects.get(cluster=cluster)
    assert (budget.max_active_drills, budget.max_gpu_hours_per_day) == (5, 12.5)
    event = AuditEvent.objects.get(action=AuditAction.DRILL_BUDGET_UPDATE)
    assert event.actor == operator and event.details["after"]["max_gpus"] == 8
    refused = client.post(
        f"/admin/drills/drillbudget/{budget.pk}/change/", {**form, "max_gpu_hours_per_day": -3}
    )
    assert refused.status_code == 200
    assert DrillBudget.objects.get(cluster=cluster).max_gpu_hours_per_day == 12.5
    assert AuditEvent.objects.filter(action=AuditAction.DRILL_BUDGET_UPDATE).count() == 1


# ---------------------------------------------------------------- the pages


def test_the_pages_show_the_budget_and_the_refusal(
    job: Job, researcher: Any, other_researcher: Any
) -> None:
    _budget(job.cluster, max_active_drills=1, max_gpus=6, max_gpu_hours_per_day=10)
    _hold(job)
    # Bob's drill is not on Rita's page.
    _hold(_job(other_researcher, job.cluster, "bob"), gpus=4)
    checkpoint = _checkpoint(job, 100)
    client = Client()
    client.force_login(researcher)
    page = client.get(f"/jobs/{job.id}/checkpoints/{checkpoint.step}/").content.decode()
    assert 'data-testid="budget-active">1 / 1<' in page
    assert 'data-testid="budget-gpus">2 / 6<' in page
    assert 'data-testid="budget-gpu-hours">1 / 10<' in page
    listing = client.get("/drills/").content.decode()
    assert "<td>1 / 1</td><td>2 / 6</td><td>1 / 10</td>" in listing
    refused = client.post(
        f"/checkpoints/{checkpoint.pk}/drill/", {"steps": STEPS, "allocation": "same"}, follow=True
    )
    assert "budget: 1 active drill, the most for you on budgeted is 1" in refused.content.decode()
    assert not checkpoint.drills.exists()


# ---------------------------------------------------------------- two at once


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="row locks are PostgreSQL's; SQLite serializes writers itself",
)
def test_two_starts_at_the_last_slot_cannot_both_pass(
    monkeypatch: pytest.MonkeyPatch, researcher: Any
) -> None:
    cluster = _cluster("raced")
    job = _job(researcher, cluster, "alice")
    _budget(cluster, max_active_drills=1)
    checkpoints = [_checkpoint(job, 100), _checkpoint(job, 200)]
    monkeypatch.setattr(DRILLS, "enqueue_submit", lambda drill_id: None)
    # Both starts count the owner's drills, then wait for each other before creating
    # theirs: without the lock both would see a free slot. With it the second blocks on
    # the owner's row, the wait times out, and it counts the first one's drill.
    meet = threading.Barrier(2, timeout=2)
    counted = budgets.drill_usage

    def count_then_meet(**kwargs: Any) -> Any:
        usage = counted(**kwargs)
        with contextlib.suppress(threading.BrokenBarrierError):
            meet.wait()
        return usage

    monkeypatch.setattr(budgets, "drill_usage", count_then_meet)
    outcomes: list[str] = []

    def start(checkpoint: Checkpoint) -> None:
        try:
            restore_drill_start(actor=researcher, checkpoint=checkpoint, steps=STEPS)
            outcomes.append("started")
        except FieldError as error:
            outcomes.append(error.field)
        finally:
            connection.close()

    threads = [threading.Thread(target=start, args=(c,)) for c in checkpoints]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["budget", "started"]
    assert RestoreDrill.objects.filter(checkpoint__job=job).count() == 1


def test_a_partition_slurm_opens_to_everyone_needs_no_job_of_the_owners_there(
    job: Job, researcher_api: APIClient
) -> None:
    from nodes.models import Partition
    from slurm.parsers import parse_partitions

    checkpoint = _checkpoint(job, 100)
    # What scontrol printed decides: restricted to some accounts, or denying some, is not
    # "everyone"; ALL for accounts and groups is.
    restricted, denying, open_ = parse_partitions(
        "PartitionName=gpu AllowGroups=ALL AllowAccounts=physics Nodes=g1\n"
        "PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL DenyAccounts=alice Nodes=g1\n"
        "PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL Nodes=g1\n"
    )
    assert not restricted.open_to_all and not denying.open_to_all and open_.open_to_all
    Partition.objects.filter(cluster=job.cluster, name="gpu").update(open_to_all=False)
    _refused(_post(researcher_api, checkpoint, partition="gpu"), "partition")
    Partition.objects.filter(cluster=job.cluster, name="gpu").update(open_to_all=True)
    accepted = _post(researcher_api, checkpoint, partition="gpu")
    assert accepted.status_code == 202, accepted.json()
