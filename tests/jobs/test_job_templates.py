"""Job templates and "run again": through the API and the pages, then asserted on the
database and the audit log; who may see, change and use a template."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from core.audit import AuditAction
from core.models import AuditEvent
from factories import ClusterFactory, GpuFactory, JobFactory, NodeFactory, PartitionFactory
from jobs.compose.settings import compact_config, job_settings
from jobs.models import Job, JobEvent, JobTemplate

pytestmark = pytest.mark.django_db

JOB = {
    "name": "sweep-a",
    "partition": "gpu",
    "nodes": 2,
    "gpus_per_node": 2,
    "gpu_type": "h100",
    "time_limit_minutes": 20,
    "preset": "small",
    "config": {"steps": 40, "lr": 0.001},
    "environment": {"NCCL_DEBUG": "INFO"},
}


@pytest.fixture
def cluster() -> Any:
    cluster = ClusterFactory(name="devcluster", is_default=True, default_partition="batch")
    PartitionFactory(cluster=cluster, name="batch", max_time_minutes=60, is_default=True)
    PartitionFactory(cluster=cluster, name="gpu", max_time_minutes=120)
    for name, partition, gpu_type in [
        ("n1", "batch", "a100"),
        ("n2", "batch", "a100"),
        ("n3", "gpu", "h100"),
        ("n4", "gpu", "h100"),
    ]:
        node = NodeFactory(cluster=cluster, name=name, partitions=[partition], cpus_total=4)
        GpuFactory(node=node, index=0, gpu_type=gpu_type)
        GpuFactory(node=node, index=1, gpu_type=gpu_type)
    return cluster


def api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=user)
    return client


def page(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def create(user: Any, **body: Any) -> Any:
    data = {"name": "my sweep", "job": JOB, **body}
    return api(user).post("/api/v1/job-templates/create/", data, format="json")


def test_create_keeps_the_settings_and_is_audited(cluster: Any, researcher: Any) -> None:
    response = create(researcher, description="h100 sweep")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["owner"] == researcher.username and body["cluster"] == "devcluster"
    assert body["shared"] is False and body["can_edit"] is True
    template = JobTemplate.objects.get(pk=body["id"])
    assert template.settings["config"] == {"preset": "small", "steps": 40, "lr": 0.001}
    assert template.settings["gpu_type"] == "h100" and template.settings["nodes"] == 2
    assert template.settings["environment"] == {"NCCL_DEBUG": "INFO"}
    event = AuditEvent.objects.get(action=AuditAction.JOB_TEMPLATE_CREATE)
    assert event.actor == researcher and event.target_id == str(template.pk)
    assert event.details["cluster"] == "devcluster"


@pytest.mark.parametrize(
    ("job", "field"),
    [
        ({**JOB, "gpus_per_node": 3}, "gpus_per_node"),
        ({**JOB, "partition": "nope"}, "partition"),
        ({**JOB, "config": {"bogus": 1}}, "config.bogus"),
        ({**JOB, "name": "two\nlines"}, "name"),
    ],
)
def test_a_template_the_cluster_cannot_run_is_refused(
    cluster: Any, researcher: Any, job: dict[str, Any], field: str
) -> None:
    response = create(researcher, job=job)
    assert response.status_code == 400, response.json()
    assert set(response.json()) == {"message", "extra"}
    assert field in response.json()["extra"]["fields"]
    assert not JobTemplate.objects.exists()


def test_names_are_unique_per_owner(cluster: Any, researcher: Any, other_researcher: Any) -> None:
    assert create(researcher).status_code == 201
    again = create(researcher)
    assert again.status_code == 400
    assert "already" in again.json()["extra"]["fields"]["name"][0]
    assert create(other_researcher).status_code == 201


def test_a_private_template_is_invisible_to_others(
    cluster: Any, researcher: Any, other_researcher: Any, operator: Any, outsider: Any
) -> None:
    template_id = create(researcher).json()["id"]
    detail = f"/api/v1/job-templates/{template_id}/"
    missing = f"/api/v1/job-templates/{template_id + 1000}/"

    other = api(other_researcher)
    refused = other.get(detail)
    assert refused.status_code == 404
    # The same answer as for a template that does not exist: existence does not leak.
    assert refused.json() == other.get(missing).json()
    assert other.get("/api/v1/job-templates/").json()["results"] == []
    for action in ("submit", "update", "delete"):
        assert other.post(f"{detail}{action}/", {}, format="json").status_code == 404
    assert "my sweep" not in page(other_researcher).get("/jobs/templates/").content.decode()
    assert page(other_researcher).get(f"/jobs/new/?template={template_id}").status_code == 404
    assert page(other_researcher).post(f"/jobs/templates/{template_id}/submit/").status_code == 404

    assert api(outsider).get(detail).status_code == 403
    assert APIClient().get(detail).status_code == 401
    assert api(operator).get(detail).status_code == 200
    assert not Job.objects.exists()
    assert JobTemplate.objects.get().shared is False


def test_a_shared_template_is_used_by_others_but_changed_only_by_its_owner(
    cluster: Any, researcher: Any, other_researcher: Any
) -> None:
    template_id = create(researcher, shared=True).json()["id"]
    other = api(other_researcher)
    listed = other.get("/api/v1/job-templates/").json()["results"]
    assert [item["id"] for item in listed] == [template_id]
    assert listed[0]["can_edit"] is False

    for action, body in (("update", {"shared": False}), ("delete", {})):
        refused = other.post(f"/api/v1/job-templates/{template_id}/{action}/", body, format="json")
        assert refused.status_code == 403
    assert JobTemplate.objects.get().shared is True

    # Its environment applies to their job only once they confirm it (sent back as read).
    unconfirmed = other.post(f"/api/v1/job-templates/{template_id}/submit/", {}, format="json")
    assert unconfirmed.status_code == 400
    assert "confirm_environment" in unconfirmed.json()["extra"]["fields"]
    assert not Job.objects.exists()
    submitted = other.post(
        f"/api/v1/job-templates/{template_id}/submit/",
        {"confirm_environment": listed[0]["job"]["environment"]},
        format="json",
    )
    assert submitted.status_code == 202, submitted.json()
    job = Job.objects.get(id=submitted.json()["id"])
    # Submitted as the person who used it, with the template's settings.
    assert job.owner == other_researcher and job.state == Job.State.QUEUED
    assert (job.partition, job.nodes, job.gpus_per_node, job.gpu_type) == ("gpu", 2, 2, "h100")
    assert job.config["d_model"] == 256 and job.config["steps"] == 40 and job.config["lr"] == 0.001
    assert job.environment == {"NCCL_DEBUG": "INFO"}
    event = AuditEvent.objects.get(action=AuditAction.JOB_SUBMIT)
    assert event.actor == other_researcher and event.details["template"] == template_id
    assert JobEvent.objects.filter(job=job, kind="template").exists()


def test_owner_updates_and_deletes_with_audit(cluster: Any, researcher: Any) -> None:
    template_id = create(researcher).json()["id"]
    client = api(researcher)
    changed = client.post(
        f"/api/v1/job-templates/{template_id}/update/",
        {"shared": True, "job": {**JOB, "nodes": 1}},
        format="json",
    )
    assert changed.status_code == 200, changed.json()
    template = JobTemplate.objects.get()
    assert template.shared is True and template.settings["nodes"] == 1
    event = AuditEvent.objects.get(action=AuditAction.JOB_TEMPLATE_UPDATE)
    assert event.details["shared"] is True and "nodes" in event.details["settings"]
    assert client.post(f"/api/v1/job-templates/{template_id}/delete/").status_code == 204
    assert not JobTemplate.objects.exists()
    assert AuditEvent.objects.filter(action=AuditAction.JOB_TEMPLATE_DELETE).count() == 1


def test_operator_may_change_anyones_template(cluster: Any, researcher: Any, operator: Any) -> None:
    template_id = create(researcher).json()["id"]
    done = api(operator).post(f"/api/v1/job-templates/{template_id}/delete/")
    assert done.status_code == 204
    assert AuditEvent.objects.get(action=AuditAction.JOB_TEMPLATE_DELETE).actor == operator


def test_the_list_is_cursor_paginated(cluster: Any, researcher: Any) -> None:
    for number in range(3):
        assert create(researcher, name=f"t{number}").status_code == 201
    first = api(researcher).get("/api/v1/job-templates/?page_size=2").json()
    assert len(first["results"]) == 2 and first["next"] and "cursor=" in first["next"]
    second = api(researcher).get(first["next"]).json()
    assert len(second["results"]) == 1


def test_run_again_and_save_as_template_from_a_job(
    cluster: Any, researcher: Any, other_researcher: Any
) -> None:
    job = JobFactory(
        owner=researcher,
        cluster=cluster,
        name="first run",
        partition="gpu",
        nodes=2,
        gpus_per_node=1,
        gpu_type="h100",
        tasks_per_node=1,
        config={"preset": "tiny", "steps": 30, "checkpoint_every": 10},
        environment={"GANTRY_USER_FOO": "bar"},
        state=Job.State.COMPLETED,
    )
    client = api(researcher)
    again = client.post(f"/api/v1/jobs/{job.id}/run-again/", {}, format="json")
    assert again.status_code == 202, again.json()
    new = Job.objects.get(id=again.json()["id"])
    assert new.id != job.id and new.parent is None and new.resume_from is None
    assert (new.partition, new.nodes, new.gpus_per_node, new.gpu_type) == ("gpu", 2, 1, "h100")
    assert new.config["steps"] == 30 and new.config["checkpoint_every"] == 10
    assert new.environment == {"GANTRY_USER_FOO": "bar"}
    assert AuditEvent.objects.get(action=AuditAction.JOB_SUBMIT).details["run_again_of"] == str(
        job.id
    )

    saved = client.post(
        f"/api/v1/jobs/{job.id}/save-template/", {"name": "keeper", "shared": True}, format="json"
    )
    assert saved.status_code == 201, saved.json()
    template = JobTemplate.objects.get(name="keeper")
    assert template.source_job == job and template.shared
    assert template.settings["config"] == {"preset": "tiny", "steps": 30, "checkpoint_every": 10}

    # Someone who cannot see the job can neither run it again nor keep it.
    other = api(other_researcher)
    assert other.post(f"/api/v1/jobs/{job.id}/run-again/").status_code == 404
    assert other.post(f"/api/v1/jobs/{job.id}/save-template/", {"name": "x"}).status_code == 404
    assert page(other_researcher).get(f"/jobs/new/?from_job={job.id}").status_code == 404


def test_compact_config_keeps_only_what_differs() -> None:
    from trainer.config import validate

    full = validate({"preset": "small", "steps": 77, "data": {"order": 2}}).to_dict()
    assert compact_config(full) == {"preset": "small", "steps": 77, "data": {"order": 2}}
    assert compact_config(validate({}).to_dict()) == {}


def test_run_again_prefills_the_form(cluster: Any, researcher: Any) -> None:
    job = JobFactory(
        owner=researcher,
        cluster=cluster,
        name="prefilled",
        partition="gpu",
        nodes=2,
        gpus_per_node=2,
        gpu_type="h100",
        config={"preset": "small", "steps": 33, "lr": 0.002},
        environment={"FOO": "bar"},
    )
    assert job_settings(job)["config"]["lr"] == 0.002
    html = page(researcher).get(f"/jobs/new/?from_job={job.id}").content.decode()
    assert 'value="prefilled"' in html
    assert 'value="33"' in html
    assert '<option value="gpu" selected>' in html
    assert '<option value="h100" selected>' in html
    assert "&quot;lr&quot;: 0.002" in html
    assert "&quot;FOO&quot;: &quot;bar&quot;" in html
    assert "The settings of prefilled" in html


def test_pages_list_submit_share_and_delete(
    cluster: Any, researcher: Any, other_researcher: Any
) -> None:
    template_id = create(researcher).json()["id"]
    mine = page(researcher)
    listing = mine.get("/jobs/templates/").content.decode()
    assert "my sweep" in listing and "private" in listing
    assert f"/jobs/new/?template={template_id}" in listing

    prefilled = mine.get(f"/jobs/new/?template={template_id}").content.decode()
    assert 'value="sweep-a"' in prefilled and "From template “my sweep”" in prefilled

    shared = mine.post(f"/jobs/templates/{template_id}/share/", {"shared": "1"})
    assert shared.status_code == 302 and JobTemplate.objects.get().shared
    # The other researcher may use it now, not change it.
    assert page(other_researcher).post(f"/jobs/templates/{template_id}/delete/").status_code == 403
    # Its environment (NCCL_DEBUG) is someone else's: "submit now" opens the form instead.
    submitted = page(other_researcher).post(f"/jobs/templates/{template_id}/submit/")
    assert submitted.status_code == 302
    assert submitted["Location"] == f"/jobs/new/?template={template_id}"
    assert not Job.objects.exists()
    # Its owner submits it at once.
    submitted = mine.post(f"/jobs/templates/{template_id}/submit/")
    assert submitted.status_code == 302
    job = Job.objects.get()
    assert submitted["Location"] == f"/jobs/{job.id}/" and job.owner == researcher

    assert mine.post(f"/jobs/templates/{template_id}/delete/").status_code == 302
    assert not JobTemplate.objects.exists()


def test_save_as_template_from_the_form(cluster: Any, researcher: Any) -> None:
    form = {
        "cluster": cluster.pk,
        "name": "from-form",
        "preset": "tiny",
        "steps": 25,
        "precision": "fp32",
        "checkpoint_every": 5,
        "seed": 1,
        "partition": "batch",
        "nodes": 1,
        "gpus_per_node": 1,
        "gpu_type": "a100",
        "cpus_per_task": 1,
        "time_limit_minutes": 10,
        "action": "save_template",
    }
    client = page(researcher)
    unnamed = client.post("/jobs/new/", form)
    assert unnamed.status_code == 200
    assert "Name the template to save it." in unnamed.content.decode()
    saved = client.post("/jobs/new/", {**form, "save_name": "form-template", "save_shared": "on"})
    assert saved.status_code == 302 and saved["Location"] == "/jobs/templates/"
    template = JobTemplate.objects.get()
    assert template.name == "form-template" and template.shared
    assert template.settings["config"] == {
        "preset": "tiny",
        "steps": 25,
        "precision": "fp32",
        "checkpoint_every": 5,
        "seed": 1,
    }
    assert not Job.objects.exists()
