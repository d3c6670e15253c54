"""Storing what the trainer wrote: metric points from ``metrics.jsonl`` and checkpoints
from their manifests. The watcher (``jobs.rundir``) reads the bytes; this stores them.

Metric points are stored exactly once per step (the last line for a step wins) under a
conditional update of the job's read offset, so two watchers reading the same bytes
cannot store them twice.
"""

from __future__ import annotations

import json
import logging
import math
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction

from jobs import checkpoint_state
from jobs.lifecycle import job_event
from jobs.metric_retention import rollups_invalidate_from, stored_totals
from jobs.models import Checkpoint, Job, JobEvent, MetricPoint, StateFingerprint
from jobs.stragglers import rank_timing_update
from trainer.schema import FINGERPRINT_FORMAT, METRIC_KEYS, Event, manifest_digest

logger = logging.getLogger(__name__)

# The longest metrics line read: one with a ``ranks`` entry for every rank of the largest
# world (``_MAX_WORLD``) fits; a longer one is skipped unread.
METRICS_LINE_MAX_BYTES = 4 << 20

# Trainer events that go on the job's timeline.
_TIMELINE_EVENTS = {Event.TARGET_REACHED, Event.DONE, Event.RESUMED, Event.CHECKPOINT_FAILED}


def metrics_ingest(*, job: Job, data: bytes, start_offset: int) -> tuple[int, int]:
    """Store the complete lines of ``data`` (read from ``start_offset``); returns
    (points stored, new offset). A partial last line waits for the next read."""
    end = data.rfind(b"\n")
    if end < 0:
        return 0, _past_an_overlong_line(job, data, start_offset)
    complete = data[: end + 1]
    # Rows in the database's own types, built straight from the lines: model objects and
    # per-value field preparation cost more than the parsing itself.
    job_key = MetricPoint._meta.get_field("job").get_db_prep_value(job.id, connection)
    adapt_time = connection.ops.adapt_datetimefield_value
    points: dict[int, tuple[Any, ...]] = {}
    events: list[dict[str, Any]] = []
    rank_lines: list[tuple[int, Any]] = []
    get_keys = _METRIC_LINE_KEYS
    # The lowest and highest step of the chunk with their wall times (the job's sums).
    low_step, low_wall, high_step, high_wall = _MAX_STEP + 1, None, -1, None
    for line in _parse_lines(job, complete):
        if "event" in line:
            events.append(line)
            continue
        try:
            step = int(line["step"])
            wall = datetime.fromtimestamp(float(line["time"]), tz=UTC)
        except (KeyError, TypeError, ValueError, OverflowError, OSError):
            continue
        # Outside the columns' ranges a value would fail the whole batch (and every retry).
        if not 0 <= step <= _MAX_STEP:
            continue
        # The last line for a step wins, here as in the rows.
        if step >= high_step:
            high_step, high_wall = step, wall
        if step <= low_step:
            low_step, low_wall = step, wall
        get = line.get
        if "ranks" in line:
            rank_lines.append((step, line["ranks"]))
        world_size = get("world_size")
        points[step] = (
            job_key,
            step,
            adapt_time(wall),
            *(_float_or_none(get(key)) for key in get_keys),
            world_size if type(world_size) is int and 0 <= world_size <= _MAX_WORLD else None,
        )
    new_offset = start_offset + len(complete)
    with transaction.atomic():
        # Conditional on the offset we read from: a racing watcher cannot double-store.
        updates: dict[str, Any] = {"metrics_offset": new_offset, **_newest_updates(job, points)}
        # The job's point sums move with the offset: added to when the chunk only appends
        # to the job's steps, summed again in the database after the upsert otherwise.
        appends = job.points_totals_offset == start_offset and (
            job.points_last_step is None or low_step > job.points_last_step
        )
        if appends:
            updates.update(
                _totals_after_append(job, points, low_wall, high_step, high_wall, new_offset)
            )
        updates.update(_event_updates(job, events))
        updates.update(_rank_timing_updates(job, rank_lines))
        if not Job.objects.filter(id=job.id, metrics_offset=start_offset).update(**updates):
            return 0, start_offset
        if points and not appends:
            _rollups_superseded(job.id, min(points))
        if points:
            _metric_points_upsert(list(points.values()))
        if not appends:
            updates.update(_totals_from_database(job.id, new_offset))
            Job.objects.filter(id=job.id).update(
                **{key: value for key, value in updates.items() if key.startswith("points_")}
            )
        _events_store(job, events)
    job.metrics_offset = new_offset
    for key, value in updates.items():
        if key.startswith("points_") or key in ("rank_timing", "nonfinite_loss_step"):
            setattr(job, key, value)
    return len(points), new_offset


