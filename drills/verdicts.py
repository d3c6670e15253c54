"""From a drill report (``drill.json``) to the stored verdict, in one place.

Pure functions: what a report means for the checkpoint. Four verdicts:

* ``passed`` — proven restorable; the only verdict that proves anything;
* ``failed`` — the checkpoint is at fault; the only verdict that blocks resuming from it;
* ``inconclusive`` — the drill could not judge (allocation, reference, trainer version);
* ``error`` — the infrastructure failed; never a verdict on the checkpoint.

Fail closed: the class comes from the reason code (``trainer.schema.verdict_for``), never
from the report's own word alone; a report that does not show the evidence its verdict
needs (the reference Gantry wrote, the steps asked for, the state compared at load and at
the step replayed to) cannot pass; a pass that its own evidence contradicts (a divergence,
a step not ok, state problems, fewer steps shown than counted) is an error, since the
report cannot be trusted either way; an unknown code or a malformed report is an error.
A pass, or a drill that could not judge, that shows another checkpoint than the one Gantry
registered (another step or manifest digest, against the reference Gantry wrote for it)
fails: ``not_as_registered``.
Nothing here raises on a report, whatever its shape: a report that raised would never get
a verdict, and the reconcile cycle would retry it for ever.
"""

from __future__ import annotations

import math
import re
import reprlib
from dataclasses import dataclass
from typing import Any, TypeGuard

from drills.models import RestoreDrill
from jobs.models import Checkpoint
from trainer.schema import Reason, verdict_for

NOT_A_VERDICT = "this is not a verdict on the checkpoint"
COULD_NOT_JUDGE = "the drill could not judge the checkpoint"
TIMING_KEYS = ("integrity_s", "load_s", "steps_s")
# A real report nests five levels deep; stored evidence is cut below this many, so that
# walking a hostile report cannot exhaust the stack.
EVIDENCE_DEPTH = 32
EVIDENCE_CUT = "(nested too deep to store)"
# PostgreSQL's text and jsonb hold neither NUL nor a lone surrogate, and json.loads reads
# both from \u escapes: each becomes U+FFFD, the replacement character.
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")

# How a reason quotes a value from the report: short and shallow, whatever the report holds.
_quote = reprlib.Repr()
_quote.maxlevel, _quote.maxdict, _quote.maxlist = 3, 8, 8
_quote.maxstring, _quote.maxlong, _quote.maxother = 200, 60, 100


@dataclass(frozen=True)
class Judgement:
    """A verdict (one of ``trainer.schema.Verdict``, the same names as
    ``RestoreDrill.Verdict``) with the reason in words and its reason code."""

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


def storable_text(text: str) -> str:
    """``text`` as PostgreSQL can store it (no NUL, no lone surrogate)."""
    return _UNSTORABLE.sub("\ufffd", text)


def verdict_of_code(reason_code: str, reason: str) -> Judgement:
    """The verdict a reason code earns, with the reason worded for its class."""
    verdict = verdict_for(reason_code)
    reason, reason_code = storable_text(reason), storable_text(reason_code)
    if verdict == RestoreDrill.Verdict.INCONCLUSIVE:
        return Judgement(verdict, could_not_judge(reason), reason_code)
    if verdict == RestoreDrill.Verdict.ERROR:
        text = not_a_verdict(reason or "the drill could not complete")
        return Judgement(verdict, text, reason_code)
    return Judgement(verdict, reason, reason_code)


