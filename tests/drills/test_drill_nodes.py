"""The nodes a restore drill ran on, as Gantry records them from Slurm (squeue while it
runs, the final record when it ends), never from the drill's own report: what silent data
corruption evidence (``recovery.sdc``) is held to."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from drills import lifecycle
from drills.lifecycle import DRILLS
from drills.models import RestoreDrill
from factories import CheckpointFactory
from runs.lifecycle import SlurmViews
from slurm.parsers import SlurmJob
from trainer.schema import DRILL_SCHEMA

pytestmark = pytest.mark.django_db


def _drill(state: str, **values: Any) -> RestoreDrill:
    checkpoint = CheckpointFactory()
    drill = RestoreDrill.objects.create(
        checkpoint=checkpoint,
        cluster=checkpoint.job.cluster,
        allocation_key="x",
        state=state,
        slurm_job_id="77",
        submitted_at=timezone.now() - timedelta(minutes=2),
        **values,
    )
    return RestoreDrill.objects.select_related("cluster", "checkpoint__job__cluster").get(
        id=drill.id
    )


def test_a_running_drill_keeps_the_nodes_squeue_shows() -> None:
    drill = _drill(RestoreDrill.State.PENDING)
    started = timezone.now() - timedelta(seconds=30)
    running = SlurmJob(job_id="77", state="RUNNING", node_list_expr="n[1-2]", start_time=started)
    DRILLS.apply_views([drill], SlurmViews(queue={"77": running}, accounted={}), timezone.now(), [])
    drill.refresh_from_db()
    assert drill.state == RestoreDrill.State.RUNNING and drill.allocated_nodes == "n[1-2]"
    assert drill.started_at == started and drill.queue_wait_s is not None
    # Seen again with no nodes shown: what was recorded stays.
    blank = SlurmJob(job_id="77", state="RUNNING", node_list_expr="(null)", start_time=started)
    DRILLS.apply_views([drill], SlurmViews(queue={"77": blank}, accounted={}), timezone.now(), [])
    drill.refresh_from_db()
    assert drill.allocated_nodes == "n[1-2]"


def test_a_drill_that_ran_between_two_cycles_gets_its_nodes_from_the_final_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drill = _drill(RestoreDrill.State.RUNNING)
    # The report names other nodes: never read for this.
    report = {
        "schema": DRILL_SCHEMA,
        "verdict": "error",
        "reason_code": "infrastructure_error",
        "reason": "the drill could not complete",
        "allocation": {"nodes": ["somewhere-else"]},
    }
    monkeypatch.setattr(lifecycle, "_read_report", lambda drill, transport: report)
    monkeypatch.setattr(DRILLS, "transport_of", lambda obj: object())
    record = SlurmJob(job_id="77", state="COMPLETED", exit_code=0, node_list_expr="n3")
    assert DRILLS.finished(drill, record, timezone.now())
    drill.refresh_from_db()
    assert drill.allocated_nodes == "n3" and drill.verdict == RestoreDrill.Verdict.ERROR
