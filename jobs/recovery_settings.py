"""A job's recovery settings: what Gantry does when the job crashes, hangs or its loss
stops being a number. Pure (no database): the submit path validates a job's overrides
here, the recovery app (``recovery``) merges them over the cluster's default policy.

Every field may be left out of a job's settings: the cluster's default applies.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from core.errors import FieldError


class OnHang:
    """What a hang leads to: recover (cancel, resume from the newest proven checkpoint),
    hold (cancel and wait for a person) or notify only (leave it running)."""

    RECOVER = "recover"
    HOLD = "hold"
    NOTIFY = "notify"
    ALL = (RECOVER, HOLD, NOTIFY)


# The most attempts a policy may allow: past that a restart loop costs more than a person.
MAX_ATTEMPTS_LIMIT = 20


@dataclass(frozen=True)
class RecoverySettings:
    enabled: bool = True
    # Recoveries of one lineage (the job and the resumes recovery made of it).
    max_attempts: int = 3
    # GPU-hours the recovery attempts of one lineage may spend; None: no budget.
    gpu_hours_budget: float | None = None
    on_hang: str = OnHang.RECOVER
    # Resume elsewhere than the nodes the evidence points at (``--exclude``).
    exclude_suspects: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_overrides(self, overrides: dict[str, Any]) -> RecoverySettings:
        """These settings with a job's validated overrides applied."""
        return replace(self, **recovery_overrides_validate(overrides))


_FIELDS = {"enabled", "max_attempts", "gpu_hours_budget", "on_hang", "exclude_suspects"}


def recovery_overrides_validate(value: Any) -> dict[str, Any]:
    """A job's recovery overrides, checked; FieldError (``recovery``) with why otherwise."""
    if value in (None, {}):
        return {}
    if not isinstance(value, dict):
        raise FieldError("recovery", "must be an object of recovery settings")
    unknown = sorted(set(value) - _FIELDS)
    if unknown:
        raise FieldError("recovery", f"unknown settings: {', '.join(map(str, unknown))}")
    checked: dict[str, Any] = {}
    for name in ("enabled", "exclude_suspects"):
        if name in value:
            if not isinstance(value[name], bool):
                raise FieldError("recovery", f"{name} must be true or false")
            checked[name] = value[name]
    if "max_attempts" in value:
        attempts = value["max_attempts"]
        if type(attempts) is not int or not 0 <= attempts <= MAX_ATTEMPTS_LIMIT:
            raise FieldError(
                "recovery", f"max_attempts must be a whole number from 0 to {MAX_ATTEMPTS_LIMIT}"
            )
        checked["max_attempts"] = attempts
    if "gpu_hours_budget" in value:
        budget = value["gpu_hours_budget"]
        if budget is not None and (
            type(budget) not in (int, float) or not math.isfinite(budget) or budget <= 0
        ):
            raise FieldError("recovery", "gpu_hours_budget must be a positive number or null")
        checked["gpu_hours_budget"] = None if budget is None else float(budget)
    if "on_hang" in value:
        if value["on_hang"] not in OnHang.ALL:
            raise FieldError("recovery", f"on_hang must be one of {', '.join(OnHang.ALL)}")
        checked["on_hang"] = value["on_hang"]
    return checked