def _rank_timing_updates(job: Job, rank_lines: list[tuple[int, Any]]) -> dict[str, Any]:
    """The job's straggler state (``jobs.stragglers``) after the chunk's per-rank timings,
    each line judged within what Slurm allocated to the job (its world size, its nodes):
    a line naming another node or more ranks is no evidence."""
    if not rank_lines:
        return {}
    timing = job.rank_timing
    # Expanded once per chunk (the hostlist, not once per line).
    allocated = frozenset(job.allocated_node_names)
    for step, ranks in sorted(rank_lines, key=lambda item: item[0]):
        timing = rank_timing_update(
            timing, step, ranks, world_size=job.world_size, allocated_nodes=allocated
        )
    return {"rank_timing": timing}


def _events_store(job: Job, events: list[dict[str, Any]]) -> None:
    """The trainer's events of the chunk: timeline entries and checkpoint fingerprints."""
    for event in events:
        kind = str(event.get("event"))
        if kind in _TIMELINE_EVENTS:
            job_event(job, kind, message=_describe_trainer_event(event))
        elif kind == Event.CHECKPOINT:
            fingerprint_store(job=job, step=event.get("step"), data=event.get("fingerprint"))


def _newest_updates(job: Job, points: dict[int, tuple[Any, ...]]) -> dict[str, Any]:
    """The job's newest step and its throughput now (mean of the newest five steps), and
    the first step whose loss was not a finite number (recovery's evidence)."""
    if not points:
        return {}
    updates: dict[str, Any] = {"last_step": max(points)}
    if job.nonfinite_loss_step is None:
        # loss is the 5th column of a row.
        bad = [
            step
            for step, row in points.items()
            if isinstance(row[4], float) and not math.isfinite(row[4])
        ]
        if bad:
            updates["nonfinite_loss_step"] = min(bad)
    # samples_per_s is the 6th column of a row.
    newest = [points[step][5] for step in sorted(points)[-5:]]
    rates = [rate for rate in newest if rate is not None]
    if rates:
        updates["throughput_now"] = sum(rates) / len(rates)
    return updates


def _event_updates(job: Job, events: list[dict[str, Any]]) -> dict[str, Any]:
    """What the trainer's events set on the job: the known optimum and the quality target,
    and when the target was reached."""
    updates: dict[str, Any] = {}
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
    return updates


def _totals_after_append(
    job: Job,
    points: dict[int, tuple[Any, ...]],
    low_wall: datetime | None,
    high_step: int,
    high_wall: datetime | None,
    new_offset: int,
) -> dict[str, Any]:
    """The job's point sums with the chunk's rows added (every row a step after the
    job's newest stored one). Row columns: see ``_METRIC_COLUMNS``."""
    updates: dict[str, Any] = {"points_totals_offset": new_offset}
    if not points:
        return updates
    rows = points.values()
    first = job.points_count == 0
    updates.update(
        points_count=job.points_count + len(points),
        points_last_step=high_step,
        points_step_time_s=job.points_step_time_s + _column_sum(rows, 7),
        points_data_time_s=job.points_data_time_s + _column_sum(rows, 8),
        points_blocking_s=job.points_blocking_s + _column_sum(rows, 9),
        points_last_wall=high_wall,
    )
    if first:
        updates.update(points_first_wall=low_wall, points_first_elapsed_s=points[min(points)][3])
    return updates


def _column_sum(rows: Any, index: int) -> float:
    # SUM in SQL skips NULLs; so does this.
    return float(sum(value for row in rows if (value := row[index]) is not None))


def _rollups_superseded(job_id: Any, low_step: int) -> None:
    """A chunk that may rewrite stored steps from ``low_step`` on: roll-ups of those steps
    (``jobs.metric_retention``) go, so the replayed steps are not counted twice. The
    caller's conditional offset update holds the job's row, as retention's batches do, so
    the watermark read here is current."""
    watermark = Job.objects.filter(id=job_id).values_list("metrics_rolled_up_to", flat=True)
    current = watermark.first()
    if current is None or low_step > current:
        return
    lowered = rollups_invalidate_from(job_id=job_id, step=low_step, watermark=current)
    Job.objects.filter(id=job_id).update(metrics_rolled_up_to=lowered)


def _totals_from_database(job_id: Any, new_offset: int) -> dict[str, Any]:
    """The job's point sums read from the stored points and roll-ups (a few indexed
    queries): after a chunk that rewrote stored steps, or for a job whose sums were not
    kept."""
    sums = stored_totals(job_id)
    return {
        "points_count": sums["count"],
        "points_last_step": sums["last"],
        "points_step_time_s": sums["step_time"],
        "points_data_time_s": sums["data_time"],
        "points_blocking_s": sums["blocking"],
        "points_first_wall": sums["first_wall"],
        "points_first_elapsed_s": sums["first_elapsed"],
        "points_last_wall": sums["last_wall"],
        "points_totals_offset": new_offset,
        "points_rebuilt_offset": new_offset,
    }


