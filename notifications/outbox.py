"""The collector: read what happened, write events, make deliveries, enqueue them.

Run by beat every ``GANTRY_NOTIFY_INTERVAL`` seconds (``notifications.collect``). One
transaction holds the cursor row locked, so two collectors never interleave: it reads each
source after ``cursor − OVERLAP`` (rows committed late fall in the overlap; their
``source_key`` keeps them one event each), writes the new events, one delivery per
(subscription, event) that wants it (``topics.subscription_wants``; a unique constraint
makes a second one impossible), moves the cursor and, after commit, enqueues a delivery task
per new delivery. It never sends anything itself and never waits on an endpoint.

It also sweeps: a delivery that is due but whose task is gone (the broker lost it, a worker
died mid-send) is enqueued again; one whose sender died with its last attempt (killed, or
past the task's hard time limit) fails instead, so no endpoint gets more attempts than
``GANTRY_NOTIFY_MAX_ATTEMPTS`` by outlasting the task. A fixed number of queries per run,
however many events.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from controlplane.tasknames import NOTIFICATION_DELIVER, task_send
from core.roles import OPERATORS, RESEARCHERS
from jobs.models import JobEvent
from nodes.models import NodeEvent
from notifications.acceptance_source import acceptance_outcomes
from notifications.models import Cursor, Delivery, Event, Subscription
from notifications.sdc_source import sdc_suspicions
from notifications.sources import (
    EventDraft,
    Window,
    breaches,
    drill_outcomes,
    health_changes,
    incidents,
    job_endings,
    newest_id,
    node_changes,
)
from notifications.topics import Audience, Subscriber, subscription_wants

CURSOR_NAME = "events"
# Longer than any transaction that writes a job, drill or node event, plus clock skew
# between the hosts that write them; and as many ids back, for ids handed out before a
# late commit (more rows than are written in that time).
OVERLAP = timedelta(minutes=5)
ID_OVERLAP = 10_000
# How long a delivery that was enqueued is left to its task before the sweep enqueues it
# again; and how many the sweep enqueues per run.
ENQUEUED_LEASE = timedelta(seconds=60)
SWEEP_LIMIT = 200


@dataclass(frozen=True)
class CollectResult:
    events: int
    deliveries: int
    swept: int


def _cursor(now: datetime) -> Cursor:
    Cursor.objects.get_or_create(name=CURSOR_NAME, defaults={"position": now})
    return Cursor.objects.select_for_update().get(name=CURSOR_NAME)


def _window(after_id: int, upto_id: int, since: datetime) -> Window:
    return Window(since=since, after_id=max(0, after_id - ID_OVERLAP), upto_id=upto_id)


def _record(drafts: list[EventDraft]) -> list[Event]:
    """The drafts not recorded before, as new events (two queries)."""
    unique: dict[str, EventDraft] = {}
    for draft in drafts:
        unique.setdefault(draft.source_key, draft)
    if not unique:
        return []
    known = set(
        Event.objects.filter(source_key__in=list(unique)).values_list("source_key", flat=True)
    )
    events = [
        Event(
            kind=draft.kind,
            source_key=draft.source_key,
            occurred_at=draft.occurred_at,
            cluster_id=draft.cluster_id,
            owner_id=draft.owner_id,
            requester_id=draft.requester_id,
            title=draft.title[:255],
            data=draft.data,
        )
        for key, draft in unique.items()
        if key not in known
    ]
    Event.objects.bulk_create(events)
    return events


def subscribers() -> list[tuple[Subscription, Subscriber]]:
    """Active subscriptions of active people with a role, with what they may receive:
    one query (the roles are subqueries)."""
    memberships = get_user_model().groups.through.objects.filter(user_id=OuterRef("user_id"))
    rows = (
        Subscription.objects.filter(removed_at__isnull=True, user__is_active=True)
        .annotate(
            in_operators=Exists(memberships.filter(group__name=OPERATORS)),
            in_researchers=Exists(memberships.filter(group__name=RESEARCHERS)),
        )
        .select_related("user")
    )
    found: list[tuple[Subscription, Subscriber]] = []
    for subscription in rows:
        operator = subscription.user.is_superuser or subscription.in_operators  # type: ignore[attr-defined]
        if not (operator or subscription.in_researchers):  # type: ignore[attr-defined]
            continue
        found.append(
            (
                subscription,
                Subscriber(
                    user_id=subscription.user_id,
                    is_operator=bool(operator),
                    topics=frozenset(subscription.topics or []),
                    cluster_id=subscription.cluster_id,
                ),
            )
        )
    return found


def audience(event: Event) -> Audience:
    return Audience(
        kind=event.kind,
        cluster_id=event.cluster_id,
        owner_id=event.owner_id,
        requester_id=event.requester_id,
        data=event.data or {},
    )


def _deliveries(events: list[Event], *, now: datetime) -> list[Delivery]:
    if not events:
        return []
    wanted = subscribers()
    deliveries = [
        Delivery(
            subscription=subscription,
            event=event,
            next_attempt_at=now,
            lease_until=now + ENQUEUED_LEASE,
        )
        for event in events
        for subscription, subscriber in wanted
        if subscription_wants(subscriber, audience(event))
    ]
    # The events are new (made under the cursor lock): nothing can conflict yet; the
    # constraint stands guard all the same.
    return Delivery.objects.bulk_create(deliveries)


def _sweep(now: datetime) -> list[int]:
    """Due deliveries without a live task: marked enqueued again and returned."""
    sender_died = Q(state=Delivery.State.SENDING, lease_until__lt=now)
    # The claim counted the attempt its sender never finished: with none left, it fails.
    Delivery.objects.filter(sender_died, attempts__gte=settings.NOTIFY_MAX_ATTEMPTS).update(
        state=Delivery.State.FAILED,
        lease_until=None,
        last_error="attempts exhausted: the last sender stopped before saving an outcome "
        "(killed, or past the deliver task's time limit)",
    )
    not_enqueued = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    stranded = (Q(state=Delivery.State.PENDING, next_attempt_at__lte=now) & not_enqueued) | (
        sender_died
    )
    ids = list(
        Delivery.objects.filter(stranded)
        .order_by("next_attempt_at", "id")
        .values_list("id", flat=True)[:SWEEP_LIMIT]
    )
    if ids:
        # A send that died mid-way may have reached the endpoint: receivers dedupe on the
        # event id. Nothing else sends twice.
        Delivery.objects.filter(id__in=ids).filter(stranded).update(
            state=Delivery.State.PENDING, lease_until=now + ENQUEUED_LEASE
        )
    return ids


def notifications_collect(*, now: datetime | None = None) -> CollectResult:
    """Beat: turn what happened since the last run into events and deliveries, and enqueue
    the deliveries after commit. Safe to run twice at once (the cursor lock serialises)
    and to re-run (events and deliveries are unique)."""
    now = now or timezone.now()
    with transaction.atomic():
        cursor = _cursor(now)
        since = min(cursor.position, now) - OVERLAP
        # The newest ids first: a row written after this is read next time.
        job_event_id, node_event_id = newest_id(JobEvent), newest_id(NodeEvent)
        drafts = [
            *job_endings(window=_window(cursor.job_event_id, job_event_id, since)),
            *drill_outcomes(since=since),
            *node_changes(window=_window(cursor.node_event_id, node_event_id, since)),
            *breaches(now=now),
            *incidents(since=since),
            *health_changes(since=since),
            *acceptance_outcomes(since=since),
            *sdc_suspicions(since=since),
        ]
        events = _record(drafts)
        deliveries = _deliveries(events, now=now)
        Cursor.objects.filter(pk=cursor.pk).update(
            position=max(now, cursor.position),
            job_event_id=max(job_event_id, cursor.job_event_id),
            node_event_id=max(node_event_id, cursor.node_event_id),
        )
        swept = _sweep(now)
        to_send = [delivery.pk for delivery in deliveries] + swept

        def enqueue() -> None:
            for delivery_id in to_send:
                if not task_send(NOTIFICATION_DELIVER, delivery_id):
                    # The broker is down: the next sweep enqueues the rest.
                    return

        transaction.on_commit(enqueue)
    return CollectResult(events=len(events), deliveries=len(deliveries), swept=len(swept))
