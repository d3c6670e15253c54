"""Goodput and notifications end to end on the dev cluster, with a real Celery worker and
beat: a job killed mid-run and resumed from an earlier checkpoint shows the steps it redid
as lost progress, its buckets sum to the wall time, and a webhook receiver on 127.0.0.1
gets exactly one signed POST per event, also when it answered 500 the first time."""

from __future__ import annotations

import ipaddress
import json
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models import Sum
from rest_framework.test import APIClient

import lanes
from celery_support import (
    STACK_ENV,
    database_url_for,
    flush_test_broker,
    start_beat,
    start_worker,
    wait_until,
)
from jobs.models import Job
from notifications import signing
from notifications.models import Delivery, Event
from webhook_support import webhook_receiver

pytestmark = pytest.mark.django_db(transaction=True)

NOTIFY_ENV = {
    **STACK_ENV,
    "GANTRY_WEBHOOK_ALLOW": "127.0.0.1/32",
    "GANTRY_NOTIFY_INTERVAL": "1",
    "GANTRY_NOTIFY_RETRY_BASE": "2",
    "GANTRY_WEBHOOK_TIMEOUT": "3",
}


def finished(job_id: str) -> bool:
    job = Job.objects.get(id=job_id)
    return job.is_final and job.files_final


@pytest.mark.nodes(1)
def test_killed_and_resumed_job_ledger_and_one_signed_post_per_event(
    dev_cluster_registered: Any,
    researcher_api: APIClient,
    settings: Any,
    tmp_path: Path,
) -> None:
    settings.WEBHOOK_ALLOW = [ipaddress.ip_network("127.0.0.1/32")]
    flush_test_broker()
    url = database_url_for(connection.settings_dict)
    worker = start_worker(database_url=url, log_path=tmp_path / "worker.log", extra_env=NOTIFY_ENV)
    beat = start_beat(database_url=url, log_path=tmp_path / "beat.log", extra_env=NOTIFY_ENV)
    try:
        with webhook_receiver(script=[500]) as receiver:
            created = researcher_api.post(
                "/api/v1/notifications/subscriptions/create/",
                {"name": "it", "channel": "webhook", "url": receiver.url, "topics": ["job.ended"]},
                format="json",
            )
            assert created.status_code == 201, created.json()
            secret = created.json()["secret"]
            parent_id, child_id, resumed_step = _kill_and_resume(researcher_api, worker)
            # Two events (the parent's end, the child's): the first POST got a 500 and was
            # retried; each event ends with exactly one 2xx.
            requests = receiver.wait_for(3, timeout=120)
            wait_until(
                lambda: Delivery.objects.filter(state=Delivery.State.DELIVERED).count() == 2,
                timeout=60,
                what=lambda: f"two deliveries; worker log:\n{worker.log()[-3000:]}",
            )
            # Beat keeps collecting: nothing more may arrive.
            time.sleep(6)
            requests = list(receiver.requests)
    finally:
        worker.stop()
        beat.stop()

    _assert_lost_progress(researcher_api, parent_id, child_id, resumed_step)

    events = {str(event.id): event for event in Event.objects.filter(kind="job.ended")}
    assert {event.data["job"]["id"] for event in events.values()} == {parent_id, child_id}
    assert len(requests) == 3, [r.headers.get("X-Gantry-Event-Id") for r in requests]
    by_event: dict[str, list[Any]] = {}
    for request in requests:
        assert signing.signature_valid(secret, request.body, request.headers["X-Gantry-Signature"])
        body = json.loads(request.body)
        assert body["id"] == request.headers["X-Gantry-Event-Id"]
        assert str(body["sent_at"]) == request.headers["X-Gantry-Timestamp"]
        by_event.setdefault(body["id"], []).append(body)
    assert set(by_event) == set(events)
    first = requests[0].headers["X-Gantry-Event-Id"]
    assert [body["attempt"] for body in by_event[first]] == [1, 2]
    assert events[first].data["job"]["id"] == parent_id
    delivered = Delivery.objects.get(event_id=first)
    assert delivered.state == Delivery.State.DELIVERED and delivered.attempts == 2
    attempts = list(delivered.attempt_log.order_by("number").values_list("status_code", "ok"))
    assert attempts == [(500, False), (200, True)]


