"""``drills.verdicts``: from a drill report (``drill.json``) to the stored verdict.

Fail closed: only ``passed`` proves a checkpoint, only ``failed`` blocks resuming from it,
and a report that is malformed, names an unknown code, contradicts its own code or does
not show the evidence Gantry asked for must never prove anything.

The reports below have the shape ``trainer/drill.py`` writes (``_empty_report`` filled in
by the drill's steps; the CLI's minimal report for an infrastructure error). The drills
are unsaved rows: the verdict reads only their fields, so no database is needed, except
in the one test that checks a real row.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from typing import Any

import pytest

from drills.lifecycle import DRILLS
from drills.models import RestoreDrill
from drills.verdicts import (
    COULD_NOT_JUDGE,
    EVIDENCE_CUT,
    EVIDENCE_DEPTH,
    NOT_A_VERDICT,
    Judgement,
    could_not_judge,
    not_a_verdict,
    report_evidence,
    report_timings,
    verdict_of_code,
    verdict_of_report,
)
from factories import CheckpointFactory
from jobs.models import Checkpoint
from trainer.schema import (
    DRILL_REFERENCE_SCHEMA,
    DRILL_SCHEMA,
    FINGERPRINT_FORMAT,
    Reason,
    json_digest,
)
from trainer.schema import Verdict as SchemaVerdict

PASSED = RestoreDrill.Verdict.PASSED
FAILED = RestoreDrill.Verdict.FAILED
INCONCLUSIVE = RestoreDrill.Verdict.INCONCLUSIVE
ERROR = RestoreDrill.Verdict.ERROR

CHECKPOINT_STEP = 200
STEPS = 5
NEXT_CHECKPOINT_STEP = CHECKPOINT_STEP + STEPS
JOB_ID = "6f1c2a9e-0d7b-4c53-9f43-1b2e8f3c6d10"
DATASET_SHA256 = "d" * 64


def _fingerprint(step: int) -> dict[str, Any]:
    return {
        "format": FINGERPRINT_FORMAT,
        "step": step,
        "world_size": 2,
        "tensors": {
            "model/embed.weight": {
                "shape": [256, 64],
                "dtype": "float32",
                "lhash": 123456789 + step,
                "sum": 1.25,
                "sumsq": 40.5,
            }
        },
        "scalars": "a" * 64,
        "data": {"step": step, "samples_consumed": step * 16, "global_batch": 16},
        "rng": {"0": "b" * 64, "1": "c" * 64},
    }


# The reference Gantry writes into the drill's directory (drills.reference.drill_reference).
REFERENCE = {
    "schema": DRILL_REFERENCE_SCHEMA,
    "job": JOB_ID,
    "checkpoint_step": CHECKPOINT_STEP,
    "losses": {str(step): 3.5 - step * 1e-3 for step in range(201, 206)},
    "fingerprints": {
        str(CHECKPOINT_STEP): _fingerprint(CHECKPOINT_STEP),
        str(NEXT_CHECKPOINT_STEP): _fingerprint(NEXT_CHECKPOINT_STEP),
    },
    "dataset_sha256": DATASET_SHA256,
}
REFERENCE_DIGEST = json_digest(REFERENCE)
# The reference of another drill (another job's checkpoint at the same step).
OTHER_REFERENCE_DIGEST = json_digest({**REFERENCE, "job": "another-job"})

CHECKPOINT_PATH = f"/srv/gantry/users/alice/runs/{JOB_ID}/checkpoints/step-000200"


def _state_compared(step: int, *, problems: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "step": step,
        "exact": True,
        "tolerance": 0.0,
        "compared": True,
        "tensors": 14,
        "same_world_size": True,
        "problems": problems or [],
    }


def _steps(*, diverge_at: int | None = None) -> list[dict[str, Any]]:
    entries = []
    for step in range(CHECKPOINT_STEP + 1, NEXT_CHECKPOINT_STEP + 1):
        reference = REFERENCE["losses"][str(step)]  # type: ignore[index]
        loss = reference + (0.25 if step == diverge_at else 0.0)
        difference = abs(loss - reference)
        entries.append(
            {
                "step": step,
                "loss": loss,
                "reference": reference,
                "abs_diff": difference,
                "rel_diff": difference / reference,
                "ok": step != diverge_at,
            }
        )
    return entries


def passed_report() -> dict[str, Any]:
    """A drill that went through every step: what ``trainer drill`` writes for a pass."""
    return {
        "schema": DRILL_SCHEMA,
        "verdict": "passed",
        "reason": None,
        "reason_code": None,
        "checkpoint": {
            "path": CHECKPOINT_PATH,
            "step": CHECKPOINT_STEP,
            "world_size_at_save": 2,
            "global_batch": 16,
            "created": 1767261600.5,
            "async_save": True,
            "precision": "fp32",
            "device_type": "cpu",
            "deterministic": False,
            "config_sha256": "e" * 64,
            "trainer_digest": "f" * 64,
            "strategy": "ddp",
        },
        "reference": f"/srv/gantry/users/alice/runs/{JOB_ID}/drills/x/reference.json",
        "reference_digest": REFERENCE_DIGEST,
        "allocation": {
            "world_size": 2,
            "nodes": ["n1", "n2"],
            "device": "cpu",
            "backend": "gloo",
            "strategy": "ddp",
        },
        "mode": "exact",
        "tolerance": 0.0,
        "state_tolerance": 0.0,
        "steps_requested": STEPS,
        "steps_compared": STEPS,
        "steps": _steps(),
        "first_divergence": None,
        "state": {
            "at_load": _state_compared(CHECKPOINT_STEP),
            "at_end": _state_compared(NEXT_CHECKPOINT_STEP),
        },
        "dataset": {
            "reference": DATASET_SHA256,
            "produced": DATASET_SHA256,
            "checkpoint": DATASET_SHA256,
        },
        "ranks": [
            {
                "rank": rank,
                "node": f"n{rank + 1}",
                "files_verified": 3,
                "files": ["rank-00000.pt", "rank-00000-0000.bin"],
                "ranges": [],
                "slices_checked": 0,
                "bytes": 1_048_576,
                "data_bytes": None,
                "ok": True,
                "detail": "loaded",
            }
            for rank in range(2)
        ],
        "integrity": {"ok": True, "reason": None, "reason_code": None},
        "timings": {
            "integrity_s": 0.42,
            "load_s": 1.5,
            "fingerprint_s": 0.2,
            "steps_s": 3.25,
            "per_step_s": 0.65,
            "total_s": 6.0,
        },
        "versions": {"trainer": "0.9", "torch": "2.6.0"},
        "created": 1767261700.25,
    }


def integrity_failed_report(code: str = Reason.INTEGRITY_HASH_MISMATCH) -> dict[str, Any]:
    """A drill that stopped at the integrity check: nothing loaded, nothing replayed."""
    report = passed_report()
    report.update(
        verdict="failed",
        reason_code=code,
        reason="rank-00001-0000.bin: sha256 differs from the manifest",
        checkpoint={"path": CHECKPOINT_PATH, "step": CHECKPOINT_STEP, "world_size_at_save": 2},
        mode=None,
        steps_compared=0,
        steps=[],
        state={"at_load": None, "at_end": None},
    )
    report["timings"].update(load_s=None, fingerprint_s=None, steps_s=None, per_step_s=None)
    return report


def loss_diverged_report() -> dict[str, Any]:
    report = passed_report()
    steps = _steps(diverge_at=203)
    report.update(
        verdict="failed",
        reason_code=Reason.LOSS_DIVERGED,
        reason="loss diverged at step 203: 3.547 differs from reference 3.297",
        steps=steps,
        first_divergence=dict(steps[2]),
        state={"at_load": _state_compared(CHECKPOINT_STEP), "at_end": None},
    )
    return report


def steps_short_report() -> dict[str, Any]:
    report = passed_report()
    report.update(
        verdict="inconclusive",
        reason_code=Reason.STEPS_SHORT,
        reason="the reference has 3 of the 5 steps asked for: the drill could not compare them all",
        steps_compared=3,
    )
    return report


def reference_missing_report() -> dict[str, Any]:
    """The reference could not be read: the drill stopped first, before naming a digest."""
    report = passed_report()
    for key in ("reference_digest", "integrity", "dataset"):
        del report[key]
    report.update(
        verdict="inconclusive",
        reason_code=Reason.REFERENCE_MISSING,
        reason="reference file /srv/.../reference.json does not exist",
        checkpoint={"path": CHECKPOINT_PATH},
        mode=None,
        steps_compared=0,
        steps=[],
        state={"at_load": None, "at_end": None},
    )
    return report


def infrastructure_error_report() -> dict[str, Any]:
    """What ``trainer drill`` writes when it crashed (``trainer/cli.py``)."""
    return {
        "schema": DRILL_SCHEMA,
        "verdict": "error",
        "reason_code": Reason.INFRASTRUCTURE_ERROR,
        "reason": "RuntimeError: Gloo connectFullMesh failed",
        "steps": [],
        "ranks": [],
        "first_divergence": None,
    }


def drill_of(
    *,
    step: int = CHECKPOINT_STEP,
    steps: int = STEPS,
    replay_to_step: int | None = NEXT_CHECKPOINT_STEP,
    reference_digest: str = REFERENCE_DIGEST,
) -> RestoreDrill:
    """What Gantry asked of the drill (an unsaved row: the verdict reads only fields)."""
    return RestoreDrill(
        checkpoint=Checkpoint(step=step, path=CHECKPOINT_PATH),
        steps=steps,
        replay_to_step=replay_to_step,
        reference_digest=reference_digest,
    )


def assert_error(verdict: Judgement, *, says: str = "") -> None:
    assert verdict.verdict == ERROR
    assert verdict.reason_code == Reason.INFRASTRUCTURE_ERROR
    assert not verdict.proves and not verdict.blocks_resume
    assert NOT_A_VERDICT in verdict.reason
    assert says in verdict.reason


def assert_inconclusive(verdict: Judgement, code: str, *, says: str = "") -> None:
    assert verdict.verdict == INCONCLUSIVE
    assert verdict.reason_code == code
    assert not verdict.proves and not verdict.blocks_resume
    assert COULD_NOT_JUDGE in verdict.reason
    assert says in verdict.reason


# Judgement ----------------------------------------------------------------------------


def test_the_model_and_the_trainer_name_the_verdicts_alike() -> None:
    # ``proves`` compares with the model's names, the trainer writes the schema's.
    assert {choice.value for choice in RestoreDrill.Verdict} == set(SchemaVerdict.ALL)
    assert (PASSED, FAILED, INCONCLUSIVE, ERROR) == SchemaVerdict.ALL


@pytest.mark.parametrize(
    ("verdict", "proves", "blocks_resume"),
    [
        ("passed", True, False),
        ("failed", False, True),
        ("inconclusive", False, False),
        ("error", False, False),
        ("", False, False),
        ("PASSED", False, False),
        ("unknown", False, False),
    ],
)
def test_only_a_pass_proves_and_only_a_failure_blocks_resume(
    verdict: str, proves: bool, blocks_resume: bool
) -> None:
    judged = Judgement(verdict, "why", "code")
    assert judged.proves is proves
    assert judged.blocks_resume is blocks_resume


def test_a_verdict_cannot_be_changed_after_it_is_made() -> None:
    judged = Judgement(ERROR, "why", Reason.INFRASTRUCTURE_ERROR)
    with pytest.raises(dataclasses.FrozenInstanceError):
        judged.verdict = PASSED  # type: ignore[misc]
    assert not judged.proves


# not_a_verdict, could_not_judge -----------------------------------------------------


def test_not_a_verdict_says_so_once() -> None:
    worded = not_a_verdict("Slurm lost the drill job")
    assert worded == f"Slurm lost the drill job ({NOT_A_VERDICT})"
    assert not_a_verdict(worded) == worded
    already = f"{NOT_A_VERDICT}: the node rebooted"
    assert not_a_verdict(already) == already


def test_could_not_judge_says_so_once() -> None:
    worded = could_not_judge("the reference has 3 of the 5 steps")
    assert worded == f"the reference has 3 of the 5 steps ({COULD_NOT_JUDGE})"
    assert could_not_judge(worded) == worded
    assert could_not_judge(worded).count(COULD_NOT_JUDGE) == 1


# verdict_of_code --------------------------------------------------------------------


@pytest.mark.parametrize("code", sorted(Reason.FAILED))
def test_a_failed_code_fails_with_the_reason_as_given(code: str) -> None:
    judged = verdict_of_code(code, "rank 1: model/embed.weight differs")
    assert judged == Judgement(FAILED, "rank 1: model/embed.weight differs", code)
    assert judged.blocks_resume and not judged.proves


@pytest.mark.parametrize("code", sorted(Reason.INCONCLUSIVE))
def test_an_inconclusive_code_says_the_drill_could_not_judge(code: str) -> None:
    judged = verdict_of_code(code, "the global batch 12 cannot be split over 5 ranks")
    assert judged.verdict == INCONCLUSIVE and judged.reason_code == code
    assert judged.reason.startswith("the global batch 12 cannot be split over 5 ranks")
    assert judged.reason.endswith(f"({COULD_NOT_JUDGE})")
    assert not judged.proves and not judged.blocks_resume


def test_the_infrastructure_code_is_an_error_not_a_verdict() -> None:
    judged = verdict_of_code(Reason.INFRASTRUCTURE_ERROR, "Slurm lost the drill job")
    assert judged == Judgement(
        ERROR, f"Slurm lost the drill job ({NOT_A_VERDICT})", Reason.INFRASTRUCTURE_ERROR
    )


def test_an_error_without_a_reason_still_says_what_happened() -> None:
    judged = verdict_of_code(Reason.INFRASTRUCTURE_ERROR, "")
    assert judged.reason == f"the drill could not complete ({NOT_A_VERDICT})"


@pytest.mark.parametrize(
    "code", ["no_such_code", "STATE_MISMATCH", " state_mismatch", "passed", "null", " "]
)
def test_an_unknown_code_is_an_error_that_neither_proves_nor_blocks(code: str) -> None:
    judged = verdict_of_code(code, "")
    assert judged.verdict == ERROR
    assert not judged.proves and not judged.blocks_resume
    assert NOT_A_VERDICT in judged.reason


def test_no_code_is_the_pass() -> None:
    # How verdict_of_report names a report with a null reason code.
    assert verdict_of_code("", "") == Judgement(PASSED, "", "")


# verdict_of_report: the report on its own ------------------------------------------


@pytest.mark.parametrize(
    "report",
    [None, [], [passed_report()], "passed", b"{}", 0, 1.5, math.nan, True],
    ids=["none", "empty-list", "list-of-report", "string", "bytes", "zero", "float", "nan", "true"],
)
def test_a_report_that_is_not_an_object_is_an_error(report: Any) -> None:
    assert_error(verdict_of_report(report), says="the drill report is not an object")
    assert_error(verdict_of_report(report, drill_of()), says="not an object")


def test_a_complete_passed_report_passes_without_a_drill() -> None:
    judged = verdict_of_report(passed_report())
    assert judged == Judgement(PASSED, "", "")
    assert judged.proves


@pytest.mark.parametrize("code", sorted(Reason.FAILED))
def test_a_failed_report_fails_with_its_code_and_reason(code: str) -> None:
    report = integrity_failed_report(code)
    judged = verdict_of_report(report, drill_of())
    assert judged == Judgement(FAILED, report["reason"], code)
    assert judged.blocks_resume


def test_an_inconclusive_report_stays_inconclusive() -> None:
    judged = verdict_of_report(steps_short_report(), drill_of())
    assert_inconclusive(judged, Reason.STEPS_SHORT, says="the reference has 3 of the 5 steps")


def test_an_inconclusive_report_is_not_checked_against_the_drill() -> None:
    # A drill that stopped at the reference has no digest or step to show; that is not an
    # error, and not a judgement either.
    judged = verdict_of_report(reference_missing_report(), drill_of())
    assert_inconclusive(judged, Reason.REFERENCE_MISSING, says="does not exist")


def test_the_trainers_infrastructure_error_is_an_error() -> None:
    judged = verdict_of_report(infrastructure_error_report(), drill_of())
    assert_error(judged, says="RuntimeError: Gloo connectFullMesh failed")


@pytest.mark.parametrize(
    "code",
    [0, 1, True, False, 1.5, math.nan, math.inf, [], ["state_mismatch"], {"code": "x"}],
    ids=repr,
)
@pytest.mark.parametrize("claimed", ["passed", "failed", "error"])
def test_a_reason_code_that_is_not_a_string_is_an_error(code: Any, claimed: str) -> None:
    report = {**passed_report(), "verdict": claimed, "reason_code": code}
    assert_error(verdict_of_report(report, drill_of()), says="malformed reason code")


@pytest.mark.parametrize("claimed", ["passed", "failed", "inconclusive"])
def test_an_unknown_reason_code_is_an_error_whatever_the_report_claims(claimed: str) -> None:
    report = {**integrity_failed_report(), "verdict": claimed, "reason_code": "bit_rot"}
    assert_error(verdict_of_report(report, drill_of()), says="'bit_rot'")


def test_an_unknown_reason_code_claimed_as_an_error_stays_an_error() -> None:
    report = {**infrastructure_error_report(), "reason_code": "node_on_fire"}
    judged = verdict_of_report(report, drill_of())
    assert judged.verdict == ERROR
    assert not judged.proves and not judged.blocks_resume
    assert NOT_A_VERDICT in judged.reason


@pytest.mark.parametrize(
    ("claimed", "code", "earned"),
    [
        # A pass claimed over a failure: the code decides, and the report is not trusted.
        ("passed", Reason.STATE_MISMATCH, "failed"),
        ("passed", Reason.STEPS_SHORT, "inconclusive"),
        ("passed", Reason.INFRASTRUCTURE_ERROR, "error"),
        # A failure claimed without a code: no verdict on the checkpoint either way.
        ("failed", None, "passed"),
        ("inconclusive", None, "passed"),
        ("failed", Reason.DATASET_CHANGED, "inconclusive"),
        ("inconclusive", Reason.LOSS_DIVERGED, "failed"),
        # Not a verdict at all.
        ("PASSED", None, "passed"),
        ("ok", None, "passed"),
        (None, None, "passed"),
        (True, None, "passed"),
        (["passed"], None, "passed"),
        ("", Reason.LOAD_ERROR, "failed"),
    ],
)
def test_a_claim_that_contradicts_the_code_is_an_error(
    claimed: Any, code: str | None, earned: str
) -> None:
    report = {**passed_report(), "verdict": claimed, "reason_code": code, "reason": "why"}
    judged = verdict_of_report(report, drill_of())
    assert_error(judged, says=f"says {claimed!r} with reason code {code!r}")
    assert f"which means {earned!r}: why" in judged.reason


def test_a_claim_without_a_reason_names_the_mismatch_without_a_dangling_colon() -> None:
    report = {**passed_report(), "reason_code": Reason.MISSING_STATE}
    judged = verdict_of_report(report)
    assert_error(judged)
    assert judged.reason.startswith(
        "the drill report says 'passed' with reason code 'missing_state', which means 'failed' ("
    )


@pytest.mark.parametrize("report", [{}, {"schema": DRILL_SCHEMA}, {"reason_code": None}])
def test_a_report_without_a_verdict_is_an_error(report: dict[str, Any]) -> None:
    assert_error(verdict_of_report(report, drill_of()), says="says None")
    assert_error(verdict_of_report(report), says="says None")


def test_a_reason_that_is_not_text_is_worded_not_trusted() -> None:
    report = {**loss_diverged_report(), "reason": {"step": 203}}
    judged = verdict_of_report(report, drill_of())
    assert judged == Judgement(FAILED, "{'step': 203}", Reason.LOSS_DIVERGED)


# verdict_of_report: a pass against what Gantry asked ------------------------------


def test_a_passed_report_with_all_the_evidence_passes() -> None:
    judged = verdict_of_report(passed_report(), drill_of())
    assert judged == Judgement(PASSED, "", "")
    assert judged.proves and not judged.blocks_resume


def test_a_pass_without_a_next_checkpoint_needs_no_state_at_the_end() -> None:
    # Gantry asked for K steps compared by loss only (no later fingerprint to replay to).
    report = passed_report()
    report["state"]["at_end"] = None
    assert verdict_of_report(report, drill_of(replay_to_step=None)).proves
    # The same report does not prove a drill that asked for the state at step 205.
    assert_inconclusive(
        verdict_of_report(report, drill_of()),
        Reason.REFERENCE_INCOMPLETE,
        says=f"did not compare the state at step {NEXT_CHECKPOINT_STEP}",
    )


@pytest.mark.parametrize(
    "digest",
    [OTHER_REFERENCE_DIGEST, None, "", REFERENCE_DIGEST.upper(), 0, [REFERENCE_DIGEST]],
    ids=["another-drill", "null", "empty", "upper-case", "zero", "list"],
)
def test_a_pass_against_another_reference_does_not_prove(digest: Any) -> None:
    report = {**passed_report(), "reference_digest": digest}
    assert_inconclusive(
        verdict_of_report(report, drill_of()),
        Reason.REFERENCE_INCOMPLETE,
        says="another reference than the one Gantry wrote",
    )


def test_a_pass_without_a_reference_digest_does_not_prove() -> None:
    report = passed_report()
    del report["reference_digest"]
    assert_inconclusive(
        verdict_of_report(report, drill_of()), Reason.REFERENCE_INCOMPLETE, says="another reference"
    )


def test_the_reference_is_checked_first() -> None:
    report = {**passed_report(), "reference_digest": OTHER_REFERENCE_DIGEST, "steps_compared": 0}
    report["checkpoint"]["step"] = 400
    judged = verdict_of_report(report, drill_of())
    assert_inconclusive(judged, Reason.REFERENCE_INCOMPLETE, says="another reference")
    assert "step 400" not in judged.reason


@pytest.mark.parametrize(
    "step",
    [None, "200", 200.5, math.nan, math.inf, [200], {"step": 200}, True],
    ids=repr,
)
def test_a_pass_that_names_no_step_does_not_prove(step: Any) -> None:
    report = passed_report()
    report["checkpoint"]["step"] = step
    assert_inconclusive(
        verdict_of_report(report, drill_of()),
        Reason.REFERENCE_INCOMPLETE,
        says=f"the drill loaded step {step}, not {CHECKPOINT_STEP}",
    )


@pytest.mark.parametrize("step", [400, 0, -200, 10**30], ids=repr)
def test_a_pass_of_another_step_than_registered_fails(step: int) -> None:
    # Against the reference Gantry wrote for step 200, the directory held another step:
    # another checkpoint was put in its place (the trainer that wrote this report did not
    # hold it to the registered step). Failed, so resuming from it is blocked.
    report = passed_report()
    report["checkpoint"]["step"] = step
    judged = verdict_of_report(report, drill_of())
    assert judged.verdict == FAILED and judged.blocks_resume and not judged.proves
    assert judged.reason_code == Reason.NOT_AS_REGISTERED
    assert f"holds step {step}, not step {CHECKPOINT_STEP}" in judged.reason


@pytest.mark.parametrize("checkpoint", [None, {}, [], ""], ids=repr)
def test_a_pass_that_does_not_say_which_checkpoint_it_loaded_does_not_prove(
    checkpoint: Any,
) -> None:
    report = {**passed_report(), "checkpoint": checkpoint}
    assert_inconclusive(
        verdict_of_report(report, drill_of()),
        Reason.REFERENCE_INCOMPLETE,
        says=f"the drill loaded step None, not {CHECKPOINT_STEP}",
    )


def test_a_pass_without_the_checkpoint_key_does_not_prove() -> None:
    report = passed_report()
    del report["checkpoint"]
    assert_inconclusive(
        verdict_of_report(report, drill_of()), Reason.REFERENCE_INCOMPLETE, says="loaded step None"
    )


@pytest.mark.parametrize(
    "compared",
    [4, 0, -1, None, "5", 5.0, math.nan, math.inf, [5], {"n": 5}],
    ids=repr,
)
def test_a_pass_that_compared_fewer_steps_than_asked_does_not_prove(compared: Any) -> None:
    report = {**passed_report(), "steps_compared": compared}
    assert_inconclusive(
        verdict_of_report(report, drill_of()),
        Reason.STEPS_SHORT,
        says=f"the drill compared {compared} of the {STEPS} steps asked for",
    )


def test_a_pass_without_steps_compared_does_not_prove() -> None:
    report = passed_report()
    del report["steps_compared"]
    assert_inconclusive(
        verdict_of_report(report, drill_of()), Reason.STEPS_SHORT, says="compared None of the 5"
    )


def test_steps_are_counted_against_what_gantry_asked_not_what_the_report_asked() -> None:
    # The report says it was asked for 3 steps and compared 3; Gantry asked for 5.
    report = {**passed_report(), "steps_requested": 3, "steps_compared": 3}
    assert_inconclusive(
        verdict_of_report(report, drill_of()), Reason.STEPS_SHORT, says="compared 3 of the 5"
    )


@pytest.mark.parametrize(
    "state",
    [
        None,
        {},
        [],
        {"at_load": None, "at_end": _state_compared(NEXT_CHECKPOINT_STEP)},
        {"at_load": {}, "at_end": _state_compared(NEXT_CHECKPOINT_STEP)},
        {"at_load": [], "at_end": _state_compared(NEXT_CHECKPOINT_STEP)},
        {
            "at_load": {**_state_compared(CHECKPOINT_STEP), "compared": False},
            "at_end": _state_compared(NEXT_CHECKPOINT_STEP),
        },
        {
            "at_load": {**_state_compared(CHECKPOINT_STEP), "compared": None},
            "at_end": _state_compared(NEXT_CHECKPOINT_STEP),
        },
        {
            "at_load": {**_state_compared(CHECKPOINT_STEP), "compared": 0},
            "at_end": _state_compared(NEXT_CHECKPOINT_STEP),
        },
    ],
    ids=[
        "state-null",
        "state-empty",
        "state-empty-list",
        "at-load-null",
        "at-load-empty",
        "at-load-empty-list",
        "not-compared",
        "compared-null",
        "compared-zero",
    ],
)
def test_a_pass_that_did_not_compare_the_loaded_state_does_not_prove(state: Any) -> None:
    report = {**passed_report(), "state": state}
    # With or without a next checkpoint: the loaded state is always compared.
    for drill in (drill_of(), drill_of(replay_to_step=None)):
        assert_inconclusive(
            verdict_of_report(report, drill),
            Reason.REFERENCE_INCOMPLETE,
            says="did not compare the loaded state with Gantry's fingerprint",
        )


def test_a_pass_without_the_state_key_does_not_prove() -> None:
    report = passed_report()
    del report["state"]
    assert_inconclusive(
        verdict_of_report(report, drill_of(replay_to_step=None)),
        Reason.REFERENCE_INCOMPLETE,
        says="did not compare the loaded state",
    )


@pytest.mark.parametrize(
    "at_end",
    [
        None,
        {},
        {**_state_compared(NEXT_CHECKPOINT_STEP), "compared": False},
        {**_state_compared(NEXT_CHECKPOINT_STEP), "step": CHECKPOINT_STEP},
        {**_state_compared(NEXT_CHECKPOINT_STEP), "step": NEXT_CHECKPOINT_STEP + 1},
        {**_state_compared(NEXT_CHECKPOINT_STEP), "step": str(NEXT_CHECKPOINT_STEP)},
        {**_state_compared(NEXT_CHECKPOINT_STEP), "step": None},
        {**_state_compared(NEXT_CHECKPOINT_STEP), "step": math.nan},
    ],
    ids=[
        "null",
        "empty",
        "not-compared",
        "compared-at-the-checkpoint",
        "another-step",
        "step-as-string",
        "step-null",
        "step-nan",
    ],
)
def test_a_pass_that_did_not_compare_the_state_at_the_next_checkpoint_does_not_prove(
    at_end: Any,
) -> None:
    report = passed_report()
    report["state"]["at_end"] = at_end
    assert_inconclusive(
        verdict_of_report(report, drill_of()),
        Reason.REFERENCE_INCOMPLETE,
        says=f"did not compare the state at step {NEXT_CHECKPOINT_STEP} (the next checkpoint)",
    )


def test_a_drill_without_a_recorded_reference_still_checks_the_rest() -> None:
    report = {**passed_report(), "reference_digest": OTHER_REFERENCE_DIGEST}
    report["checkpoint"]["step"] = 400
    assert_inconclusive(
        verdict_of_report(report, drill_of(reference_digest="")),
        Reason.REFERENCE_INCOMPLETE,
        says="loaded step 400, not 200",
    )


def test_a_stored_pass_report_is_a_pass_for_its_own_row_only(db: Any) -> None:
    checkpoint = CheckpointFactory(step=CHECKPOINT_STEP)
    drill = RestoreDrill.objects.create(
        checkpoint=checkpoint,
        steps=STEPS,
        replay_to_step=NEXT_CHECKPOINT_STEP,
        reference_digest=REFERENCE_DIGEST,
        allocation_key="nodes=2",
    )
    drill = RestoreDrill.objects.select_related("checkpoint").get(id=drill.id)
    assert verdict_of_report(passed_report(), drill).proves
    # A drill of the same job's next checkpoint, with the reference Gantry writes for it
    # (it names that step): the same report proves nothing there, and blocks nothing.
    later = RestoreDrill.objects.create(
        checkpoint=CheckpointFactory(job=checkpoint.job, step=NEXT_CHECKPOINT_STEP),
        steps=STEPS,
        reference_digest=json_digest({**REFERENCE, "checkpoint_step": NEXT_CHECKPOINT_STEP}),
        allocation_key="nodes=2",
    )
    assert_inconclusive(
        verdict_of_report(passed_report(), later),
        Reason.REFERENCE_INCOMPLETE,
        says="another reference than the one Gantry wrote",
    )


# verdict_of_report: a failure against what Gantry asked ----------------------------


def test_a_failure_needs_no_replay_to_fail() -> None:
    # Integrity failed before anything loaded: no state, no steps, and still the checkpoint
    # is at fault.
    report = integrity_failed_report(Reason.MISSING_FILE)
    judged = verdict_of_report(report, drill_of())
    assert judged == Judgement(FAILED, report["reason"], Reason.MISSING_FILE)


def test_a_loss_divergence_fails() -> None:
    report = loss_diverged_report()
    judged = verdict_of_report(report, drill_of())
    assert judged == Judgement(FAILED, report["reason"], Reason.LOSS_DIVERGED)
    assert judged.blocks_resume


def test_a_failure_against_another_reference_blocks_nothing() -> None:
    report = {**loss_diverged_report(), "reference_digest": OTHER_REFERENCE_DIGEST}
    judged = verdict_of_report(report, drill_of())
    assert_inconclusive(
        judged,
        Reason.REFERENCE_INCOMPLETE,
        says="another reference than the one Gantry wrote: loss diverged at step 203",
    )
    assert not judged.blocks_resume


def test_a_failure_of_a_drill_without_a_recorded_reference_fails() -> None:
    report = {**loss_diverged_report(), "reference_digest": OTHER_REFERENCE_DIGEST}
    judged = verdict_of_report(report, drill_of(reference_digest=""))
    assert judged.verdict == FAILED and judged.reason_code == Reason.LOSS_DIVERGED


# verdict_of_report: the checkpoint as Gantry registered it ---------------------------

REGISTERED_DIGEST = "a1" * 32
# The manifest of the run's next checkpoint, put in this one's place.
OTHER_MANIFEST_DIGEST = "b2" * 32


def registered_drill(**fields: Any) -> RestoreDrill:
    """``drill_of``, of a checkpoint registered with its manifest's digest."""
    drill = drill_of(**fields)
    drill.checkpoint.manifest_digest = REGISTERED_DIGEST
    return drill