def point_totals_refresh(*, job_ids: list[Any]) -> None:
    """Sum the stored points of ``job_ids`` into their ``points_*`` columns, current at
    their offsets: for points that did not come through ingest (a bulk load)."""
    for job_id, offset in Job.objects.filter(id__in=job_ids).values_list("id", "metrics_offset"):
        Job.objects.filter(id=job_id, metrics_offset=offset).update(
            **_totals_from_database(job_id, offset)
        )


def _past_an_overlong_line(job: Job, data: bytes, start_offset: int) -> int:
    """Where to read on from when ``data`` holds no newline: where it starts (the line
    waits for its end), unless it is longer than any line of metrics can be: then past it
    (its end, in the next read, does not parse and is skipped too), not wait forever."""
    if len(data) < METRICS_LINE_MAX_BYTES:
        return start_offset
    past = start_offset + len(data)
    # As the lines' own update: only from the offset it was read at (nothing twice).
    if not Job.objects.filter(id=job.id, metrics_offset=start_offset).update(metrics_offset=past):
        return start_offset
    logger.warning("job %s: a metrics line over %d bytes skipped", job.id, len(data))
    job.metrics_offset = past
    return past


def _parse_lines(job: Job, complete: bytes) -> list[dict[str, Any]]:
    """The JSON objects of complete lines, in order. One ``json.loads`` for the whole chunk
    (a JSON array of the lines) when every line parses, which costs a third less than one
    call per line; a chunk with a bad line is parsed again line by line, skipping (and
    logging) only the bad ones."""
    raws = [raw for raw in complete.split(b"\n") if raw.strip()]
    if not raws:
        return []
    try:
        parsed = json.loads(b"[" + b",".join(raws) + b"]")
        if len(parsed) == len(raws):
            return [line for line in parsed if isinstance(line, dict)]
    except ValueError:
        pass
    lines = []
    bad: list[bytes] = []
    for raw in raws:
        try:
            line = json.loads(raw)
        except (ValueError, RecursionError):
            bad.append(raw)
            continue
        if isinstance(line, dict):
            lines.append(line)
    if bad:
        # One log line per chunk, however many bad lines it holds (the job writes them).
        logger.warning(
            "job %s: %d unreadable metrics line(s) skipped, the first: %r",
            job.id,
            len(bad),
            bad[0][:200],
        )
    return lines


def _float_or_none(value: Any) -> float | None:
    # bool is an int to Python but never a metric value.
    kind = type(value)
    if kind is float:
        return value  # type: ignore[no-any-return]
    if kind is int:
        return float(value)
    return None


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
    """Insert metric points, the last line for a step winning (``rows`` holds one row per
    step). PostgreSQL: COPY into a temporary table, then one INSERT … SELECT … ON CONFLICT
    (COPY skips per-value parameter handling, where the time went); few rows (a live job's
    cycle) go as one multi-row INSERT, cheaper than a COPY round. SQLite: one prepared
    statement run with executemany."""
    if connection.vendor == "postgresql" and len(rows) >= _COPY_MIN_ROWS:
        _metric_points_copy(rows)
        return
    table = MetricPoint._meta.db_table
    quote = connection.ops.quote_name
    columns = ", ".join(quote(column) for column in _METRIC_COLUMNS)
    row_marks = "(" + ", ".join(["%s"] * len(_METRIC_COLUMNS)) + ")"
    conflict = _on_conflict()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            sql = (
                f"INSERT INTO {quote(table)} ({columns}) VALUES "  # noqa: S608 - fixed names
                + ", ".join([row_marks] * len(rows))
                + f" {conflict}"
            )
            cursor.execute(sql, [value for row in rows for value in row])
        else:
            sql = f"INSERT INTO {quote(table)} ({columns}) VALUES {row_marks} {conflict}"  # noqa: S608
            for start in range(0, len(rows), 5000):
                cursor.executemany(sql, rows[start : start + 5000])


# The ranges of the step (integer) and world_size (smallint) columns.
_MAX_STEP = 2**31 - 1
_MAX_WORLD = 2**15 - 1
# Below this many rows a multi-row INSERT beats COPY's extra statements on PostgreSQL.
_COPY_MIN_ROWS = 200
# The staging table: temporary (one per database session), emptied at every commit.
_STAGE_TABLE = "gantry_metricpoint_stage"


def _on_conflict() -> str:
    quote = connection.ops.quote_name
    updates = ", ".join(
        f"{quote(column)} = excluded.{quote(column)}" for column in _METRIC_COLUMNS[2:]
    )
    return f"ON CONFLICT ({quote('job_id')}, {quote('step')}) DO UPDATE SET {updates}"


