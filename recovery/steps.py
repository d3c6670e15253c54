"""Every step of an incident has a deadline and an exit: the step list an incident keeps
(``Incident.steps``: cancel, node view, proving a checkpoint, resume), each with its start,
deadline, end and outcome, shown on the incident page and in the API.

A step is begun once (a second watcher's begin is a no-op: the first start and deadline
stand) and ended once. ``deadline_passed`` ends a step whose time ran out and stamps the
incident, so the notifications collector tells the owner and operators.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from recovery.models import Incident, RecoveryPolicy


def policy_deadlines(policy: RecoveryPolicy) -> dict[str, int]:
    """Seconds each step may take, from the cluster's policy."""
    return {
        "cancel": int(policy.cancel_deadline_seconds),
        "node view": int(policy.node_view_deadline_seconds),
        "prove": int(policy.proving_start_deadline_seconds),
    }


def _save(incident: Incident, steps: list[dict[str, Any]], **values: Any) -> None:
    Incident.objects.filter(pk=incident.pk).update(steps=steps, **values)
    incident.steps = steps
    for key, value in values.items():
        setattr(incident, key, value)


def step_of(incident: Incident, name: str) -> dict[str, Any] | None:
    """The newest step called ``name``, or None."""
    return next((s for s in reversed(incident.steps or []) if s.get("name") == name), None)


def step_begin(
    incident: Incident, name: str, *, now: datetime, seconds: int | None, detail: str = ""
) -> dict[str, Any]:
    """The open step ``name``, begun now with a deadline ``seconds`` away (None: none,
    the step ends at once)."""
    found = step_of(incident, name)
    if found is not None and not found.get("ended_at"):
        return found
    step = {
        "name": name,
        "started_at": now.isoformat(),
        "deadline_at": (now + timedelta(seconds=seconds)).isoformat() if seconds else None,
        "ended_at": None,
        "outcome": "",
        "detail": detail[:500],
    }
    _save(incident, [*(incident.steps or []), step])
    return step


def step_end(incident: Incident, name: str, *, now: datetime, outcome: str) -> None:
    """End the open step ``name`` (if any) with ``outcome`` in words."""
    steps = [dict(s) for s in incident.steps or []]
    for step in reversed(steps):
        if step.get("name") == name and not step.get("ended_at"):
            step["ended_at"], step["outcome"] = now.isoformat(), outcome[:500]
            _save(incident, steps)
            return


def past_deadline(incident: Incident, name: str, now: datetime) -> bool:
    """Whether the open step ``name`` has a deadline that passed."""
    step = step_of(incident, name)
    if step is None or step.get("ended_at") or not step.get("deadline_at"):
        return False
    return now > datetime.fromisoformat(step["deadline_at"])


def deadline_passed(incident: Incident, name: str, *, now: datetime, outcome: str) -> None:
    """End the step ``name`` whose deadline passed, and stamp the incident (people are told:
    ``notifications.sources.incidents``)."""
    step_end(incident, name, now=now, outcome=f"deadline passed: {outcome}")
    Incident.objects.filter(pk=incident.pk).update(deadline_passed_at=now)
    incident.deadline_passed_at = now
