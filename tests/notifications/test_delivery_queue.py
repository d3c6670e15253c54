"""Deliveries have a Celery queue of their own: a slow endpoint holds only the workers that
consume it, never those that submit jobs and run the watcher."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.utils import timezone

from celery_support import ROOT, database_url_for, flush_test_broker, start_worker, wait_until
from controlplane import tasknames
from controlplane.celery import app
from factories import JobFactory
from jobs.models import Job, JobEvent
from notifications.models import Delivery
from notifications.outbox import notifications_collect
from notifications.services import subscription_create
from notifications.topics import Topic
from webhook_support import webhook_receiver


def _queue_of(task_name: str) -> Any:
    return app.amqp.router.route({}, task_name, (1,), {})["queue"]


def test_deliveries_are_routed_to_the_notifications_queue() -> None:
    queue = _queue_of(tasknames.NOTIFICATION_DELIVER)
    assert queue.name == settings.NOTIFICATIONS_QUEUE == "notifications"
    assert queue.routing_key == "notifications"
    # Everything else stays on the default queue, bound under another routing key (one
    # routing key for both would copy each message into both queues).
    for name in (
        tasknames.JOB_SUBMIT,
        tasknames.DRILL_SUBMIT,
        tasknames.CLUSTER_RECONCILE,
        tasknames.CLUSTERS_RECONCILE_DUE,
        tasknames.NOTIFICATIONS_COLLECT,
    ):
        other = _queue_of(name)
        assert other.name == "celery" and other.routing_key == "celery", name
    # A worker started without --queues consumes all of them.
    assert set(app.amqp.queues) == {"celery", "notifications", "signer"}


def test_make_run_starts_a_worker_that_consumes_the_notifications_queue() -> None:
    # The commands as the shell reads them: continuation lines joined.
    script = (ROOT / "scripts" / "run").read_text().replace("\\\n", " ")
    [worker] = [line for line in script.splitlines() if "-m celery" in line and " worker " in line]
    queues = re.search(r"(?:-Q|--queues)[= ](\S+)", worker)
    # No --queues: every queue in CELERY_TASK_QUEUES (asserted above).
    assert queues is None or "notifications" in queues.group(1).split(","), worker


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_delivery_goes_through_the_notifications_queue_to_its_worker(
    researcher: Any, settings: Any, tmp_path: Path, request: Any
) -> None:
    """Through the real Redis: the task lands in the notifications queue (the default
    queue stays empty), and a worker consuming only that queue sends it."""
    settings.WEBHOOK_ALLOW = [ipaddress.ip_network("127.0.0.1/32")]
    flush_test_broker()
    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"]
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    request.addfinalizer(broker.close)
    with webhook_receiver() as receiver:
        notifications_collect()
        subscription, _ = subscription_create(
            user=researcher, name="q", channel="webhook", url=receiver.url, topics=[Topic.JOB_ENDED]
        )
        job = JobFactory(owner=researcher, state=Job.State.COMPLETED, ended_at=timezone.now())
        JobEvent.objects.create(job=job, kind="state", from_state="running", to_state="completed")
        # The collector enqueues the new delivery on commit.
        assert notifications_collect().deliveries == 1
        assert broker.llen(f"{prefix}notifications") == 1
        assert broker.llen(f"{prefix}celery") == 0

        worker = start_worker(
            database_url=database_url_for(connection.settings_dict),
            log_path=tmp_path / "worker.log",
            extra_env={"GANTRY_WEBHOOK_ALLOW": "127.0.0.1/32"},
            name="notify",
            queues=[settings.NOTIFICATIONS_QUEUE],
        )
        request.addfinalizer(worker.stop)
        receiver.wait_for(1, timeout=60)
        wait_until(
            lambda: subscription.deliveries.filter(state=Delivery.State.DELIVERED).exists(),
            timeout=30,
            what=lambda: f"the delivery sent; worker log:\n{worker.log()[-3000:]}",
        )
    assert "notifications.deliver" in worker.log()
