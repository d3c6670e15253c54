"""Reading metrics.jsonl by offset: complete lines only, bulk stored, downsampled reads."""

from __future__ import annotations

import json
from typing import Any

import pytest

from factories import JobFactory
from jobs.ingest import checkpoint_register, metrics_ingest
from jobs.models import Job, MetricPoint
from jobs.selectors import job_metrics

pytestmark = pytest.mark.django_db


def lines(steps: range, **extra: Any) -> bytes:
    out = []
    for step in steps:
        out.append(
            json.dumps(
                {
                    "step": step,
                    "time": 1_800_000_000 + step,
                    "elapsed": float(step),
                    "loss": 3.0 - step / 1000,
                    "samples_per_s": 100.0,
                    "tokens_per_s": 6400.0,
                    "step_time": 0.1,
                    "data_time": 0.01,
                    "checkpoint_blocking_time": 0.0,
                    "world_size": 2,
                    **extra,
                }
            )
        )
    return ("\n".join(out) + "\n").encode()


def test_a_partial_last_line_waits_for_the_next_read() -> None:
    job = JobFactory()
    data = lines(range(1, 4)) + b'{"step": 4, "time": 18000'
    stored, offset = metrics_ingest(job=job, data=data, start_offset=0)
    assert stored == 3
    assert offset == data.rfind(b"\n") + 1
    # The next read starts at the stored offset and completes line 4.
    stored, offset2 = metrics_ingest(job=job, data=lines(range(4, 6)), start_offset=offset)
    assert stored == 2
    assert list(MetricPoint.objects.filter(job=job).values_list("step", flat=True)) == [
        1,
        2,
        3,
        4,
        5,
    ]
    assert Job.objects.get(id=job.id).metrics_offset == offset2


def test_a_stale_offset_stores_nothing_twice() -> None:
    job = JobFactory()
    data = lines(range(1, 11))
    metrics_ingest(job=job, data=data, start_offset=0)
    # A second watcher that read from the old offset loses the race: nothing is stored.
    job.metrics_offset = 0
    stored, offset = metrics_ingest(job=job, data=data, start_offset=0)
    assert (stored, offset) == (0, 0)
    assert MetricPoint.objects.filter(job=job).count() == 10


def test_events_set_the_target_and_optimum() -> None:
    job = JobFactory()
    data = (
        json.dumps({"event": "start", "optimal_loss": 1.07, "target_loss": 1.12}).encode()
        + b"\n"
        + lines(range(1, 3))
        + json.dumps({"event": "target_reached", "step": 2, "elapsed": 1.5}).encode()
        + b"\n"
    )
    metrics_ingest(job=job, data=data, start_offset=0)
    job.refresh_from_db()
    assert (job.optimal_loss, job.target_loss, job.target_reached_step) == (1.07, 1.12, 2)
    assert job.events.filter(kind="target_reached").exists()


def test_downsampling_keeps_at_most_max_points_and_the_last_step() -> None:
    job = JobFactory()
    metrics_ingest(job=job, data=lines(range(1, 5001)), start_offset=0)
    full = job_metrics(job=job, max_points=2000)
    assert full["count"] == 5000 and full["downsampled"]
    assert len(full["step"]) <= 2000 and full["step"][-1] == 5000
    ranged = job_metrics(job=job, step_min=100, step_max=199)
    assert ranged["step"] == list(range(100, 200)) and not ranged["downsampled"]


def test_a_checkpoint_registers_once() -> None:
    job = JobFactory()
    manifest = {
        "step": 20,
        "world_size": 2,
        "files": [{"name": "rank-00000.pt", "size": 10}, {"name": "rank-00001.pt", "size": 5}],
        "state_keys": ["model", "optimizer"],
        "created": 1_800_000_000.5,
    }
    path = f"/w/runs/{job.id}/checkpoints/step-000020/manifest.json"
    first = checkpoint_register(job=job, manifest_path=path, manifest=manifest)
    assert first is not None and first.size_bytes == 15 and first.file_count == 2
    assert first.path == f"/w/runs/{job.id}/checkpoints/step-000020"
    assert checkpoint_register(job=job, manifest_path=path, manifest=manifest) is None
    assert job.checkpoints.count() == 1


