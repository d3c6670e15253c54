"""Storing what the trainer wrote: metric points from ``metrics.jsonl`` and checkpoints
from their manifests. The watcher (``jobs.rundir``) reads the bytes; this stores them.

Metric points are stored exactly once per step (the last line for a step wins) under a
conditional update of the job's read offset, so two watchers reading the same bytes
cannot store them twice.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction

from jobs.job_lifecycle import job_event
from jobs.models import Checkpoint, Job, MetricPoint, StateFingerprint
from trainer.schema import FINGERPRINT_FORMAT, METRIC_KEYS, Event

logger = logging.getLogger(__name__)

# Trainer events that go on the job's timeline.
_TIMELINE_EVENTS = {Event.TARGET_REACHED, Event.DONE, Event.RESUMED, Event.CHECKPOINT_FAILED}


def metrics_ingest(*, job: Job, data: bytes, start_offset: int) -> tuple[int, int]:
    """Store the complete lines of ``data`` (read from ``start_offset``); returns
    (points stored, new offset). A partial last line waits for the next read."""
    end = data.rfind(b"\n")
    if end < 0:
        return 0, start_offset
    complete = data[: end + 1]
    # Rows in the database's own types, built straight from the lines: model objects and
    # per-value field preparation cost more than the parsing itself.
    job_key = MetricPoint._meta.get_field("job").get_db_prep_value(job.id, connection)
    adapt_time = connection.ops.adapt_datetimefield_value
    points: dict[int, tuple[Any, ...]] = {}
    events: list[dict[str, Any]] = []
    for raw in complete.splitlines():
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            logger.warning("job %s: unreadable metrics line skipped: %r", job.id, raw[:200])
            continue
        if not isinstance(line, dict):
            continue
        if "event" in line:
            events.append(line)
            continue
        try:
            step = int(line["step"])
            wall = datetime.fromtimestamp(float(line["time"]), tz=UTC)
        except (KeyError, TypeError, ValueError):
            continue
        get = line.get
        values = [get(key) for key in _METRIC_LINE_KEYS]
        world_size = get("world_size")
        points[step] = (
            job_key,
            step,
            adapt_time(wall),
            *(float(v) if isinstance(v, int | float) else None for v in values),
            world_size if isinstance(world_size, int) else None,
        )
    new_offset = start_offset + len(complete)
    with transaction.atomic():
        # Conditional on the offset we read from: a racing watcher cannot double-store.
        updates: dict[str, Any] = {"metrics_offset": new_offset}
        if points:
            updates["last_step"] = max(points)
            # samples_per_s is the 6th column of a row.
            newest = [points[step][5] for step in sorted(points)[-5:]]
            rates = [rate for rate in newest if rate is not None]
            if rates:
                updates["throughput_now"] = sum(rates) / len(rates)
        for event in events:
            kind = event.get("event")
            if kind == Event.START:
                if isinstance(event.get("optimal_loss"), int | float):
                    updates["optimal_loss"] = float(event["optimal_loss"])
                if isinstance(event.get("target_loss"), int | float):
                    updates["target_loss"] = float(event["target_loss"])
            elif kind == Event.TARGET_REACHED and job.target_reached_step is None:
                updates["target_reached_step"] = event.get("step")
                updates["target_reached_elapsed_s"] = event.get("elapsed")
        if not Job.objects.filter(id=job.id, metrics_offset=start_offset).update(**updates):
            return 0, start_offset
        if points:
            _metric_points_upsert(list(points.values()))
        for event in events:
            kind = str(event.get("event"))
            if kind in _TIMELINE_EVENTS:
                job_event(job, kind, message=_describe_trainer_event(event))
            elif kind == Event.CHECKPOINT:
                fingerprint_store(job=job, step=event.get("step"), data=event.get("fingerprint"))
    job.metrics_offset = new_offset
    return len(points), new_offset


# The trainer's keys (``trainer.schema.METRIC_KEYS``) for the float columns between
# wall_time and world_size, in order.
_METRIC_LINE_KEYS = (
    "elapsed",
    "loss",
    "samples_per_s",
    "tokens_per_s",
    "step_time",
    "data_time",
    "checkpoint_blocking_time",
)
if not set(_METRIC_LINE_KEYS) <= set(METRIC_KEYS):
    raise ImportError("jobs.ingest reads metric keys the trainer does not write")
_METRIC_COLUMNS = (
    "job_id",
    "step",
    "wall_time",
    "elapsed_s",
    "loss",
    "samples_per_s",
    "tokens_per_s",
    "step_time_s",
    "data_time_s",
    "checkpoint_blocking_s",
    "world_size",
)


def _metric_points_upsert(rows: list[tuple[Any, ...]]) -> None:
    """Insert metric points, the last line for a step winning: one prepared statement run
    with executemany (the ORM's bulk_create spends most of its time building SQL)."""
    table = MetricPoint._meta.db_table
    quote = connection.ops.quote_name
    columns = ", ".join(quote(column) for column in _METRIC_COLUMNS)
    updates = ", ".join(
        f"{quote(column)} = excluded.{quote(column)}" for column in _METRIC_COLUMNS[2:]
    )
    row_marks = "(" + ", ".join(["%s"] * len(_METRIC_COLUMNS)) + ")"
    conflict = f"ON CONFLICT ({quote('job_id')}, {quote('step')}) DO UPDATE SET {updates}"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # One statement per 1000 rows: executemany would be a round trip per row.
            for start in range(0, len(rows), 1000):
                chunk = rows[start : start + 1000]
                sql = (
                    f"INSERT INTO {quote(table)} ({columns}) VALUES "  # noqa: S608 - fixed names
                    + ", ".join([row_marks] * len(chunk))
                    + f" {conflict}"
                )
                cursor.execute(sql, [value for row in chunk for value in row])
        else:
            sql = f"INSERT INTO {quote(table)} ({columns}) VALUES {row_marks} {conflict}"  # noqa: S608
            for start in range(0, len(rows), 5000):
                cursor.executemany(sql, rows[start : start + 5000])


def _describe_trainer_event(event: dict[str, Any]) -> str:
    kind = event.get("event")
    if kind == Event.TARGET_REACHED:
        return (
            f"quality target reached at step {event.get('step')} after "
            f"{float(event.get('elapsed') or 0):.1f} s (window mean loss "
            f"{event.get('window_mean_loss')}, target {event.get('target_loss')})"
        )
    if kind == Event.DONE:
        return (
            f"training finished at step {event.get('step')}: final loss {event.get('final_loss')}, "
            f"optimum {event.get('optimal_loss')}"
        )
    if kind == Event.RESUMED:
        return f"resumed from {event.get('from')} at step {event.get('step')}"
    if kind == Event.CHECKPOINT_FAILED:
        return f"checkpoint failed: {event.get('error')}"
    return json.dumps(event)[:500]


def fingerprint_store(
    *, job: Job, step: Any, data: Any, source: str = StateFingerprint.Source.EVENT
) -> bool:
    """Keep the state fingerprint the trainer logged for ``step``. From an event the last
    one wins (a resumed run that saves the step again replaces it); from a manifest only
    when no event brought one. Anything not shaped like a fingerprint is ignored."""
    if not isinstance(data, dict) or data.get("format") != FINGERPRINT_FORMAT:
        return False
    tensors = data.get("tensors")
    if not isinstance(step, int) or not isinstance(tensors, dict) or data.get("step") != step:
        logger.warning("job %s: malformed state fingerprint for step %r ignored", job.id, step)
        return False
    values = {"data": data, "tensors": len(tensors), "source": source}
    if source == StateFingerprint.Source.EVENT:
        StateFingerprint.objects.update_or_create(job=job, step=step, defaults=values)
        return True
    _, created = StateFingerprint.objects.get_or_create(job=job, step=step, defaults=values)
    return created


def checkpoint_register(
    *, job: Job, manifest_path: str, manifest: dict[str, Any]
) -> Checkpoint | None:
    """Register a checkpoint once, from its manifest (written last by the trainer)."""
    try:
        step = int(manifest["step"])
        files = list(manifest.get("files") or [])
    except (KeyError, TypeError, ValueError):
        logger.warning("job %s: unreadable manifest %s", job.id, manifest_path)
        return None
    size = manifest.get("total_bytes")
    if not isinstance(size, int):
        size = sum(int(f.get("size") or 0) for f in files if isinstance(f, dict))
    created = manifest.get("created")
    saved_at = None
    if isinstance(created, int | float):
        saved_at = datetime.fromtimestamp(float(created), tz=UTC)
    elif isinstance(created, str):
        try:
            saved_at = datetime.fromisoformat(created.replace("Z", "+00:00"))
        except ValueError:
            saved_at = None
    # The fingerprint is kept once, in its own table (the manifest's copy is dropped).
    fingerprint = manifest.pop("fingerprint", None)
    fingerprint_store(job=job, step=step, data=fingerprint, source=StateFingerprint.Source.MANIFEST)
    checkpoint, created_now = Checkpoint.objects.get_or_create(
        job=job,
        step=step,
        defaults={
            "path": manifest_path.rsplit("/", 1)[0],
            "size_bytes": size,
            "file_count": len(files),
            "state_keys": list(manifest.get("state_keys") or []),
            "world_size": manifest.get("world_size"),
            "manifest": manifest,
            "saved_at": saved_at,
        },
    )
    if created_now:
        job_event(
            job,
            "checkpoint",
            message=f"checkpoint at step {step} registered ({size} bytes, {len(files)} files)",
        )
        return checkpoint
    return None
