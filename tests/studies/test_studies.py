"""Scaling studies: the maths on synthetic metric points, refusals, API access, pages."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client

from factories import (
    ClusterFactory,
    GpuFactory,
    JobFactory,
    NodeFactory,
    PartitionFactory,
    SwitchFactory,
)
from jobs.models import MetricPoint
from studies.models import ScalingStudy, StudyPoint
from studies.selectors import manifest_differences, scaling_table, steady_state, study_report

pytestmark = pytest.mark.django_db

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def rows(samples_per_s: float, step_time: float, data_time: float, n: int = 12) -> list[dict]:
    return [
        {
            "step": step,
            "samples_per_s": samples_per_s,
            "tokens_per_s": samples_per_s * 64,
            "step_time_s": step_time,
            "data_time_s": data_time,
            "checkpoint_blocking_s": 0.0,
        }
        for step in range(1, n + 1)
    ]


def test_steady_state_excludes_warmup_and_checkpoint_stalls() -> None:
    logged = rows(100.0, 0.1, 0.01)
    # Warm-up steps are slow and a checkpoint step stalls: neither may count.
    for row in logged[:3]:
        row.update(samples_per_s=10.0, step_time_s=1.0)
    logged[7].update(samples_per_s=5.0, step_time_s=2.0, checkpoint_blocking_s=1.9)
    result = steady_state(logged, warmup_steps=3)
    assert result["steps_measured"] == 8
    assert result["excluded_warmup"] == 3 and result["excluded_checkpoint"] == 1
    assert result["samples_per_s"] == 100.0 and result["step_time_s"] == 0.1
    assert result["non_data_time_s"] == pytest.approx(0.09)


def test_strong_scaling_speedup_efficiency_and_communication() -> None:
    # Global batch 16: 1 rank (batch 16) 100 samples/s; 2 ranks (batch 8 each) 150 samples/s.
    one = {"ranks": 1, "per_rank_batch": 16, **steady_state(rows(100, 0.16, 0.02), warmup_steps=2)}
    two = {"ranks": 2, "per_rank_batch": 8, **steady_state(rows(150, 0.1067, 0.01), warmup_steps=2)}
    table, estimated = scaling_table([two, one])
    assert estimated and [row["ranks"] for row in table] == [1, 2]
    assert table[0]["speedup"] == 1.0 and table[0]["efficiency"] == 1.0
    assert table[1]["speedup"] == pytest.approx(1.5)
    assert table[1]["ideal_speedup"] == 2.0
    assert table[1]["efficiency"] == pytest.approx(0.75)
    assert table[1]["ideal_samples_per_s"] == 200
    # Compute per sample from the 1-rank point: (0.16 - 0.02) / 16; at batch 8: 0.07 s.
    assert table[1]["compute_s"] == pytest.approx(0.07)
    assert table[1]["communication_s"] == pytest.approx(0.1067 - 0.01 - 0.07)
    assert table[0]["communication_s"] == pytest.approx(0.0)


def test_weak_scaling_efficiency_is_per_rank_throughput_against_the_smallest() -> None:
    two = {"ranks": 2, "per_rank_batch": 16, **steady_state(rows(180, 0.2, 0.01), warmup_steps=0)}
    four = {"ranks": 4, "per_rank_batch": 16, **steady_state(rows(320, 0.2, 0.01), warmup_steps=0)}
    table, estimated = scaling_table([two, four])
    assert table[1]["per_rank_samples_per_s"] == 80 and table[0]["per_rank_samples_per_s"] == 90
    assert table[1]["efficiency"] == pytest.approx(80 / 90)
    # No 1-rank point: compute and communication are not estimated.
    assert not estimated and table[1]["communication_s"] is None


def test_manifest_differences_name_what_differs() -> None:
    base = {
        "versions": {"torch": "2.4.0", "trainer": "1"},
        "backend": "gloo",
        "ranks": [{"device_name": "cpu"}],
        "precision": "fp32",
        "dataset_sha256": "abc",
        "seed": 0,
        "config": {"batch_size": 16, "lr": 0.001},
    }
    same = {**base, "config": {"batch_size": 8, "lr": 0.001}}
    # A 1-rank run has no communication backend: not a difference.
    assert manifest_differences({1: {**base, "backend": None}, 2: same}) == []
    assert manifest_differences({1: base, 2: same}) == []
    other = {**same, "versions": {"torch": "2.5.0", "trainer": "1"}, "precision": "bf16"}
    notes = manifest_differences({1: base, 2: other})
    assert len(notes) == 2
    assert notes[0].startswith("software versions differ") and "torch 2.5.0" in notes[0]
    assert "precision" in notes[1] and "bf16" in notes[1]


@pytest.fixture
def cluster() -> Any:
    cluster = ClusterFactory(name="dev", is_default=True)
    PartitionFactory(cluster=cluster, name="batch")
    leaf = SwitchFactory(cluster=cluster, name="leaf1")
    for name in ("n1", "n2"):
        node = NodeFactory(cluster=cluster, name=name, leaf_switch=leaf)
        for index in range(2):
            GpuFactory(node=node, index=index)
    return cluster


def create(api: Any, **overrides: Any) -> Any:
    body = {
        "name": "s",
        "kind": "strong",
        "scales": [1, 2],
        "preset": "tiny",
        "batch_size": 16,
        "warmup_steps": 2,
        "measured_steps": 10,
        "partition": "batch",
    }
    body.update(overrides)
    return api.post("/api/v1/studies/", body, format="json")


def test_strong_batch_must_divide_and_nothing_is_saved(cluster: Any, researcher_api: Any) -> None:
    response = create(researcher_api, batch_size=15)
    assert response.status_code == 400
    why = response.json()["extra"]["fields"]["batch_size"][0]
    assert "15" in why and "2 ranks" in why and "divisible" in why
    # Weak scaling has no such constraint: the per-rank batch is fixed.
    assert create(researcher_api, kind="weak", batch_size=15).status_code == 202
    assert ScalingStudy.objects.count() == 1


def test_impossible_scale_is_refused_with_the_cluster_field(
    cluster: Any, researcher_api: Any
) -> None:
    response = create(researcher_api, scales=[1, 4])
    assert response.status_code == 400
    assert "at 4 ranks" in response.json()["extra"]["fields"]["nodes"][0]
    assert create(researcher_api, scales=[2, 2]).status_code == 400


def test_api_access_by_persona(
    cluster: Any,
    researcher_api: Any,
    operator_api: Any,
    outsider_api: Any,
    anonymous_api: Any,
    other_researcher: Any,
) -> None:
    created = create(researcher_api)
    assert created.status_code == 202
    study_id = created.json()["id"]
    assert created.json()["poll"] == f"/api/v1/studies/{study_id}/"
    points = StudyPoint.objects.filter(study_id=study_id).order_by("ranks")
    assert [(p.ranks, p.nodes, p.per_rank_batch, p.global_batch) for p in points] == [
        (1, 1, 16, 16),
        (2, 2, 8, 16),
    ]
    detail = researcher_api.get(f"/api/v1/studies/{study_id}/").json()
    assert [row["ranks"] for row in detail["report"]["rows"]] == [1, 2]
    assert operator_api.get(f"/api/v1/studies/{study_id}/").status_code == 200
    assert len(operator_api.get("/api/v1/studies/").json()["results"]) == 1
    from rest_framework.test import APIClient

    other = APIClient()
    other.force_authenticate(other_researcher)
    assert other.get(f"/api/v1/studies/{study_id}/").status_code == 404
    assert other.get("/api/v1/studies/").json()["results"] == []
    assert outsider_api.get("/api/v1/studies/").status_code == 403
    assert create(outsider_api).status_code == 403
    assert anonymous_api.get("/api/v1/studies/").status_code in (401, 403)


def point_metrics(job: Any, samples_per_s: float, step_time: float) -> None:
    for row in rows(samples_per_s, step_time, 0.01):
        MetricPoint.objects.create(job=job, wall_time=NOW, **row)


def test_report_page_csv_and_weak_disclaimer(cluster: Any, researcher: Any, client: Client) -> None:
    study = ScalingStudy.objects.create(
        owner=researcher,
        cluster=cluster,
        name="weak-one",
        kind="weak",
        scales=[1, 2],
        config={"preset": "tiny"},
        batch_size=16,
        warmup_steps=2,
        measured_steps=10,
        partition="batch",
    )
    manifest = {"versions": {"torch": "2"}, "precision": "fp32", "config": {"batch_size": 16}}
    for ranks, throughput, kind in [(1, 100.0, "cpu"), (2, 160.0, "cuda")]:
        job = JobFactory(
            owner=researcher,
            cluster=cluster,
            state="completed",
            files_final=True,
            acceptance={**manifest, "ranks": [{"device_name": kind}]},
        )
        point_metrics(job, throughput, 0.16)
        StudyPoint.objects.create(
            study=study,
            ranks=ranks,
            nodes=ranks,
            tasks_per_node=1,
            per_rank_batch=16,
            global_batch=16 * ranks,
            job=job,
        )
    report = study_report(study=study)
    assert report["state"] == "completed"
    assert report["rows"][1]["efficiency"] == pytest.approx(0.8)
    assert report["differences"] and "devices differ" in report["differences"][0]
    client.force_login(researcher)
    page = client.get(f"/studies/{study.pk}/").content.decode()
    assert "not faster convergence" in page and 'id="not-comparable"' in page
    assert page.count('class="point-job"') == 2 and page.count("point-acceptance") == 2
    csv_text = client.get(f"/studies/{study.pk}/export.csv").content.decode()
    lines = csv_text.strip().splitlines()
    assert lines[0].startswith("ranks,nodes,tasks_per_node") and len(lines) == 3
    assert ",0.8," in lines[2]
    # Frozen once read: later reads need no metric scan.
    assert StudyPoint.objects.filter(study=study, results__isnull=False).count() == 2
