"""The corruption-coverage suite: kinds of damage × {same shape, another allocation}
against real drills on the dev cluster, plus a false-alarm count over clean checkpoints.

One job (2 ranks on 2 nodes) saves a checkpoint every 2 steps. Each damage kind of
``tests/drill_damage.py`` is applied to its own checkpoint on the cluster (file damage,
the whole directory swapped for the next checkpoint's, and state damage with every hash,
sidecar and manifest kept valid, registered as the trainer wrote it); the sharded kinds (a
rank's shard missing, two ranks' shards swapped, a shard of another step) to the
checkpoints of a second job trained with FSDP on 2 nodes, whose drills must also name the
shard or rank at fault; environment kinds
change what Gantry holds instead (a fingerprint or losses gone, the dataset definition or
the trainer version changed). Every checkpoint is drilled on the job's own shape and on
another allocation (1 rank, on another partition where the cluster has one), replaying to
the next checkpoint. A kind is detected when the drill reaches the verdict class the kind
calls for with one of its reason codes; a clean checkpoint must pass.

``make drill-coverage`` runs the whole matrix (``GANTRY_DRILL_COVERAGE=full``) and prints
the table; ``make test`` runs a slice. The table is also written to
``test-artifacts/drill-coverage.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from drill_damage import REPLICATED_KINDS, SHARDED_KINDS, Damage, registered_digest
from drill_support import checkpoint_dir, run_job, start_drill, wait_finished, wait_verdict
from rest_framework.test import APIClient

from devcluster_support import DevCluster
from drills.models import RestoreDrill
from drills.services import restore_drill_start
from jobs.models import Checkpoint, Job, MetricPoint, StateFingerprint
from nodes.models import Partition

pytestmark = pytest.mark.django_db(transaction=True)

FULL = os.environ.get("GANTRY_DRILL_COVERAGE") == "full"
SLICE = {
    "weights altered 1% (hashes valid)",
    "optimizer step counts altered (hashes valid)",
    "rank files of another step (hashes valid)",
    "checkpoint swapped for another step (complete, hashes valid)",
}
CLEAN = 10 if FULL else 2
SHARDED_SLICE = {"two ranks' shards swapped (hashes valid)"}
CLEAN_SHARDED = 4 if FULL else 1
ARTIFACT = Path(__file__).resolve().parents[2] / "test-artifacts" / "drill-coverage.md"


@dataclass(frozen=True)
class EnvironmentKind:
    """A change to what Gantry holds, made in the transaction that starts the drill (so
    the submit task sees it), undone after the verdict."""

    name: str
    change: Callable[[Checkpoint], Callable[[], None]]
    verdict: str
    codes: frozenset[str]


def _fingerprint_gone(which: str) -> Callable[[Checkpoint], Callable[[], None]]:
    def change(checkpoint: Checkpoint) -> Callable[[], None]:
        drill = checkpoint.drills.order_by("-created_at").first()
        assert drill is not None
        step = checkpoint.step if which == "checkpoint" else drill.replay_to_step
        StateFingerprint.objects.filter(job_id=checkpoint.job_id, step=step).delete()
        return lambda: None

    return change


def _losses_gone(checkpoint: Checkpoint) -> Callable[[], None]:
    MetricPoint.objects.filter(job_id=checkpoint.job_id, step=checkpoint.step + 1).delete()
    return lambda: None


def _job_field(
    field: str, value: Callable[[Job], Any]
) -> Callable[[Checkpoint], Callable[[], None]]:
    def change(checkpoint: Checkpoint) -> Callable[[], None]:
        job = Job.objects.get(id=checkpoint.job_id)
        before = getattr(job, field)
        Job.objects.filter(id=job.id).update(**{field: value(job)})
        return lambda: Job.objects.filter(id=job.id).update(**{field: before})

    return change


ENVIRONMENT = [
    EnvironmentKind(
        "reference incomplete: fingerprint of the checkpoint gone",
        _fingerprint_gone("checkpoint"),
        "inconclusive",
        frozenset({"reference_incomplete"}),
    ),
    EnvironmentKind(
        "reference incomplete: fingerprint of the next checkpoint gone",
        _fingerprint_gone("next"),
        "inconclusive",
        frozenset({"reference_incomplete"}),
    ),
    EnvironmentKind(
        "reference incomplete: a logged loss gone",
        _losses_gone,
        "inconclusive",
        frozenset({"steps_short", "reference_incomplete"}),
    ),
    EnvironmentKind(
        "dataset definition changed",
        _job_field(
            "acceptance", lambda job: {**(job.acceptance or {}), "dataset_sha256": "0" * 64}
        ),
        "inconclusive",
        frozenset({"dataset_changed"}),
    ),
    EnvironmentKind(
        "recorded trainer version gone",
        _job_field("trainer_digest", lambda job: "f" * 64),
        "inconclusive",
        frozenset({"trainer_unavailable"}),
    ),
]
ENVIRONMENT_SLICE = {"dataset definition changed", "reference incomplete: a logged loss gone"}


def _shapes(job: Job) -> dict[str, dict[str, Any]]:
    """The job's own shape, and one rank on another partition (or the same one)."""
    others = [
        p.name
        for p in Partition.objects.filter(cluster=job.cluster).order_by("name")
        if p.name != job.partition
    ]
    return {
        "same shape": {},
        "another allocation": {"nodes": 1, **({"partition": others[0]} if others else {})},
    }