def _showing(report: dict[str, Any], **checkpoint: Any) -> dict[str, Any]:
    report["checkpoint"].update(checkpoint)
    return report


def test_a_pass_of_the_registered_manifest_passes() -> None:
    report = _showing(passed_report(), manifest_digest=REGISTERED_DIGEST)
    assert verdict_of_report(report, registered_drill()).proves


def test_a_pass_of_another_manifest_than_registered_fails() -> None:
    # The step is right, the manifest is another (rewritten or swapped in after Gantry
    # registered it): failed, which blocks resuming from it.
    report = _showing(passed_report(), manifest_digest=OTHER_MANIFEST_DIGEST)
    judged = verdict_of_report(report, registered_drill())
    assert judged.verdict == FAILED and judged.blocks_resume
    assert judged.reason_code == Reason.NOT_AS_REGISTERED
    assert OTHER_MANIFEST_DIGEST[:16] in judged.reason and REGISTERED_DIGEST[:16] in judged.reason


def test_the_registered_step_is_checked_before_the_digest() -> None:
    report = _showing(passed_report(), step=NEXT_CHECKPOINT_STEP, manifest_digest="b2" * 32)
    judged = verdict_of_report(report, registered_drill())
    assert judged.reason_code == Reason.NOT_AS_REGISTERED
    assert f"holds step {NEXT_CHECKPOINT_STEP}, not step {CHECKPOINT_STEP}" in judged.reason


