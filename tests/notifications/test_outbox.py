"""The collector: happenings in the apps' own tables become events once, and deliveries once
per (subscription, event), for those who may receive them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from drills.models import RestoreDrill
from factories import CheckpointFactory, ClusterFactory, JobFactory, NodeFactory, UserFactory
from jobs.models import Job, JobEvent
from nodes.models import Node, NodeEvent
from notifications.models import Cursor, Delivery, Event, Subscription
from notifications.outbox import OVERLAP, notifications_collect
from notifications.topics import Topic

pytestmark = pytest.mark.django_db


def subscribe(user: Any, *topics: str, cluster: Any = None) -> Subscription:
    return Subscription.objects.create(
        user=user,
        name="s",
        channel=Subscription.Channel.WEBHOOK,
        url="http://127.0.0.1:9/",
        topics=list(topics),
        cluster=cluster,
    )


def end(job: Job, state: str = Job.State.COMPLETED) -> None:
    Job.objects.filter(pk=job.pk).update(state=state, ended_at=timezone.now())
    JobEvent.objects.create(job=job, kind="state", from_state="running", to_state=state)


def deliveries_to(subscription: Subscription) -> list[str]:
    return list(subscription.deliveries.values_list("event__kind", flat=True))


def test_a_job_ending_reaches_its_owner_once(researcher: Any, other_researcher: Any) -> None:
    notifications_collect()  # the cursor starts now
    mine = subscribe(researcher, Topic.JOB_ENDED)
    theirs = subscribe(other_researcher, Topic.JOB_ENDED)
    job = JobFactory(owner=researcher, state=Job.State.RUNNING)
    end(job, Job.State.FAILED)

    first = notifications_collect()
    assert first.events == 1 and first.deliveries == 1
    # The next window overlaps this one: the same happening is not a second event.
    again = notifications_collect()
    assert again.events == 0 and again.deliveries == 0
    event = Event.objects.get()
    assert event.kind == "job.ended" and event.source_key == f"job:{job.id}:ended"
    assert event.data["job"]["state"] == "failed"
    assert event.data["job"]["url"] == f"/jobs/{job.id}/"
    assert deliveries_to(mine) == ["job.ended"]
    assert deliveries_to(theirs) == []


def test_late_rows_inside_the_overlap_are_caught(researcher: Any) -> None:
    subscription = subscribe(researcher, Topic.JOB_ENDED)
    now = timezone.now()
    notifications_collect(now=now)
    job = JobFactory(owner=researcher)
    end(job)
    # Written "before" the last run (a transaction that committed late).
    JobEvent.objects.filter(job=job).update(at=now - OVERLAP / 2)
    notifications_collect(now=now + timedelta(seconds=5))
    assert deliveries_to(subscription) == ["job.ended"]
    assert Cursor.objects.get().position == now + timedelta(seconds=5)


def test_drill_outcomes_for_owner_requester_and_operators(
    researcher: Any, other_researcher: Any, operator: Any
) -> None:
    notifications_collect()
    cluster = ClusterFactory(name="alpha")
    other_cluster = ClusterFactory(name="beta")
    owner_sub = subscribe(researcher, Topic.DRILL_FINISHED)
    requester_sub = subscribe(other_researcher, Topic.DRILL_FINISHED)
    operator_sub = subscribe(operator, Topic.DRILL_FAILED, cluster=cluster)
    elsewhere_sub = subscribe(operator, Topic.DRILL_FAILED, cluster=other_cluster)
    job = JobFactory(owner=researcher, cluster=cluster)
    checkpoint = CheckpointFactory(job=job, step=100)
    now = timezone.now()
    RestoreDrill.objects.create(
        checkpoint=checkpoint,
        cluster=cluster,
        requested_by=other_researcher,
        allocation_key="a",
        state=RestoreDrill.State.FINISHED,
        verdict=RestoreDrill.Verdict.FAILED,
        reason="hash mismatch",
        finished_at=now,
    )
    RestoreDrill.objects.create(
        checkpoint=checkpoint,
        cluster=cluster,
        allocation_key="b",
        state=RestoreDrill.State.FINISHED,
        verdict=RestoreDrill.Verdict.PASSED,
        finished_at=now,
    )
    result = notifications_collect()
    assert result.events == 2
    assert sorted(owner_sub.deliveries.values_list("event__data__verdict", flat=True)) == [
        "failed",
        "passed",
    ]
    # Who started the failed drill hears of it; the pass was not theirs.
    assert list(requester_sub.deliveries.values_list("event__data__verdict", flat=True)) == [
        "failed"
    ]
    assert list(operator_sub.deliveries.values_list("event__data__verdict", flat=True)) == [
        "failed"
    ]
    assert deliveries_to(elsewhere_sub) == []


def test_nodes_entering_drain_and_down_reach_operators_only(operator: Any, researcher: Any) -> None:
    notifications_collect()
    ops = subscribe(operator, Topic.NODE_DRAINED, Topic.NODE_DOWN)
    # A researcher who somehow holds operator topics (the role was taken away) gets nothing.
    demoted = subscribe(researcher, Topic.NODE_DOWN)
    node = NodeFactory(name="gpu7")
    for kind, before, after in [
        ("drain", Node.State.IDLE, Node.State.DRAINING),
        ("state", Node.State.DRAINING, Node.State.DRAINED),  # still the same drain
        ("drain", Node.State.DRAINED, Node.State.DRAINED),  # a new reason only
        ("state", Node.State.DRAINED, Node.State.DOWN),
        ("state", Node.State.DOWN, Node.State.FAIL),  # still down
        ("state", Node.State.FAIL, Node.State.IDLE),
    ]:
        NodeEvent.objects.create(node=node, kind=kind, from_state=before, to_state=after)
    notifications_collect()
    assert sorted(deliveries_to(ops)) == ["node.down", "node.drained"]
    assert deliveries_to(demoted) == []
    titles = sorted(Event.objects.values_list("title", flat=True))
    assert titles == [
        f"node {node.cluster.name}/gpu7 down (down)",
        f"node {node.cluster.name}/gpu7 drained (draining)",
    ]


def test_a_proven_age_breach_is_one_event_per_job_and_proof(operator: Any) -> None:
    notifications_collect()
    ops = subscribe(operator, Topic.PROVEN_AGE_BREACH)
    cluster = ClusterFactory(proven_checkpoint_max_age_minutes=30)
    now = timezone.now()
    job = JobFactory(cluster=cluster, state=Job.State.RUNNING, started_at=now - timedelta(hours=2))
    proven = CheckpointFactory(
        job=job, step=100, saved_at=now - timedelta(hours=1), last_proven_at=now
    )
    notifications_collect(now=now)
    notifications_collect(now=now + timedelta(seconds=10))
    assert deliveries_to(ops) == ["proven_age.breach"]
    event = Event.objects.get()
    assert event.source_key == f"breach:{job.id}:100"
    assert event.data["work_at_risk"]["since_proven"]["checkpoint_step"] == proven.step
    # A fresh proof ends the breach; when it too ages past the limit, that is a new one.
    CheckpointFactory(job=job, step=200, saved_at=now, last_proven_at=now)
    notifications_collect(now=now + timedelta(minutes=5))
    assert Event.objects.count() == 1
    notifications_collect(now=now + timedelta(minutes=45))
    assert sorted(Event.objects.values_list("source_key", flat=True)) == [
        f"breach:{job.id}:100",
        f"breach:{job.id}:200",
    ]


def test_one_delivery_per_subscription_and_event_even_with_overlapping_topics(
    operator: Any,
) -> None:
    notifications_collect()
    # Both of this subscription's topics match the same failed drill of the operator's own.
    both = subscribe(operator, Topic.DRILL_FINISHED, Topic.DRILL_FAILED)
    job = JobFactory(owner=operator)
    RestoreDrill.objects.create(
        checkpoint=CheckpointFactory(job=job),
        allocation_key="x",
        state=RestoreDrill.State.FINISHED,
        verdict=RestoreDrill.Verdict.FAILED,
        finished_at=timezone.now(),
    )
    notifications_collect()
    assert both.deliveries.count() == 1
    delivery = both.deliveries.get()
    with pytest.raises(IntegrityError), transaction.atomic():
        Delivery.objects.create(
            subscription=both, event=delivery.event, next_attempt_at=timezone.now()
        )


def test_removed_subscriptions_and_inactive_people_get_nothing(researcher: Any) -> None:
    notifications_collect()
    removed = subscribe(researcher, Topic.JOB_ENDED)
    Subscription.objects.filter(pk=removed.pk).update(removed_at=timezone.now())
    gone = UserFactory(username="gone", role="researchers", is_active=False)
    inactive = subscribe(gone, Topic.JOB_ENDED)
    end(JobFactory(owner=researcher))
    end(JobFactory(owner=gone))
    notifications_collect()
    assert Event.objects.count() == 2
    assert not Delivery.objects.filter(subscription__in=[removed, inactive]).exists()


def test_the_collector_runs_a_fixed_number_of_queries(researcher: Any, operator: Any) -> None:
    notifications_collect()
    subscribe(researcher, Topic.JOB_ENDED, Topic.DRILL_FINISHED)
    subscribe(operator, Topic.NODE_DOWN, Topic.PROVEN_AGE_BREACH)
    cluster = ClusterFactory(proven_checkpoint_max_age_minutes=1)

    def happen(count: int) -> int:
        now = timezone.now()
        for _ in range(count):
            end(JobFactory(owner=researcher, cluster=cluster))
            JobFactory(
                cluster=cluster, state=Job.State.RUNNING, started_at=now - timedelta(hours=1)
            )
            node = NodeFactory(cluster=cluster)
            NodeEvent.objects.create(node=node, kind="state", from_state="idle", to_state="down")
        with CaptureQueriesContext(connection) as queries:
            result = notifications_collect()
        assert result.events == 3 * count
        return len(queries)

    assert happen(2) == happen(8)


def test_history_before_the_first_run_is_not_replayed(researcher: Any) -> None:
    subscription = subscribe(researcher, Topic.JOB_ENDED)
    old = JobFactory(owner=researcher)
    end(old)
    JobEvent.objects.filter(job=old).update(at=timezone.now() - OVERLAP * 3)
    recent = JobFactory(owner=researcher)
    end(recent)
    notifications_collect()
    # The recent ending falls in the first window's overlap; the old one does not.
    assert list(subscription.deliveries.values_list("event__data__job__id", flat=True)) == [
        str(recent.id)
    ]


def test_a_row_with_an_id_below_the_cursor_is_still_read(researcher: Any) -> None:
    """A transaction took its id before the last run and committed after it."""
    subscription = subscribe(researcher, Topic.JOB_ENDED)
    notifications_collect()
    job = JobFactory(owner=researcher)
    end(job)
    cursor = Cursor.objects.get()
    Cursor.objects.filter(pk=cursor.pk).update(job_event_id=JobEvent.objects.get(job=job).pk + 5)
    notifications_collect()
    assert deliveries_to(subscription) == ["job.ended"]
    assert Cursor.objects.get().job_event_id >= JobEvent.objects.get(job=job).pk + 5


def test_incidents_reach_the_owner_and_held_runs_the_operators(
    researcher: Any, other_researcher: Any, operator: Any
) -> None:
    from recovery.models import Incident

    notifications_collect()
    mine = subscribe(researcher, Topic.INCIDENT)
    theirs = subscribe(other_researcher, Topic.INCIDENT)
    operators = subscribe(operator, Topic.INCIDENT_HELD)
    job = JobFactory(owner=researcher, state=Job.State.FAILED)
    now = timezone.now()
    incident = Incident.objects.create(
        job=job,
        lineage_root=job,
        cluster=job.cluster,
        signal="crash",
        stopped_at=now,
        detected_at=now,
        detail="Slurm ended it FAILED",
    )
    assert notifications_collect().events == 1
    assert deliveries_to(mine) == ["incident.opened"]
    Incident.objects.filter(pk=incident.pk).update(
        outcome="held", reason="no progress", closed_at=timezone.now()
    )
    assert notifications_collect().events == 1
    assert notifications_collect().events == 0
    assert sorted(deliveries_to(mine)) == ["incident.closed", "incident.opened"]
    assert deliveries_to(operators) == ["incident.closed"]
    assert deliveries_to(theirs) == []
    closed = Event.objects.get(kind="incident.closed")
    assert closed.data["incident"]["outcome"] == "held"