def _kill_and_resume(api: APIClient, worker: Any) -> tuple[str, str, int]:
    """A long job killed (scancel) once it has checkpoints, resumed from a checkpoint a few
    steps before where it died, run to a small total."""
    response = api.post(
        "/api/v1/jobs/submit/",
        {
            "name": "killed-mid-run",
            "partition": lanes.assigned_partition(),
            "nodes": 1,
            "gpus_per_node": 0,
            "tasks_per_node": 1,
            "time_limit_minutes": 5,
            "config": {"preset": "tiny", "steps": 100000, "checkpoint_every": 10},
        },
        format="json",
    )
    assert response.status_code == 202, response.json()
    parent_id = str(response.json()["id"])

    def far_enough() -> bool:
        job = Job.objects.get(id=parent_id)
        newest = job.checkpoints.order_by("-step").first()
        return newest is not None and newest.step >= 20 and (job.last_step or 0) >= newest.step + 5

    wait_until(
        far_enough, timeout=150, what=lambda: f"checkpoints; worker log:\n{worker.log()[-3000:]}"
    )
    assert api.post(f"/api/v1/jobs/{parent_id}/cancel/").status_code == 202
    wait_until(lambda: finished(parent_id), timeout=90, what="the killed job's files read")
    parent = Job.objects.get(id=parent_id)
    assert parent.state == Job.State.CANCELLED
    # Resume from a checkpoint before the last logged step, so some steps are redone.
    checkpoint = (
        parent.checkpoints.filter(step__lte=(parent.last_step or 0) - 3).order_by("-step").first()
    )
    assert checkpoint is not None
    response = api.post(
        f"/api/v1/jobs/{parent_id}/resume/",
        {"checkpoint_step": checkpoint.step, "steps": (parent.last_step or 0) + 5},
        format="json",
    )
    assert response.status_code == 202, response.json()
    child_id = str(response.json()["id"])
    wait_until(
        lambda: finished(child_id),
        timeout=150,
        what=lambda: f"the resumed job to end; worker log:\n{worker.log()[-3000:]}",
    )
    child = Job.objects.get(id=child_id)
    assert child.state == Job.State.COMPLETED, (child.state, child.state_reason)
    return parent_id, child_id, checkpoint.step


def _assert_lost_progress(api: APIClient, parent_id: str, child_id: str, resumed: int) -> None:
    parent = Job.objects.get(id=parent_id)
    child = Job.objects.get(id=child_id)
    redone = parent.metric_points.filter(step__gt=resumed)
    redone_steps = set(redone.values_list("step", flat=True))
    assert redone_steps, "the killed job logged nothing after the resumed checkpoint"
    # The resumed job computed those steps again.
    assert redone_steps <= set(child.metric_points.values_list("step", flat=True))
    assert child.metric_points.order_by("step").first().step == resumed + 1
    redone_seconds = redone.aggregate(total=Sum("step_time_s"))["total"]

    ledger = api.get(f"/api/v1/jobs/{child_id}/").json()["goodput"]
    assert ledger["lineage"] == [parent_id, child_id]
    buckets = ledger["buckets"]
    # Kept for a failure's message: the inputs of the killed job's ledger.
    parent_ledger = api.get(f"/api/v1/jobs/{parent_id}/").json()["goodput"]
    first_point = parent.metric_points.order_by("step").first()
    inputs = (
        f"parent {parent.started_at}..{parent.ended_at}, first step at {first_point.wall_time} "
        f"(elapsed {first_point.elapsed_s}), ledger {parent_ledger['job']}"
    )
    # Every step of the killed job is logged (log_every 1): lost progress is their time.
    assert buckets["lost_progress"] == pytest.approx(redone_seconds, rel=0.01), inputs
    assert parent_ledger["job"]["buckets"]["lost_progress"] == pytest.approx(
        redone_seconds, rel=0.01
    )
    assert ledger["job"]["buckets"]["lost_progress"] == 0
    # A plain chain: its wall time is the calendar time from submission to the last end
    # (Slurm's end in whole seconds, or the last logged step if that is later).
    assert parent.submitted_at is not None and child.ended_at is not None
    last_step_at = child.metric_points.order_by("-step").first().wall_time
    calendar = (max(child.ended_at, last_step_at) - parent.submitted_at).total_seconds()
    assert ledger["wall_s"] == pytest.approx(calendar, rel=0.01)
    assert sum(buckets.values()) == pytest.approx(ledger["wall_s"], rel=0.01)
    assert ledger["ratio"] == pytest.approx(buckets["productive"] / ledger["wall_s"], rel=1e-6)
    assert buckets["productive"] > 0 and buckets["restore"] > 0