@pytest.mark.parametrize("digest", [None, 7, ["b2" * 32]], ids=repr)
def test_a_pass_that_shows_no_digest_is_held_to_the_step(digest: Any) -> None:
    # A trainer from before digests (the drill runs the version that wrote the checkpoint)
    # shows none: its pass rests on the state compared with Gantry's fingerprints.
    report = _showing(passed_report(), manifest_digest=digest)
    assert verdict_of_report(report, registered_drill()).proves


def test_a_checkpoint_registered_without_a_digest_is_held_to_the_step() -> None:
    report = _showing(passed_report(), manifest_digest=OTHER_MANIFEST_DIGEST)
    assert verdict_of_report(report, drill_of()).proves


def test_another_manifest_against_another_reference_blocks_nothing() -> None:
    report = _showing(passed_report(), manifest_digest=OTHER_MANIFEST_DIGEST)
    report["reference_digest"] = OTHER_REFERENCE_DIGEST
    judged = verdict_of_report(report, registered_drill())
    assert_inconclusive(judged, Reason.REFERENCE_INCOMPLETE, says="another reference")


def test_another_manifest_without_a_recorded_reference_does_not_prove() -> None:
    report = _showing(passed_report(), manifest_digest=OTHER_MANIFEST_DIGEST)
    judged = verdict_of_report(report, registered_drill(reference_digest=""))
    assert_inconclusive(judged, Reason.REFERENCE_INCOMPLETE, says="not the one Gantry registered")


