"""What one can subscribe to (topics), what happens (event kinds), and who gets what.

A user's own topics: their jobs ending, their restore drills finishing (drills of their jobs
or that they started). Operators' topics: cluster events (a node drained or down, any
drill failing, a running job's proven checkpoint older than its cluster allows, a node's or
a GPU's health changing, a node suspected of silent data corruption), optionally for one
cluster. One event reaches one subscription at most once, whichever of its topics match:
``subscription_wants`` is the one rule, used when deliveries are made and again right before
one is sent (a person who lost the operator role gets nothing more).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import models


class Topic(models.TextChoices):
    JOB_ENDED = "job.ended", "my jobs end (completed, failed, cancelled, timed out, lost)"
    DRILL_FINISHED = "drill.finished", "my restore drills finish (any verdict)"
    NODE_DRAINED = "node.drained", "a node is drained (operators)"
    NODE_DOWN = "node.down", "a node goes down or fails (operators)"
    DRILL_FAILED = "drill.failed", "any restore drill fails (operators)"
    PROVEN_AGE_BREACH = (
        "proven_age.breach",
        "a running job's newest proven checkpoint is older than its cluster allows (operators)",
    )
    INCIDENT = (
        "incident",
        "my jobs crash, hang or diverge, and how recovery ends (recovered, held)",
    )
    INCIDENT_HELD = "incident.held", "recovery holds a run for a person (operators)"
    HEALTH = (
        "health",
        "a node or GPU turns warning, critical or unknown, and back (operators)",
    )
    ACCEPTANCE = (
        "acceptance",
        "acceptance runs end (passed, failed, inconclusive) and convict nodes (operators)",
    )
    SILENT_DATA_CORRUPTION = (
        "suspect.sdc",
        "a node is suspected of silent data corruption by a pair of restore drills (operators)",
    )


OPERATOR_TOPICS = frozenset(
    {
        Topic.NODE_DRAINED,
        Topic.NODE_DOWN,
        Topic.DRILL_FAILED,
        Topic.PROVEN_AGE_BREACH,
        Topic.INCIDENT_HELD,
        Topic.HEALTH,
        Topic.ACCEPTANCE,
        Topic.SILENT_DATA_CORRUPTION,
    }
)


class EventKind(models.TextChoices):
    JOB_ENDED = "job.ended"
    DRILL_FINISHED = "drill.finished"
    NODE_DRAINED = "node.drained"
    NODE_DOWN = "node.down"
    PROVEN_AGE_BREACH = "proven_age.breach"
    INCIDENT_OPENED = "incident.opened"
    INCIDENT_CLOSED = "incident.closed"
    # A step of an incident passed its deadline: it moved on (older checkpoint, or held).
    INCIDENT_DEADLINE = "incident.deadline"
    HEALTH_CHANGED = "health.changed"
    ACCEPTANCE_ENDED = "acceptance.ended"
    ACCEPTANCE_CONVICTED = "acceptance.convicted"
    SUSPECT_SDC = "suspect.sdc"


@dataclass(frozen=True)
class Audience:
    """Who the event is about: the owner of the job, who started the drill, which cluster."""

    kind: str
    cluster_id: int | None
    owner_id: int | None
    requester_id: int | None
    data: dict[str, Any]


@dataclass(frozen=True)
class Subscriber:
    user_id: int
    is_operator: bool
    topics: frozenset[str]
    cluster_id: int | None


# The operators' topic that each cluster event kind answers to.
_OPERATOR_TOPIC_OF_KIND: dict[str, str] = {
    EventKind.NODE_DRAINED.value: Topic.NODE_DRAINED.value,
    EventKind.NODE_DOWN.value: Topic.NODE_DOWN.value,
    EventKind.PROVEN_AGE_BREACH.value: Topic.PROVEN_AGE_BREACH.value,
    EventKind.HEALTH_CHANGED.value: Topic.HEALTH.value,
    EventKind.ACCEPTANCE_ENDED.value: Topic.ACCEPTANCE.value,
    EventKind.ACCEPTANCE_CONVICTED.value: Topic.ACCEPTANCE.value,
    EventKind.SUSPECT_SDC.value: Topic.SILENT_DATA_CORRUPTION.value,
}


def subscription_wants(subscriber: Subscriber, event: Audience) -> bool:
    """Whether this event goes to this subscription (at most once, whatever matches)."""
    mine = subscriber.user_id in (event.owner_id, event.requester_id)
    if event.kind == EventKind.JOB_ENDED:
        return Topic.JOB_ENDED in subscriber.topics and subscriber.user_id == event.owner_id
    if (
        event.kind
        in (EventKind.INCIDENT_OPENED, EventKind.INCIDENT_CLOSED, EventKind.INCIDENT_DEADLINE)
        and Topic.INCIDENT in subscriber.topics
        and subscriber.user_id == event.owner_id
    ):
        return True
    if (
        event.kind == EventKind.DRILL_FINISHED
        and Topic.DRILL_FINISHED in subscriber.topics
        and mine
    ):
        return True
    if not subscriber.is_operator:
        return False
    if subscriber.cluster_id is not None and subscriber.cluster_id != event.cluster_id:
        return False
    if event.kind == EventKind.DRILL_FINISHED:
        return Topic.DRILL_FAILED in subscriber.topics and event.data.get("verdict") == "failed"
    if event.kind == EventKind.INCIDENT_CLOSED:
        return Topic.INCIDENT_HELD in subscriber.topics and event.data.get("outcome") == "held"
    if event.kind == EventKind.INCIDENT_DEADLINE:
        # A step that ran out of time is what operators asked to hear of held incidents for.
        return Topic.INCIDENT_HELD in subscriber.topics
    operator_topic = _OPERATOR_TOPIC_OF_KIND.get(str(event.kind))
    return operator_topic is not None and operator_topic in subscriber.topics
