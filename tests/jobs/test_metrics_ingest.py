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