def test_a_drill_that_could_not_judge_another_checkpoint_in_place_fails() -> None:
    # What a trainer from before the registration check reports for the swap: the
    # directory holds the next checkpoint, whose following steps the reference does not
    # have. Against Gantry's own reference that is not a drill that could not judge.
    report = _showing(passed_report(), step=NEXT_CHECKPOINT_STEP)
    report.update(
        verdict="inconclusive",
        reason_code=Reason.REFERENCE_MISSING,
        reason="reference has no steps after 205 (in (205, 210])",
        steps_compared=0,
        steps=[],
        state={"at_load": None, "at_end": None},
    )
    judged = verdict_of_report(report, registered_drill())
    assert judged.verdict == FAILED and judged.reason_code == Reason.NOT_AS_REGISTERED
    assert "reference has no steps after 205" in judged.reason
    # The same report against another drill's reference judges nothing.
    report["reference_digest"] = OTHER_REFERENCE_DIGEST
    assert_inconclusive(verdict_of_report(report, registered_drill()), Reason.REFERENCE_MISSING)


def test_the_trainers_not_as_registered_fails() -> None:
    report = integrity_failed_report(Reason.NOT_AS_REGISTERED)
    report["reason"] = "step-000200: not the checkpoint Gantry registered: it holds step 205"
    judged = verdict_of_report(report, registered_drill())
    assert judged == Judgement(FAILED, report["reason"], Reason.NOT_AS_REGISTERED)
    assert judged.blocks_resume


