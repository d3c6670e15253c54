"""The operators' ``health`` topic: a node or GPU turning warning, critical or unknown, and
back, is one event per node and probe; a first verdict of "ok" is no news."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from factories import NodeFactory
from health.models import HealthEvent
from notifications.models import Event, Subscription
from notifications.outbox import notifications_collect
from notifications.topics import Topic

pytestmark = pytest.mark.django_db


def subscribe(user: Any, *topics: str) -> Subscription:
    return Subscription.objects.create(
        user=user,
        name="s",
        channel=Subscription.Channel.WEBHOOK,
        url="http://127.0.0.1:9/",
        topics=list(topics),
    )


def change(node: Any, at: Any, before: str, after: str, gpu: int | None = None) -> None:
    HealthEvent.objects.create(
        node=node, gpu_index=gpu, at=at, from_state=before, to_state=after, reason="why"
    )


def test_health_changes_reach_operators_who_asked(operator: Any, researcher: Any) -> None:
    notifications_collect()
    mine = subscribe(operator, Topic.HEALTH)
    other = subscribe(operator, Topic.NODE_DOWN)
    # A researcher may not take the operators' topic: nothing reaches them.
    theirs = subscribe(researcher, Topic.HEALTH)
    node = NodeFactory(name="n7")
    now = timezone.now()
    # The first probe: unknown → ok is no news.
    for gpu in (None, 0, 1):
        change(node, now - timedelta(seconds=30), "unknown", "ok", gpu)
    # The next probe: the node and its GPU 0 go critical: one event.
    change(node, now - timedelta(seconds=20), "ok", "critical")
    change(node, now - timedelta(seconds=20), "ok", "critical", 0)
    first = notifications_collect()

    assert first.events == 1
    event = Event.objects.get(kind="health.changed")
    assert event.title.startswith(f"node {node.cluster.name}/n7: ok → critical")
    assert {(c["gpu"], c["to_state"]) for c in event.data["changes"]} == {
        (None, "critical"),
        (0, "critical"),
    }
    assert event.data["node"]["url"] == f"/nodes/{node.pk}/"
    assert list(mine.deliveries.values_list("event__kind", flat=True)) == ["health.changed"]
    assert not other.deliveries.exists() and not theirs.deliveries.exists()
    # Read again (the windows overlap): still one event.
    assert notifications_collect().events == 0

    # Stale (unknown), then back to ok: both are news now (it had been judged before).
    change(node, now - timedelta(seconds=10), "critical", "unknown")
    change(node, now - timedelta(seconds=5), "unknown", "ok")
    assert notifications_collect().events == 2
    titles = sorted(Event.objects.filter(kind="health.changed").values_list("title", flat=True))
    assert any("critical → unknown" in t for t in titles)
    assert any("unknown → ok" in t for t in titles)