def _metric_points_copy(rows: list[tuple[Any, ...]]) -> None:
    """PostgreSQL only: binary COPY (psycopg 3's ``Cursor.copy``). Rows that only append
    to the job's series (every step after the newest stored one: a run being caught up)
    go straight into the table; rows that may replace stored steps (a resumed run writing
    them again) go into a session-local temporary table first and are upserted from there
    in one statement. The caller holds the job's row (its conditional offset update), so
    no other watcher adds points of this job meanwhile."""
    table = connection.ops.quote_name(MetricPoint._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(column) for column in _METRIC_COLUMNS)
    job_id, first_step = rows[0][0], min(row[1] for row in rows)
    # Its own atomic block (a savepoint inside the caller's): outside a transaction each
    # statement would commit, and the commit would empty the staging table mid-way.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"SELECT MAX({connection.ops.quote_name('step')}) FROM {table} "  # noqa: S608
            f"WHERE {connection.ops.quote_name('job_id')} = %s",
            [job_id],
        )
        newest = cursor.fetchone()[0]
        append_only = newest is None or first_step > newest
        target = table
        if not append_only:
            target = _STAGE_TABLE
            stage = (
                f"CREATE TEMPORARY TABLE IF NOT EXISTS {_STAGE_TABLE} ON COMMIT DELETE ROWS "  # noqa: S608
                f"AS SELECT {columns} FROM {table} WITH NO DATA"
            )
            cursor.execute(stage)
        raw = cursor.cursor  # the psycopg cursor under Django's wrapper
        with raw.copy(f"COPY {target} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:  # type: ignore[union-attr]
            copy.set_types(_COPY_TYPES)
            for row in rows:
                copy.write_row(row)
        if append_only:
            return
        cursor.execute(
            f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {_STAGE_TABLE} "  # noqa: S608
            f"{_on_conflict()}"
        )
        # ON COMMIT DELETE ROWS empties it at commit; this empties it now, should the
        # caller's transaction go on to upsert again before committing.
        cursor.execute(f"TRUNCATE {_STAGE_TABLE}")


# PostgreSQL types of ``_METRIC_COLUMNS``, in order, for binary COPY.
_COPY_TYPES = ["uuid", "int4", "timestamptz", *["float8"] * 7, "int2"]


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


_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def finite_json(value: Any) -> Any:
    """``value`` with every non-finite float as the string JSON would need for it
    (``"NaN"``, ``"Infinity"``, ``"-Infinity"``); ``nonfinite_restored`` reverses it."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite_json(item) for item in value]
    return value


def nonfinite_restored(value: Any, *, key: str = "") -> Any:
    """A stored fingerprint with its non-finite floats back (where ``finite_json`` put a
    string in place of a number: the fields ``sum``, ``sumsq`` and ``sketch``)."""
    if isinstance(value, dict):
        return {k: nonfinite_restored(item, key=k) for k, item in value.items()}
    if isinstance(value, list):
        return [nonfinite_restored(item, key=key) for item in value]
    if key in ("sum", "sumsq", "sketch") and isinstance(value, str) and value in _NONFINITE:
        return _NONFINITE[value]
    return value


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
    # A state that went NaN (a diverged run) has non-finite sums: JSON has no such numbers
    # and the database's JSON check refuses them, so they are kept as strings.
    values = {"data": finite_json(data), "tensors": len(tensors), "source": source}
    if source == StateFingerprint.Source.EVENT:
        StateFingerprint.objects.update_or_create(job=job, step=step, defaults=values)
        return True
    _, created = StateFingerprint.objects.get_or_create(job=job, step=step, defaults=values)
    return created


def checkpoint_register(
    *, job: Job, manifest_path: str, manifest: dict[str, Any]
) -> Checkpoint | None:
    """Register a checkpoint once, from its manifest (written last by the trainer), with
    the manifest's digest (``trainer.schema.manifest_digest``): drills and integrity checks
    hold the checkpoint directory to this step and digest, not to what it says later."""
    try:
        step = int(manifest["step"])
        files = list(manifest.get("files") or [])
        # What drills and integrity checks hold the checkpoint directory to from now on.
        digest = manifest_digest(manifest)
    except (KeyError, TypeError, ValueError, RecursionError):
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
    checkpoint = checkpoint_state.checkpoint_register(
        job=job,
        step=step,
        values={
            "path": manifest_path.rsplit("/", 1)[0],
            "size_bytes": size,
            "file_count": len(files),
            "state_keys": list(manifest.get("state_keys") or []),
            "world_size": manifest.get("world_size"),
            "manifest": manifest,
            "manifest_digest": digest,
            "saved_at": saved_at,
        },
    )
    if checkpoint is not None:
        job_event(
            job,
            JobEvent.Kind.CHECKPOINT,
            message=f"checkpoint at step {step} registered ({size} bytes, {len(files)} files)",
        )
        return checkpoint
    return None