# verdict_of_report: evidence of the wrong type, or that contradicts the pass ------


@pytest.mark.parametrize("claimed", ["passed", "failed"])
@pytest.mark.parametrize(
    "damage",
    [
        {"checkpoint": [CHECKPOINT_STEP]},
        {"checkpoint": "step-000200"},
        {"state": ["at_load", "at_end"]},
        {"state": "compared"},
        {"state": {"at_load": [True], "at_end": None}},
        {"state": {"at_load": _state_compared(CHECKPOINT_STEP), "at_end": "compared"}},
    ],
    ids=[
        "checkpoint-list",
        "checkpoint-string",
        "state-list",
        "state-string",
        "at-load-list",
        "at-end-string",
    ],
)
def test_a_report_whose_evidence_is_not_an_object_gets_a_verdict(
    damage: dict[str, Any], claimed: str
) -> None:
    report = passed_report() if claimed == "passed" else loss_diverged_report()
    report.update(copy.deepcopy(damage))
    judged = verdict_of_report(report, drill_of())
    assert isinstance(judged, Judgement) and not judged.proves
    if claimed == "passed":
        # Evidence of another type is no evidence: the pass does not show what it needs.
        assert_inconclusive(judged, Reason.REFERENCE_INCOMPLETE)
    else:
        # A failure needs no replay to fail (see test_a_failure_needs_no_replay_to_fail).
        assert judged.verdict == FAILED and judged.reason_code == Reason.LOSS_DIVERGED