@dataclass
class Row:
    kind: str
    shape: str
    expected: str
    verdict: str
    code: str
    detected: bool
    reason: str
    drill_id: str


def _row(
    kind: str,
    shape: str,
    expected: str,
    codes: frozenset[str],
    drill: RestoreDrill,
    damage: Damage | None = None,
) -> Row:
    detected = drill.verdict == expected and (not codes or drill.reason_code in codes)
    # A sharded kind must also name the shard or the rank at fault.
    detected = detected and (damage is None or damage.named_in(drill.reason))
    return Row(
        kind,
        shape,
        expected,
        drill.verdict,
        drill.reason_code or "–",
        detected,
        drill.reason,
        str(drill.id),
    )


def _write_table(rows: list[Row], clean: list[Row]) -> str:
    damaged = rows
    found = sum(r.detected for r in damaged)
    alarms = sum(not r.detected for r in clean)
    lines = [
        "| kind | shape | expected | verdict | reason code | detected |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r.kind} | {r.shape} | {r.expected} | {r.verdict} | `{r.code}` | "
            f"{'yes' if r.detected else 'NO'} |"
            for r in damaged
        ),
        "",
        f"Detected with the right verdict class: {found}/{len(damaged)} damaged drills "
        f"({len({r.kind for r in damaged})} kinds × {len({r.shape for r in damaged})} shapes). "
        f"False alarms: {alarms} over {len(clean)} drills of "
        f"{len(clean) // max(1, len({r.shape for r in clean}))} clean checkpoints.",
    ]
    text = "\n".join(lines)
    ARTIFACT.parent.mkdir(exist_ok=True)
    ARTIFACT.write_text(text + "\n")
    return text


def _run_fsdp_job(api: APIClient, *, steps: int) -> Job:
    response = api.post(
        "/api/v1/jobs/submit/",
        {
            "name": "drill-coverage-fsdp",
            "partition": "batch",
            "nodes": 2,
            "gpus_per_node": 1,
            "tasks_per_node": 1,
            "time_limit_minutes": 10,
            "config": {
                "preset": "tiny",
                "steps": steps,
                "checkpoint_every": 2,
                "checkpoint_keep": 10000,
                "strategy": "fsdp",
            },
        },
        format="json",
    )
    assert response.status_code == 202, response.json()
    return Job.objects.get(id=response.json()["id"])


