"""Someone else's shared template never applies its environment, unseen, to the job of the
person who uses it: the page's "submit now" opens the prefilled form (the variables in
view) instead, and the API wants ``confirm_environment`` equal to the template's. One's
own templates, and shared ones without variables, submit at once as before."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from factories import ClusterFactory, GpuFactory, NodeFactory, PartitionFactory
from jobs.models import Job, JobTemplate

pytestmark = pytest.mark.django_db

ENVIRONMENT = {"NCCL_DEBUG": "INFO", "GANTRY_USER_TAG": "rita's"}


@pytest.fixture
def cluster() -> Any:
    cluster = ClusterFactory(name="devcluster", is_default=True, default_partition="batch")
    PartitionFactory(cluster=cluster, name="batch", max_time_minutes=60, is_default=True)
    for name in ("n1", "n2"):
        node = NodeFactory(cluster=cluster, name=name, partitions=["batch"], cpus_total=2)
        GpuFactory(node=node, index=0, gpu_type="a100")
    return cluster


def api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=user)
    return client


def page(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def shared_template(owner: Any, environment: dict[str, str] | None = None) -> int:
    job = {
        "name": "sweep",
        "partition": "batch",
        "nodes": 1,
        "gpus_per_node": 1,
        "time_limit_minutes": 10,
        "config": {"preset": "tiny", "steps": 20},
        "environment": ENVIRONMENT if environment is None else environment,
    }
    body = {"name": "team sweep", "shared": True, "job": job}
    response = api(owner).post("/api/v1/job-templates/create/", body, format="json")
    assert response.status_code == 201, response.json()
    return int(response.json()["id"])


def submit(user: Any, template_id: int, **body: Any) -> Any:
    url = f"/api/v1/job-templates/{template_id}/submit/"
    return api(user).post(url, body, format="json")


@pytest.mark.parametrize(
    "confirm",
    [None, {}, {"NCCL_DEBUG": "INFO"}, {**ENVIRONMENT, "NCCL_DEBUG": "WARN"}],
    ids=["absent", "empty", "partial", "other-value"],
)
def test_the_api_wants_someone_elses_environment_confirmed(
    cluster: Any, researcher: Any, other_researcher: Any, confirm: Any
) -> None:
    template_id = shared_template(researcher)
    body = {} if confirm is None else {"confirm_environment": confirm}
    refused = submit(other_researcher, template_id, **body)
    assert refused.status_code == 400, refused.json()
    why = refused.json()["extra"]["fields"]["confirm_environment"][0]
    assert "GANTRY_USER_TAG, NCCL_DEBUG" in why and researcher.username in why
    assert not Job.objects.exists()


def test_the_confirmed_environment_is_the_one_the_job_gets(
    cluster: Any, researcher: Any, other_researcher: Any
) -> None:
    template_id = shared_template(researcher)
    read = api(other_researcher).get(f"/api/v1/job-templates/{template_id}/").json()
    confirmed = submit(
        other_researcher, template_id, confirm_environment=read["job"]["environment"]
    )
    assert confirmed.status_code == 202, confirmed.json()
    job = Job.objects.get()
    assert job.owner == other_researcher and job.environment == ENVIRONMENT


def test_a_template_changed_after_it_was_read_is_refused(
    cluster: Any, researcher: Any, other_researcher: Any
) -> None:
    template_id = shared_template(researcher, environment={})
    # The owner adds a variable between the other researcher's read and submit.
    template = JobTemplate.objects.get(pk=template_id)
    template.settings = {**template.settings, "environment": {"OMP_NUM_THREADS": "64"}}
    template.save()
    refused = submit(other_researcher, template_id, confirm_environment={})
    assert refused.status_code == 400
    assert "OMP_NUM_THREADS" in refused.json()["extra"]["fields"]["confirm_environment"][0]
    assert not Job.objects.exists()


def test_own_templates_and_ones_without_variables_submit_at_once(
    cluster: Any, researcher: Any, other_researcher: Any
) -> None:
    own = shared_template(researcher)
    assert submit(researcher, own).status_code == 202
    plain = shared_template(other_researcher, environment={})
    assert submit(researcher, plain).status_code == 202
    assert Job.objects.count() == 2


def test_the_page_opens_the_form_for_someone_elses_variables(
    cluster: Any, researcher: Any, other_researcher: Any
) -> None:
    template_id = shared_template(researcher)
    theirs = page(other_researcher)

    listing = theirs.get("/jobs/templates/").content.decode()
    assert "Review and submit…" in listing and "submit-template" not in listing
    assert "NCCL_DEBUG" in listing

    submitted = theirs.post(f"/jobs/templates/{template_id}/submit/")
    assert submitted.status_code == 302
    assert submitted["Location"] == f"/jobs/new/?template={template_id}"
    assert not Job.objects.exists()

    form = theirs.get(submitted["Location"]).content.decode()
    # The variables are in the form, and the line above it says so.
    assert "&quot;NCCL_DEBUG&quot;: &quot;INFO&quot;" in form
    assert "sets environment variables for your job (GANTRY_USER_TAG, NCCL_DEBUG)" in form

    # Its owner sees "submit now", which submits at once.
    mine = page(researcher)
    assert "submit-template" in mine.get("/jobs/templates/").content.decode()
    done = mine.post(f"/jobs/templates/{template_id}/submit/")
    job = Job.objects.get()
    assert done["Location"] == f"/jobs/{job.id}/" and job.owner == researcher