def test_a_pass_of_a_report_whose_evidence_is_not_an_object_gets_a_verdict_without_a_drill() -> (
    None
):
    for damage in ({"state": {"at_load": ["compared"], "at_end": None}}, {"steps": "all ok"}):
        report = {**passed_report(), **damage}
        assert_error(verdict_of_report(report), says="the drill report says 'passed', but its")


def test_a_pass_whose_steps_compared_is_a_bool_does_not_prove() -> None:
    report = {**passed_report(), "steps_compared": True}
    assert_inconclusive(
        verdict_of_report(report, drill_of(steps=1, replay_to_step=None)),
        Reason.STEPS_SHORT,
        says="the drill compared True of the 1 steps asked for",
    )


def test_a_pass_whose_steps_are_not_integers_does_not_prove() -> None:
    # 200.0 == 200 and True == 1 in Python; neither is a step in a report.
    report = passed_report()
    report["checkpoint"]["step"] = float(CHECKPOINT_STEP)
    assert_inconclusive(
        verdict_of_report(report, drill_of()), Reason.REFERENCE_INCOMPLETE, says="step 200.0"
    )
    report = passed_report()
    report["state"]["at_end"]["step"] = float(NEXT_CHECKPOINT_STEP)
    assert_inconclusive(
        verdict_of_report(report, drill_of()),
        Reason.REFERENCE_INCOMPLETE,
        says=f"did not compare the state at step {NEXT_CHECKPOINT_STEP}",
    )