def _object(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one: evidence of another type is
    no evidence."""
    return value if isinstance(value, dict) else {}


def _is_int(value: Any) -> TypeGuard[int]:
    """A JSON integer: ``true`` is an int in Python, not a count or a step in a report."""
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    """A value from the report as a reason quotes it: text as written, else a short repr."""
    return value[:200] if isinstance(value, str) else _quote.repr(value)


def registration_mismatch(checkpoint: Checkpoint, shown: Any) -> str | None:
    """Why ``shown`` (a drill report's ``checkpoint``, or a ``verify --json`` report) is of
    another checkpoint than the one Gantry registered as ``checkpoint``: another step, or
    another manifest digest. None when it is the registered one, or does not say (a step
    that is no integer, no digest: what that proves is judged elsewhere)."""
    step = _object(shown).get("step")
    digest = _object(shown).get("manifest_digest")
    registered = checkpoint.manifest_digest
    if _is_int(step) and step != checkpoint.step:
        return (
            f"the checkpoint directory holds step {step}, not step {checkpoint.step} as "
            "Gantry registered it"
        )
    if registered and isinstance(digest, str) and digest != registered:
        return (
            f"the checkpoint directory's manifest (digest {_shown(digest)[:16]}...) is not the "
            f"one Gantry registered at step {checkpoint.step} ({registered[:16]}...)"
        )
    return None


def _missing_evidence(report: dict[str, Any], drill: RestoreDrill) -> Judgement | None:
    """Why a report that says ``passed`` does not prove what Gantry asked of ``drill`` (an
    inconclusive verdict; a failure where, against Gantry's reference, it shows another
    checkpoint than the registered one), or None."""
    problem: tuple[str, str] | None = None
    loaded = _object(report.get("checkpoint")).get("step")
    state = _object(report.get("state"))
    at_load = _object(state.get("at_load"))
    at_end = _object(state.get("at_end"))
    compared = report.get("steps_compared")
    swapped = registration_mismatch(drill.checkpoint, report.get("checkpoint"))
    if drill.reference_digest and report.get("reference_digest") != drill.reference_digest:
        problem = (
            Reason.REFERENCE_INCOMPLETE,
            "the drill compared with another reference than the one Gantry wrote",
        )
    elif swapped and drill.reference_digest:
        # Asked about this checkpoint (Gantry's reference), it found another in its place.
        problem = (Reason.NOT_AS_REGISTERED, swapped)
    elif not _is_int(loaded) or loaded != drill.checkpoint.step:
        problem = (
            Reason.REFERENCE_INCOMPLETE,
            f"the drill loaded step {_shown(loaded)}, not {drill.checkpoint.step}",
        )
    elif swapped:
        # Without Gantry's reference to tie the report to this drill: it proves nothing.
        problem = (Reason.REFERENCE_INCOMPLETE, swapped)
    elif not _is_int(compared) or compared < drill.steps:
        problem = (
            Reason.STEPS_SHORT,
            f"the drill compared {_shown(compared)} of the {drill.steps} steps asked for",
        )
    elif at_load.get("compared") is not True:
        problem = (
            Reason.REFERENCE_INCOMPLETE,
            "the drill did not compare the loaded state with Gantry's fingerprint",
        )
    elif drill.replay_to_step is not None and (
        at_end.get("compared") is not True
        or not _is_int(at_end.get("step"))
        or at_end.get("step") != drill.replay_to_step
    ):
        problem = (
            Reason.REFERENCE_INCOMPLETE,
            f"the drill did not compare the state at step {drill.replay_to_step} (the next "
            "checkpoint) with Gantry's fingerprint",
        )
    return None if problem is None else verdict_of_code(*problem)


def _contradiction(report: dict[str, Any]) -> str | None:
    """What in a passed report's own evidence says it did not pass, or None. The trainer
    ends a drill at the first divergence or state problem, so none of these is in a pass."""
    loaded = _object(report.get("checkpoint")).get("step")
    compared = report.get("steps_compared")
    entries = report.get("steps")
    state = _object(report.get("state"))
    divergence = report.get("first_divergence")
    if divergence is not None:
        at = _shown(_object(divergence).get("step"))
        return f"it shows a first divergence at step {at}: {_shown(divergence)}"
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        return f"its steps are not a list of objects: {_shown(entries)}"
    not_ok = next((entry for entry in entries if entry.get("ok") is not True), None)
    if not_ok is not None:
        return f"step {_shown(not_ok.get('step'))} is not ok: {_shown(not_ok)}"
    for where in ("at_load", "at_end"):
        compared_state = state.get(where)
        # Not compared: _missing_evidence judges whether it had to be.
        if compared_state is None:
            continue
        if not isinstance(compared_state, dict):
            return f"its state {where} is not an object: {_shown(compared_state)}"
        problems = compared_state.get("problems")
        if problems != []:
            return f"its state {where} shows problems (an empty list expected): {_shown(problems)}"
        step = compared_state.get("step")
        if where == "at_load" and (not _is_int(step) or step != loaded):
            return (
                f"it compared the loaded state of step {_shown(step)}, not of the step it "
                f"loaded ({_shown(loaded)})"
            )
    if not _is_int(loaded) or not _is_int(compared):
        return "it does not name the step it loaded and the number of steps it compared"
    shown = {entry["step"] for entry in entries if _is_int(entry.get("step"))}
    # Ends at the first step not shown, however large a count the report claims.
    unshown = next((s for s in range(loaded + 1, loaded + compared + 1) if s not in shown), None)
    if unshown is not None:
        return f"it counts {compared} steps compared but shows none of step {unshown}"
    return None


def _could_not_judge_another_checkpoint(report: dict[str, Any], drill: RestoreDrill) -> str | None:
    """Why an inconclusive report, against the reference Gantry wrote, shows another
    checkpoint than the registered one in its place, or None. A trainer that does not hold
    the directory to the registration (a version from before it: the drill runs the one
    that wrote the checkpoint) finds another step there and cannot judge it; the directory
    is still not what Gantry registered."""
    if not drill.reference_digest or report.get("reference_digest") != drill.reference_digest:
        return None
    return registration_mismatch(drill.checkpoint, report.get("checkpoint"))


def verdict_of_report(report: dict[str, Any], drill: RestoreDrill | None = None) -> Judgement:
    """The verdict a drill report earns (checked against what Gantry asked of ``drill``)."""
    if not isinstance(report, dict):
        return verdict_of_code(Reason.INFRASTRUCTURE_ERROR, "the drill report is not an object")
    code = report.get("reason_code")
    reason = report.get("reason") or ""
    reason = reason if isinstance(reason, str) else _shown(reason)
    if code is not None and not isinstance(code, str):
        return verdict_of_code(
            Reason.INFRASTRUCTURE_ERROR, f"malformed reason code {_quote.repr(code)}"
        )
    claimed = report.get("verdict")
    earned = verdict_for(code)
    if claimed != earned:
        return verdict_of_code(
            Reason.INFRASTRUCTURE_ERROR,
            f"the drill report says {_quote.repr(claimed)} with reason code "
            f"{_quote.repr(code)}, which means {earned!r}: {reason}".rstrip(": "),
        )
    if earned == RestoreDrill.Verdict.PASSED:
        # A pass must rest on what Gantry asked and wrote, and must not contradict itself.
        missing = None if drill is None else _missing_evidence(report, drill)
        if missing is not None:
            return missing
        contradiction = _contradiction(report)
        if contradiction is not None:
            return verdict_of_code(
                Reason.INFRASTRUCTURE_ERROR,
                f"the drill report says 'passed', but {contradiction}",
            )
    if earned == RestoreDrill.Verdict.INCONCLUSIVE and drill is not None:
        swapped = _could_not_judge_another_checkpoint(report, drill)
        if swapped is not None:
            return verdict_of_code(Reason.NOT_AS_REGISTERED, f"{swapped} (the drill: {reason})")
    if (
        earned == RestoreDrill.Verdict.FAILED
        and drill is not None
        and drill.reference_digest
        and report.get("reference_digest") not in (None, drill.reference_digest)
    ):
        # A failure against another reference than Gantry's says nothing of this checkpoint.
        return verdict_of_code(
            Reason.REFERENCE_INCOMPLETE,
            f"the drill compared with another reference than the one Gantry wrote: {reason}",
        )
    return verdict_of_code(code or "", reason)


def _seconds(value: Any) -> float | None:
    """A duration as stored: a finite, non-negative real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def report_timings(report: dict[str, Any]) -> dict[str, float | None]:
    """The drill's own timings, as stored on the drill row."""
    timings = _object(_object(report).get("timings"))
    return {key: _seconds(timings.get(key)) for key in TIMING_KEYS}


def report_evidence(value: Any, depth: int = EVIDENCE_DEPTH) -> Any:
    """A report as the drill row's ``evidence`` stores it: JSON that PostgreSQL's jsonb
    accepts and the API's strict JSON renders. Non-finite floats (the trainer writes a NaN
    loss as a bare ``NaN``, which json.loads reads) become the strings "NaN", "Infinity"
    and "-Infinity", the trainer's own spelling, so the evidence still shows them; text
    loses NUL and lone surrogates (``storable_text``); nesting below ``depth`` is cut."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict | list | tuple) and depth <= 0:
        return EVIDENCE_CUT
    if isinstance(value, dict):
        return {storable_text(str(k)): report_evidence(v, depth - 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [report_evidence(item, depth - 1) for item in value]
    return value