def _damage_rows(
    api: APIClient,
    worker: Any,
    devcluster: DevCluster,
    checkpoints: list[Checkpoint],
    kinds: list[Damage],
    clean_count: int,
    shapes: dict[str, dict[str, Any]],
) -> tuple[list[Row], list[Row]]:
    """Each kind on its own checkpoint, then every drill at once (damage is applied in step
    order, so a kind that copies from the next checkpoint copies it undamaged); the next
    ``clean_count`` checkpoints are drilled undamaged."""
    by_step = {c.step: c for c in checkpoints}
    damaged = checkpoints[: len(kinds)]
    clean = checkpoints[len(kinds) : len(kinds) + clean_count]
    for kind, checkpoint in zip(kinds, damaged, strict=True):
        following = by_step[checkpoint.step + 2]
        directory = checkpoint_dir(devcluster, checkpoint)
        kind.apply(directory, checkpoint_dir(devcluster, following))
        if kind.registered_as_written:
            # Damage the trainer wrote: Gantry registered that manifest.
            digest = registered_digest(directory)
            Checkpoint.objects.filter(pk=checkpoint.pk).update(manifest_digest=digest)
    started: list[tuple[Damage | None, str, str]] = []
    for kind, checkpoint in zip(kinds, damaged, strict=True):
        for shape, allocation in shapes.items():
            started.append((kind, shape, start_drill(api, checkpoint, **allocation)))
    for checkpoint in clean:
        for shape, allocation in shapes.items():
            started.append((None, shape, start_drill(api, checkpoint, **allocation)))
    rows: list[Row] = []
    clean_rows: list[Row] = []
    for kind, shape, drill_id in started:
        drill = wait_verdict(drill_id, worker, timeout=600)
        if kind is None:
            clean_rows.append(_row("clean", shape, "passed", frozenset(), drill))
        else:
            rows.append(
                _row(
                    kind.name,
                    shape,
                    kind.verdict,
                    kind.codes,
                    drill,
                    kind if kind.sharded else None,
                )
            )
    return rows, clean_rows


@pytest.mark.slow
@pytest.mark.nodes(2, ("batch", "gpu"))
def test_drill_coverage(
    dev_cluster_registered: Any,
    celery_stack: Any,
    researcher: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
) -> None:
    worker = celery_stack["worker"]
    kinds: list[Damage] = [k for k in REPLICATED_KINDS if FULL or k.name in SLICE]
    sharded: list[Damage] = [k for k in SHARDED_KINDS if FULL or k.name in SHARDED_SLICE]
    environment = [e for e in ENVIRONMENT if FULL or e.name in ENVIRONMENT_SLICE]
    # Environment kinds take every other checkpoint: one may remove its next one's state.
    needed = len(kinds) + CLEAN + 2 * len(environment)
    job = run_job(
        researcher_api, steps=2 * (needed + 1), every=2, name="drill-coverage", keep=10000
    )
    fsdp = _run_fsdp_job(researcher_api, steps=2 * (len(sharded) + CLEAN_SHARDED + 1))
    job = wait_finished(job, worker, timeout=300)
    fsdp = wait_finished(fsdp, worker, timeout=300)
    checkpoints = list(job.checkpoints.order_by("step"))
    assert len(checkpoints) >= needed + 1, [c.step for c in checkpoints]
    assert fsdp.acceptance["strategy"] == "fsdp"
    shapes = _shapes(job)

    rows, clean_rows = _damage_rows(
        researcher_api, worker, devcluster, checkpoints, kinds, CLEAN, shapes
    )
    sharded_rows, sharded_clean = _damage_rows(
        researcher_api,
        worker,
        devcluster,
        list(fsdp.checkpoints.order_by("step")),
        sharded,
        CLEAN_SHARDED,
        shapes,
    )
    rows += sharded_rows
    clean_rows += sharded_clean

    # What Gantry holds, changed in the transaction that starts the drills.
    spaced = checkpoints[len(kinds) + CLEAN :: 2]
    for env, checkpoint in zip(environment, spaced, strict=False):
        drill_ids: list[tuple[str, str]] = []
        with transaction.atomic():
            for shape, allocation in shapes.items():
                drill = restore_drill_start(
                    actor=researcher, checkpoint=checkpoint, allocation=allocation
                )
                drill_ids.append((shape, str(drill.id)))
            undo = env.change(checkpoint)
        try:
            for shape, drill_id in drill_ids:
                drill = wait_verdict(drill_id, worker, timeout=600)
                rows.append(_row(env.name, shape, env.verdict, env.codes, drill))
        finally:
            undo()

    table = _write_table(rows, clean_rows)
    print("\n" + table)
    missed = [r for r in rows if not r.detected]
    alarms = [r for r in clean_rows if not r.detected]
    assert not missed, [(r.kind, r.shape, r.verdict, r.code, r.reason) for r in missed]
    assert not alarms, [(r.shape, r.verdict, r.code, r.reason) for r in alarms]
    # Only failed blocks resuming; inconclusive never does.
    for row in rows:
        integrity = RestoreDrill.objects.get(id=row.drill_id).checkpoint.integrity
        if row.verdict == "failed":
            assert integrity == "failed", row
        else:
            assert integrity != "failed", row