@pytest.mark.parametrize("where", ["at_load", "at_end"])
@pytest.mark.parametrize("compared", ["false", "no", 1, [False]], ids=repr)
def test_a_pass_whose_state_comparison_is_not_a_bool_does_not_prove(
    where: str, compared: Any
) -> None:
    report = passed_report()
    report["state"][where]["compared"] = compared
    judged = verdict_of_report(report, drill_of())
    assert_inconclusive(judged, Reason.REFERENCE_INCOMPLETE, says="did not compare the")


def _with_a_loss_divergence(report: dict[str, Any]) -> None:
    steps = _steps(diverge_at=203)
    report.update(steps=steps, first_divergence=dict(steps[2]))


def _with_a_state_problem_at_load(report: dict[str, Any]) -> None:
    problem = {"key": "model/embed.weight", "kind": "bits", "detail": "lhash 1 != 2"}
    report["state"]["at_load"]["problems"] = [problem]


def _with_a_state_problem_at_the_end(report: dict[str, Any]) -> None:
    problem = {"key": "model/embed.weight", "kind": "distance", "detail": "0.4 > 0.001"}
    report["state"]["at_end"]["problems"] = [problem]


def _with_the_loaded_state_of_another_step(report: dict[str, Any]) -> None:
    report["state"]["at_load"]["step"] = 100


def _without_the_compared_steps(report: dict[str, Any]) -> None:
    report["steps"] = []


def _with_fewer_steps_than_compared(report: dict[str, Any]) -> None:
    del report["steps"][-1]


def _with_one_step_shown_five_times(report: dict[str, Any]) -> None:
    report["steps"] = [dict(report["steps"][0]) for _ in range(STEPS)]


def _with_more_steps_compared_than_shown(report: dict[str, Any]) -> None:
    report["steps_compared"] = STEPS + 1


def _with_a_step_without_a_comparison(report: dict[str, Any]) -> None:
    report["steps"][1].update(reference=None, abs_diff=None, rel_diff=None, ok=None)


def _with_steps_that_are_not_objects(report: dict[str, Any]) -> None:
    report["steps"] = [entry["step"] for entry in report["steps"]]


def _with_the_loaded_state_of_step_true(report: dict[str, Any]) -> None:
    report["state"]["at_load"]["step"] = True


def _without_a_list_of_state_problems(report: dict[str, Any]) -> None:
    del report["state"]["at_end"]["problems"]


# Each with what the verdict names: a pass its own evidence contradicts is not to be
# trusted either way (not a failure of the checkpoint either): an error, not a verdict.
CONTRADICTIONS = [
    (_with_a_loss_divergence, "it shows a first divergence at step 203: {"),
    (_with_a_state_problem_at_load, "its state at_load shows problems"),
    (_with_a_state_problem_at_the_end, "its state at_end shows problems"),
    (_with_the_loaded_state_of_another_step, "compared the loaded state of step 100, not"),
    (_without_the_compared_steps, "it counts 5 steps compared but shows none of step 201"),
    (_with_fewer_steps_than_compared, "shows none of step 205"),
    (_with_one_step_shown_five_times, "shows none of step 202"),
    (_with_more_steps_compared_than_shown, "it counts 6 steps compared but shows none of step 206"),
    (_with_a_step_without_a_comparison, "step 202 is not ok: {"),
    (_with_steps_that_are_not_objects, "its steps are not a list of objects: [201, 202"),
    (_with_the_loaded_state_of_step_true, "compared the loaded state of step True"),
    (_without_a_list_of_state_problems, "its state at_end shows problems (an empty list"),
]


@pytest.mark.parametrize(
    ("contradict", "says"),
    CONTRADICTIONS,
    ids=[contradict.__name__.strip("_") for contradict, _ in CONTRADICTIONS],
)
def test_a_pass_whose_own_evidence_contradicts_it_is_an_error(contradict: Any, says: str) -> None:
    report = passed_report()
    contradict(report)
    for drill in (drill_of(), None):
        judged = verdict_of_report(report, drill)
        assert_error(judged, says="the drill report says 'passed', but ")
        assert says in judged.reason


def test_a_pass_that_does_not_say_what_it_compared_is_an_error_without_a_drill() -> None:
    report = {**passed_report(), "steps_compared": "5"}
    assert_error(verdict_of_report(report), says="does not name the step it loaded")


def test_a_pass_without_a_next_checkpoint_shows_no_problems_at_the_end_either() -> None:
    report = passed_report()
    report["state"]["at_end"]["problems"] = [{"key": "model/embed.weight", "kind": "bits"}]
    assert_error(verdict_of_report(report, drill_of(replay_to_step=None)), says="at_end")


def test_a_hostile_report_is_quoted_short() -> None:
    # Deeply nested and long values: the reason quotes them short, and nothing raises.
    deep: Any = CHECKPOINT_STEP
    for _ in range(5000):
        deep = [deep]
    for key, value in (("reason", deep), ("verdict", "x" * 100_000), ("reason_code", deep)):
        report = {**integrity_failed_report(), key: value}
        judged = verdict_of_report(report, drill_of())
        assert len(judged.reason) < 1000
    report = passed_report()
    report["checkpoint"]["step"] = deep
    assert len(verdict_of_report(report, drill_of()).reason) < 1000


def test_a_reason_is_stored_without_what_postgresql_refuses() -> None:
    report = {**loss_diverged_report(), "reason": "loss\x00 diverged \ud800 at step 203"}
    judged = verdict_of_report(report, drill_of())
    assert judged.reason == "loss\ufffd diverged \ufffd at step 203"
    assert verdict_of_code("bit\x00rot", "").reason_code == "bit\ufffdrot"


# report_timings ---------------------------------------------------------------------


def test_the_timings_stored_are_the_drills_own() -> None:
    timings = report_timings(passed_report())
    assert timings == {"integrity_s": 0.42, "load_s": 1.5, "steps_s": 3.25}


def test_whole_seconds_are_stored_as_floats() -> None:
    timings = report_timings({"timings": {"integrity_s": 2, "load_s": 0, "steps_s": 10**6}})
    assert timings == {"integrity_s": 2.0, "load_s": 0.0, "steps_s": 1e6}
    assert all(type(value) is float for value in timings.values())


def test_timings_of_a_drill_that_stopped_early_are_empty() -> None:
    assert report_timings(integrity_failed_report()) == {
        "integrity_s": 0.42,
        "load_s": None,
        "steps_s": None,
    }


