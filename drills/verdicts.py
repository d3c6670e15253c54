"""From a drill report (``drill.json``) to the stored verdict, in one place.

Pure functions: what a report means for the checkpoint. Four verdicts:

* ``passed`` — proven restorable; the only verdict that proves anything;
* ``failed`` — the checkpoint is at fault; the only verdict that blocks resuming from it;
* ``inconclusive`` — the drill could not judge (allocation, reference, trainer version);
* ``error`` — the infrastructure failed; never a verdict on the checkpoint.

Fail closed: the class comes from the reason code (``trainer.schema.verdict_for``), never
from the report's own word alone; a report that does not show the evidence its verdict
needs (the reference Gantry wrote, the steps asked for, the state compared at load and at
the step replayed to) cannot pass; an unknown code or a malformed report is an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drills.models import RestoreDrill
from trainer.schema import Reason, verdict_for

NOT_A_VERDICT = "this is not a verdict on the checkpoint"
COULD_NOT_JUDGE = "the drill could not judge the checkpoint"


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
        """Only a failure (the checkpoint is at fault) blocks resuming from it."""
        return self.verdict == RestoreDrill.Verdict.FAILED


def not_a_verdict(reason: str) -> str:
    return reason if NOT_A_VERDICT in reason else f"{reason} ({NOT_A_VERDICT})"


def could_not_judge(reason: str) -> str:
    return reason if COULD_NOT_JUDGE in reason else f"{reason} ({COULD_NOT_JUDGE})"


def verdict_of_code(reason_code: str, reason: str) -> Verdict:
    """The verdict a reason code earns, with the reason worded for its class."""
    verdict = verdict_for(reason_code)
    if verdict == RestoreDrill.Verdict.INCONCLUSIVE:
        return Verdict(verdict, could_not_judge(reason), reason_code)
    if verdict == RestoreDrill.Verdict.ERROR:
        text = not_a_verdict(reason or "the drill could not complete")
        return Verdict(verdict, text, reason_code)
    return Verdict(verdict, reason, reason_code)


def _missing_evidence(report: dict[str, Any], drill: RestoreDrill | None) -> Verdict | None:
    """Why a report that says ``passed`` does not prove it (an inconclusive verdict), or
    None."""
    if drill is None:
        return None
    problem: tuple[str, str] | None = None
    checkpoint = report.get("checkpoint") or {}
    state = report.get("state") or {}
    at_load = state.get("at_load") or {}
    at_end = state.get("at_end") or {}
    compared = report.get("steps_compared")
    if drill.reference_digest and report.get("reference_digest") != drill.reference_digest:
        problem = (
            Reason.REFERENCE_INCOMPLETE,
            "the drill compared with another reference than the one Gantry wrote",
        )
    elif checkpoint.get("step") != drill.checkpoint.step:
        problem = (
            Reason.REFERENCE_INCOMPLETE,
            f"the drill loaded step {checkpoint.get('step')}, not {drill.checkpoint.step}",
        )
    elif not isinstance(compared, int) or compared < drill.steps:
        problem = (
            Reason.STEPS_SHORT,
            f"the drill compared {compared} of the {drill.steps} steps asked for",
        )
    elif not at_load.get("compared"):
        problem = (
            Reason.REFERENCE_INCOMPLETE,
            "the drill did not compare the loaded state with Gantry's fingerprint",
        )
    elif drill.replay_to_step is not None and (
        not at_end.get("compared") or at_end.get("step") != drill.replay_to_step
    ):
        problem = (
            Reason.REFERENCE_INCOMPLETE,
            f"the drill did not compare the state at step {drill.replay_to_step} (the next "
            "checkpoint) with Gantry's fingerprint",
        )
    return None if problem is None else verdict_of_code(*problem)


def verdict_of_report(report: dict[str, Any], drill: RestoreDrill | None = None) -> Verdict:
    """The verdict a drill report earns (checked against what Gantry asked of ``drill``)."""
    if not isinstance(report, dict):
        return verdict_of_code(Reason.INFRASTRUCTURE_ERROR, "the drill report is not an object")
    code = report.get("reason_code")
    reason = str(report.get("reason") or "")
    if code is not None and not isinstance(code, str):
        return verdict_of_code(Reason.INFRASTRUCTURE_ERROR, f"malformed reason code {code!r}")
    claimed = report.get("verdict")
    earned = verdict_for(code)
    if claimed != earned:
        return verdict_of_code(
            Reason.INFRASTRUCTURE_ERROR,
            f"the drill report says {claimed!r} with reason code {code!r}, which means "
            f"{earned!r}: {reason}".rstrip(": "),
        )
    if earned in (RestoreDrill.Verdict.PASSED, RestoreDrill.Verdict.FAILED):
        # A verdict on the checkpoint must rest on what Gantry asked and wrote.
        missing = _missing_evidence(report, drill)
        if missing is not None and earned == RestoreDrill.Verdict.PASSED:
            return missing
        if (
            earned == RestoreDrill.Verdict.FAILED
            and drill is not None
            and drill.reference_digest
            and report.get("reference_digest") not in (None, drill.reference_digest)
        ):
            return verdict_of_code(
                Reason.REFERENCE_INCOMPLETE,
                f"the drill compared with another reference than the one Gantry wrote: {reason}",
            )
    return verdict_of_code(code or "", reason)


def report_timings(report: dict[str, Any]) -> dict[str, float | None]:
    """The drill's own timings, as stored on the drill row."""
    timings = report.get("timings") or {}

    def number(key: str) -> float | None:
        value = timings.get(key)
        return float(value) if isinstance(value, int | float) else None

    return {key: number(key) for key in ("integrity_s", "load_s", "steps_s")}