def test_a_bad_line_in_a_large_chunk_skips_only_that_line() -> None:
    # Large enough for the COPY path on PostgreSQL; the bad line forces the per-line parse.
    job = JobFactory()
    good = lines(range(1, 600)).splitlines(keepends=True)
    data = b"".join(good[:300]) + b"{not json\n" + b"[1, 2]\n" + b"".join(good[300:])
    stored, offset = metrics_ingest(job=job, data=data, start_offset=0)
    assert (stored, offset) == (599, len(data))
    steps = list(MetricPoint.objects.filter(job=job).values_list("step", flat=True))
    assert steps == list(range(1, 600))


@pytest.mark.parametrize("count", [10, 700])
def test_the_last_line_for_a_step_wins_and_values_round_trip(count: int) -> None:
    # 10 rows: a multi-row INSERT; 700: COPY through the staging table on PostgreSQL.
    job = JobFactory()
    first = lines(range(1, count + 1))
    again = lines(range(count // 2, count + 1), loss=0.25, world_size=4)
    stored, offset = metrics_ingest(job=job, data=first + again, start_offset=0)
    assert stored == count
    # A second chunk in the same process re-writes steps already stored (a resumed run).
    more = lines(range(count - 2, count + 3), loss=0.5)
    stored, _ = metrics_ingest(job=job, data=more, start_offset=offset)
    assert stored == 5
    rows = {p.step: p for p in MetricPoint.objects.filter(job=job)}
    assert sorted(rows) == list(range(1, count + 3))
    assert rows[1].loss == 3.0 - 1 / 1000 and rows[1].world_size == 2
    assert rows[count // 2].loss == 0.25 and rows[count // 2].world_size == 4
    assert rows[count].loss == 0.5 and rows[count + 2].loss == 0.5
    assert rows[1].wall_time.timestamp() == 1_800_000_001
    assert rows[1].samples_per_s == 100.0 and rows[1].step_time_s == 0.1


def test_bool_and_text_values_are_not_stored_as_numbers() -> None:
    job = JobFactory()
    metrics_ingest(job=job, data=lines(range(1, 2), loss=True, world_size=True), start_offset=0)
    point = MetricPoint.objects.get(job=job)
    assert point.loss is None and point.world_size is None


@pytest.mark.parametrize("count", [3, 400])
def test_out_of_range_values_never_fail_the_batch(count: int) -> None:
    job = JobFactory()
    data = (
        lines(range(1, count + 1))
        + lines(range(-1, 0))
        + lines(range(2**31, 2**31 + 1))
        + lines(range(count + 1, count + 2), world_size=70_000)
    )
    stored, _ = metrics_ingest(job=job, data=data, start_offset=0)
    assert stored == count + 1
    assert MetricPoint.objects.get(job=job, step=count + 1).world_size is None


def test_bad_lines_log_once_per_chunk_and_an_overlong_line_is_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from jobs.ingest import METRICS_LINE_MAX_BYTES

    job = JobFactory()
    bad = b"".join(b"not json %d\n" % i for i in range(5000))
    with caplog.at_level("WARNING", logger="jobs.ingest"):
        stored, offset = metrics_ingest(job=job, data=bad + lines(range(1, 4)), start_offset=0)
    assert stored == 3 and offset == len(bad) + len(lines(range(1, 4)))
    # 5000 bad lines, one log record (with the count), not 5000.
    records = [r for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(records) == 1 and "5000" in records[0].getMessage()
    # A line longer than any line of metrics, read in pieces without a newline: the reader
    # goes on past it instead of waiting for it forever; its end does not parse; the next
    # line is stored.
    huge = b'{"step": 9, "pad": "' + b"x" * METRICS_LINE_MAX_BYTES
    _, past = metrics_ingest(job=job, data=huge, start_offset=offset)
    assert past == offset + len(huge)
    stored, end = metrics_ingest(job=job, data=b'xx"}\n' + lines(range(10, 11)), start_offset=past)
    assert stored == 1 and MetricPoint.objects.filter(job=job, step=10).exists()
    assert not MetricPoint.objects.filter(job=job, step=9).exists()
    # A partial line shorter than that still waits.
    assert metrics_ingest(job=job, data=b'{"step": 11', start_offset=end) == (0, end)