@pytest.mark.parametrize(
    "report",
    [
        {},
        {"timings": None},
        {"timings": {}},
        {"timings": []},
        infrastructure_error_report(),
        {"timings": {"integrity_s": "0.42", "load_s": None, "steps_s": [3.25]}},
        {"timings": {"integrity_s": {"s": 1}, "load_s": "fast", "steps_s": b"1"}},
    ],
    ids=[
        "no-timings",
        "null",
        "empty",
        "empty-list",
        "infrastructure-error",
        "strings-and-lists",
        "objects",
    ],
)
def test_timings_that_are_not_numbers_are_not_stored(report: dict[str, Any]) -> None:
    assert report_timings(report) == {"integrity_s": None, "load_s": None, "steps_s": None}


@pytest.mark.parametrize("timings", [[0.42, 1.5, 3.25], "fast", 7.0], ids=repr)
def test_timings_that_are_not_an_object_are_not_stored(timings: Any) -> None:
    report = {**passed_report(), "timings": timings}
    assert report_timings(report) == {"integrity_s": None, "load_s": None, "steps_s": None}


def test_a_timing_beyond_the_float_range_is_not_stored() -> None:
    report = {**passed_report(), "timings": {"integrity_s": 10**400, "load_s": 1.5}}
    assert report_timings(report)["integrity_s"] is None


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True, -0.5, -1], ids=repr)
def test_a_timing_that_is_not_a_finite_number_is_not_stored(value: Any) -> None:
    report = {**passed_report(), "timings": {"integrity_s": value, "load_s": 1.5}}
    assert report_timings(report)["integrity_s"] is None


# report_evidence, and the report stored by apply_report ------------------------------


def nan_loss_report() -> dict[str, Any]:
    """A drill whose replay produced a NaN loss: json.loads reads the trainer's bare NaN."""
    report = loss_diverged_report()
    report["steps"][2].update(loss=math.nan, abs_diff=math.nan, rel_diff=math.nan)
    report["first_divergence"] = dict(report["steps"][2])
    report["reason"] = "loss diverged at step 203: nan differs from reference 3.297"
    report["state"]["at_load"]["problems"] = [{"key": "k", "kind": "distance", "detail": math.inf}]
    report["timings"]["per_step_s"] = -math.inf
    return report


def test_a_reports_evidence_is_stored_as_written() -> None:
    report = passed_report()
    assert report_evidence(report) == report


def test_non_finite_numbers_are_stored_as_the_trainer_spelled_them() -> None:
    evidence = report_evidence(nan_loss_report())
    assert evidence["steps"][2]["loss"] == "NaN"
    assert evidence["first_divergence"]["rel_diff"] == "NaN"
    assert evidence["state"]["at_load"]["problems"][0]["detail"] == "Infinity"
    assert evidence["timings"]["per_step_s"] == "-Infinity"
    # Everything else is as written, and the whole is strict JSON.
    assert evidence["steps"][1] == nan_loss_report()["steps"][1]
    assert json.loads(json.dumps(evidence, allow_nan=False)) == evidence


def test_text_is_stored_without_what_postgresql_refuses() -> None:
    evidence = report_evidence({"reason": "a\x00b", "ranks": [{"node\ud800": "\udfffn1"}]})
    assert evidence == {"reason": "a\ufffdb", "ranks": [{"node\ufffd": "\ufffdn1"}]}


def test_evidence_nested_too_deep_is_cut() -> None:
    deep: Any = [1.5]
    for _ in range(5000):
        deep = {"x": deep}
    evidence = report_evidence({**passed_report(), "extra": deep})
    level = evidence["extra"]
    for _ in range(EVIDENCE_DEPTH - 2):
        level = level["x"]
    assert level == {"x": EVIDENCE_CUT}
    assert evidence["steps"] == passed_report()["steps"]


def _running_drill() -> RestoreDrill:
    checkpoint = CheckpointFactory(step=CHECKPOINT_STEP)
    drill = RestoreDrill.objects.create(
        checkpoint=checkpoint,
        steps=STEPS,
        replay_to_step=NEXT_CHECKPOINT_STEP,
        reference_digest=REFERENCE_DIGEST,
        allocation_key="nodes=2",
        state=RestoreDrill.State.RUNNING,
        # Run as a verifier: only its pass proves (tests/drills/test_attestation.py).
        attestation=RestoreDrill.Attestation.VERIFIER,
        verifier_account="gantry-verify",
    )
    return RestoreDrill.objects.select_related("checkpoint").get(id=drill.id)


def test_apply_report_stores_a_nan_loss_as_strict_json(db: Any) -> None:
    # PostgreSQL's jsonb refuses a bare NaN (and text refuses NUL): the drill must still
    # finish with its verdict, not raise on every reconcile cycle.
    drill = _running_drill()
    report = nan_loss_report()
    report["reason"] += " \x00"
    assert DRILLS.apply_report(drill, report=report, exit_code=1)
    stored = RestoreDrill.objects.get(id=drill.id)
    assert stored.state == RestoreDrill.State.FINISHED
    assert stored.verdict == FAILED and stored.reason_code == Reason.LOSS_DIVERGED
    assert stored.reason.endswith("reference 3.297 \ufffd")
    assert stored.evidence["steps"][2]["loss"] == "NaN"
    assert stored.evidence["steps"][1]["loss"] == report["steps"][1]["loss"]
    assert stored.load_s == 1.5
    checkpoint = Checkpoint.objects.get(id=drill.checkpoint_id)
    assert checkpoint.integrity == Checkpoint.Integrity.FAILED


def test_apply_report_of_a_pass_stores_the_report_and_proves(db: Any) -> None:
    drill = _running_drill()
    assert DRILLS.apply_report(drill, report=passed_report(), exit_code=0)
    stored = RestoreDrill.objects.get(id=drill.id)
    assert stored.verdict == PASSED and stored.evidence == passed_report()
    assert Checkpoint.objects.get(id=drill.checkpoint_id).last_proven_at is not None


def test_a_state_exact_report_with_no_step_passes_only_a_drill_that_asked_for_none() -> None:
    """The level state-exact, no replay: K = 0, the loaded state compared bit for bit. It
    passes a drill that asked for 0 steps; the same report for a drill that asked for the
    full replay proves less than was asked (inconclusive, never a pass)."""
    report = passed_report()
    report.update(steps_requested=0, steps_compared=0, steps=[])
    report["state"] = {"at_load": _state_compared(CHECKPOINT_STEP), "at_end": None}
    zero = drill_of(steps=0, replay_to_step=None)
    zero.level = RestoreDrill.Level.STATE_EXACT
    judged = verdict_of_report(report, zero)
    assert judged.verdict == "passed" and judged.proves, judged.reason
    assert_inconclusive(verdict_of_report(report, drill_of()), Reason.STEPS_SHORT)
    # Without the state compared at load, a report with no step proves nothing.
    report["state"] = {"at_load": None, "at_end": None}
    assert verdict_of_report(report, zero).verdict == "inconclusive"
