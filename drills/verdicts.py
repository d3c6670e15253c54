"""From a drill report (``drill.json``) to the stored verdict, in one place.

Pure functions: what a report means for the checkpoint. ``error`` means the drill could
not run (the infrastructure failed); it is never a verdict on the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drills.models import RestoreDrill
from trainer.schema import Reason

NOT_A_VERDICT = "this is not a verdict on the checkpoint"


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str
    reason_code: str

    @property
    def proves(self) -> bool:
        """Only a pass proves the checkpoint restorable."""
        return self.verdict == RestoreDrill.Verdict.PASSED

    @property
    def blocks_resume(self) -> bool:
        """A failure of the checkpoint's integrity blocks resuming from it."""
        return self.verdict == RestoreDrill.Verdict.FAILED and self.reason_code in Reason.INTEGRITY


def not_a_verdict(reason: str) -> str:
    return reason if NOT_A_VERDICT in reason else f"{reason} ({NOT_A_VERDICT})"


def verdict_of_report(report: dict[str, Any]) -> Verdict:
    """The verdict a drill report earns."""
    verdict = report.get("verdict")
    reason_code = str(report.get("reason_code") or "")
    reason = str(report.get("reason") or "")
    if verdict == "passed":
        return Verdict(RestoreDrill.Verdict.PASSED, reason, reason_code)
    if verdict == "failed" and reason_code != Reason.INFRASTRUCTURE_ERROR:
        return Verdict(RestoreDrill.Verdict.FAILED, reason, reason_code)
    return Verdict(
        RestoreDrill.Verdict.ERROR,
        not_a_verdict(reason or "the drill could not complete"),
        reason_code,
    )


def report_timings(report: dict[str, Any]) -> dict[str, float | None]:
    """The drill's own timings, as stored on the drill row."""
    timings = report.get("timings") or {}

    def number(key: str) -> float | None:
        value = timings.get(key)
        return float(value) if isinstance(value, int | float) else None

    return {key: number(key) for key in ("integrity_s", "load_s", "steps_s")}
