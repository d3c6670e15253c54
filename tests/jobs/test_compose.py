"""The submit form from the inventory: partition and GPU type selects, bounds, the live
check (the API's validation, as JSON), presets with model size and measured step time,
checkpoint-interval advice."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from factories import ClusterFactory, GpuFactory, JobFactory, NodeFactory, PartitionFactory
from jobs.compose.inventory import gpu_type_label, partition_label, submit_inventory
from jobs.compose.presets import model_parameters, preset_descriptions
from jobs.models import Job, MetricPoint
from nodes.models import Node
from trainer.config import PRESETS
from trainer.config import validate as trainer_config_validate

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster() -> Any:
    cluster = ClusterFactory(name="devcluster", is_default=True, default_partition="batch")
    PartitionFactory(cluster=cluster, name="batch", max_time_minutes=60, is_default=True)
    PartitionFactory(cluster=cluster, name="gpu", max_time_minutes=120)
    for name, partition, gpus, state in [
        ("n1", "batch", [("a100", 2)], Node.State.IDLE),
        ("n2", "batch", [("a100", 1)], Node.State.ALLOCATED),
        ("n3", "gpu", [("h100", 4)], Node.State.IDLE),
        ("n4", "gpu", [("h100", 4), ("l40", 1)], Node.State.MIXED),
        ("n5", "gpu", [("h100", 4)], Node.State.IDLE),
    ]:
        node = NodeFactory(
            cluster=cluster, name=name, partitions=[partition], cpus_total=8, state=state
        )
        index = 0
        for gpu_type, count in gpus:
            for _ in range(count):
                GpuFactory(node=node, index=index, gpu_type=gpu_type)
                index += 1
    return cluster


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_inventory_per_partition(cluster: Any) -> None:
    (found,) = submit_inventory()
    assert found["name"] == "devcluster" and found["is_default"]
    by_name = {p["name"]: p for p in found["partitions"]}
    batch, gpu = by_name["batch"], by_name["gpu"]
    assert (batch["nodes"], batch["idle_nodes"], batch["usable_nodes"]) == (2, 1, 1)
    assert (gpu["nodes"], gpu["idle_nodes"], gpu["usable_nodes"]) == (3, 2, 3)
    assert batch["gpu_types"] == [
        {
            "name": "a100",
            "max_per_node": 2,
            "per_node": [{"gpus": 2, "nodes": 1}, {"gpus": 1, "nodes": 1}],
            "nodes": 2,
        }
    ]
    assert [t["name"] for t in gpu["gpu_types"]] == ["h100", "l40"]
    assert gpu["max_gpus_per_node"] == 5 and gpu["max_time_minutes"] == 120
    assert partition_label(gpu) == "gpu — 3 nodes, 2 idle · h100 ×4/node, l40 ×1/node"
    assert (
        gpu_type_label(batch["gpu_types"][0]) == "a100 — 2 per node on 1 node, 1 per node on 1 node"
    )


def test_the_form_offers_what_the_partition_has(cluster: Any, researcher: Any) -> None:
    html = signed_in(researcher).get("/jobs/new/").content.decode()
    assert '<option value="batch" selected>batch — 2 nodes, 1 idle · a100 ×2/node</option>' in html
    assert '<option value="gpu">gpu — 3 nodes, 2 idle · h100 ×4/node, l40 ×1/node</option>' in html
    # The GPU types of the default partition only, with their per-node counts.
    assert '<option value="a100">a100 — 2 per node on 1 node, 1 per node on 1 node</option>' in html
    assert '<option value="h100">' not in html
    # Numbers bounded by what the partition has.
    assert 'name="nodes" value="1" min="1" max="2"' in html
    assert 'name="time_limit_minutes" value="30" min="1" max="60"' in html
    assert 'id="inventory-data"' in html

    chosen = signed_in(researcher).post("/jobs/new/", {"cluster": cluster.pk, "partition": "gpu"})
    assert '<option value="h100">h100 — 4 per node on 3 nodes</option>' in chosen.content.decode()


def _form(cluster: Any, **changes: Any) -> dict[str, Any]:
    data = {
        "cluster": cluster.pk,
        "name": "live",
        "preset": "tiny",
        "steps": 20,
        "precision": "fp32",
        "checkpoint_every": 10,
        "seed": 0,
        "partition": "gpu",
        "nodes": 2,
        "gpus_per_node": 4,
        "gpu_type": "h100",
        "cpus_per_task": 1,
        "tasks_per_node": 1,
        "time_limit_minutes": 30,
    }
    data.update(changes)
    return data


def test_the_live_check_uses_the_apis_validation(cluster: Any, researcher: Any) -> None:
    client = signed_in(researcher)
    impossible = client.post("/jobs/new/check/", _form(cluster, gpus_per_node=5)).json()
    assert impossible["ok"] is False and impossible["script"] is None
    assert impossible["errors"] == {
        "gpus_per_node": ["no node in partition gpu has more than 4 h100 GPUs; 5 requested"]
    }
    # The same words the API gives for the same request.
    api = client.post(
        "/api/v1/jobs/preview/",
        {"name": "live", "partition": "gpu", "nodes": 2, "gpus_per_node": 5, "gpu_type": "h100"},
        content_type="application/json",
    ).json()
    assert api["extra"]["fields"]["gpus_per_node"] == impossible["errors"]["gpus_per_node"]

    fine = client.post("/jobs/new/check/", _form(cluster)).json()
    assert fine["ok"] is True and fine["errors"] == {}
    assert "#SBATCH --gpus-per-node=h100:4" in fine["script"]
    assert fine["advice"]["feasible"] is True and len(fine["advice"]["nodes"]) == 2
    assert fine["partition"]["name"] == "gpu"
    assert not Job.objects.exists()

    # No name typed yet: the script still shows, and no error is made up for the name.
    unnamed = client.post("/jobs/new/check/", _form(cluster, name="")).json()
    assert unnamed["ok"] is True and "name" not in unnamed["errors"]

    bad_json = client.post("/jobs/new/check/", _form(cluster, extra_config="{nope")).json()
    assert "not valid JSON" in bad_json["errors"]["extra_config"][0]


def test_the_live_check_needs_a_role_and_csrf(cluster: Any, outsider: Any, researcher: Any) -> None:
    assert signed_in(outsider).post("/jobs/new/check/", _form(cluster)).status_code == 403
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(researcher)
    assert strict.post("/jobs/new/check/", _form(cluster)).status_code == 403
    assert signed_in(researcher).get("/jobs/new/check/").status_code == 405


def test_model_size_matches_the_trainers_model() -> None:
    torch = pytest.importorskip("torch")
    from trainer.model import TinyGPT, n_params

    for name in PRESETS:
        config = trainer_config_validate({"preset": name})
        assert model_parameters(config) == n_params(TinyGPT(config))
    odd = trainer_config_validate({"preset": "tiny", "d_ff": 100, "n_layers": 3})
    assert model_parameters(odd) == n_params(TinyGPT(odd))
    assert torch is not None


def _past_job(cluster: Any, preset: str, step_times: list[float], blocking: float = 0.0) -> Job:
    job = JobFactory(
        cluster=cluster,
        partition="gpu",
        config={"preset": preset},
        state=Job.State.COMPLETED,
        last_step=len(step_times),
        started_at=timezone.now() - timedelta(hours=2),
        ended_at=timezone.now() - timedelta(hours=1),
        nodes=1,
        gpus_per_node=1,
    )
    MetricPoint.objects.bulk_create(
        MetricPoint(
            job=job,
            step=index + 1,
            wall_time=timezone.now(),
            step_time_s=value,
            checkpoint_blocking_s=blocking if (index + 1) % 10 == 0 else 0.0,
        )
        for index, value in enumerate(step_times)
    )
    return job


def test_presets_with_measured_step_time_or_unknown(cluster: Any) -> None:
    _past_job(cluster, "tiny", [0.1] * 20)
    _past_job(cluster, "tiny", [0.3] * 20)
    _past_job(cluster, "tiny", [0.2] * 20)
    described = {p["name"]: p for p in preset_descriptions(cluster=cluster, partition="gpu")}
    assert described["tiny"]["step_time_s"] == pytest.approx(0.2)
    assert described["tiny"]["step_time_jobs"] == 3
    assert described["small"]["step_time_s"] is None and described["small"]["step_time_jobs"] == 0
    assert described["small"]["size"].endswith("M parameters")
    other = {p["name"]: p for p in preset_descriptions(cluster=cluster, partition="batch")}
    assert other["tiny"]["step_time_s"] is None


def test_checkpoint_advice_needs_history(cluster: Any, researcher: Any) -> None:
    client = signed_in(researcher)
    none_yet = client.post("/jobs/new/check/", _form(cluster)).json()["checkpoint_advice"]
    assert none_yet["history"] is False and "No history on this cluster yet" in none_yet["words"]

    _past_job(cluster, "tiny", [0.5] * 100, blocking=2.0)
    advice = client.post("/jobs/new/check/", _form(cluster)).json()["checkpoint_advice"]
    assert advice["history"] is True
    assert advice["inputs"]["checkpoint_cost_s"] == pytest.approx(2.0)
    assert advice["step_time_s"] == pytest.approx(0.5)
    # Every 10 steps of 0.5 s is every 5 s; Young/Daly sqrt(2 C M) is far longer here.
    assert advice["current_interval_s"] == pytest.approx(5.0)
    assert advice["optimal_interval_s"] > advice["current_interval_s"]
    assert advice["optimal_checkpoint_every"] == round(advice["optimal_interval_s"] / 0.5)
    assert "Young/Daly" in advice["words"] and "Every 10 steps" in advice["words"]
    presets = client.post("/jobs/new/check/", _form(cluster)).json()["presets"]
    assert {p["name"]: p["step_time_jobs"] for p in presets}["tiny"] == 1


def test_the_live_script_is_the_one_that_runs(cluster: Any, researcher: Any) -> None:
    client = signed_in(researcher)
    html = client.get("/jobs/new/").content.decode()
    marker = 'name="job_id" value="'
    job_id = html[html.index(marker) + len(marker) :].split('"', 1)[0]
    checked = client.post("/jobs/new/check/", _form(cluster, job_id=job_id)).json()
    assert f"# Gantry job {job_id}:" in checked["script"]

    submitted = client.post("/jobs/new/", {**_form(cluster, job_id=job_id), "action": "submit"})
    assert submitted.status_code == 302
    job = Job.objects.get()
    assert str(job.id) == job_id and f"/runs/{job_id}" in checked["script"]
    # The same form sent again (a double click, a reload) makes no second job.
    again = client.post("/jobs/new/", {**_form(cluster, job_id=job_id), "action": "submit"})
    assert again.status_code == 200 and "exists already" in again.content.decode()
    assert Job.objects.count() == 1
