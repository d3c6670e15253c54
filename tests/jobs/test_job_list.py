"""One job list (``jobs.selectors.job_list``) behind the jobs page and the API: the same
filters, the same refusals."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from core.errors import FieldError
from factories import ClusterFactory, JobFactory
from jobs.selectors import job_list

pytestmark = pytest.mark.django_db


@pytest.fixture
def jobs(researcher: Any, other_researcher: Any) -> dict[str, Any]:
    east, west = ClusterFactory(name="east"), ClusterFactory(name="west")
    return {
        "mine_running": JobFactory(owner=researcher, cluster=east, name="alpha", state="running"),
        "mine_failed": JobFactory(
            owner=researcher, cluster=west, name="beta", state="failed", slurm_job_id="4242"
        ),
        "theirs": JobFactory(owner=other_researcher, cluster=east, name="alpha-2"),
    }


def _names(queryset: Any) -> set[str]:
    return {job.name for job in queryset}


def test_filters(researcher: Any, operator: Any, jobs: dict[str, Any]) -> None:
    assert _names(job_list(user=researcher)) == {"alpha", "beta"}
    assert _names(job_list(user=operator)) == {"alpha", "beta", "alpha-2"}
    assert _names(job_list(user=operator, state="running")) == {"alpha"}
    assert _names(job_list(user=operator, cluster="east")) == {"alpha", "alpha-2"}
    assert _names(job_list(user=operator, owner="rob-researcher")) == {"alpha-2"}
    assert _names(job_list(user=operator, search="alp")) == {"alpha", "alpha-2"}
    assert _names(job_list(user=operator, search="4242")) == {"beta"}
    assert _names(job_list(user=operator, mine=True)) == set()
    with pytest.raises(FieldError) as refused:
        job_list(user=operator, state="sleepy")
    assert refused.value.field == "state"


def test_page_and_api_answer_alike(researcher: Any, jobs: dict[str, Any]) -> None:
    api = APIClient()
    api.force_authenticate(user=researcher)
    page = Client()
    page.force_login(researcher)
    for query, expected in [("state=failed", {"beta"}), ("search=alp", {"alpha"})]:
        api_names = {job["name"] for job in api.get(f"/api/v1/jobs/?{query}").json()["results"]}
        html = page.get(f"/jobs/?{query.replace('search', 'q')}&mine=0").content.decode()
        page_names = {name for name in ("alpha", "beta", "alpha-2") if f">{name}</a>" in html}
        assert api_names == page_names == expected, query
    refused = api.get("/api/v1/jobs/?state=sleepy")
    assert refused.status_code == 400
    assert refused.json()["extra"]["fields"] == {"state": ["unknown job state 'sleepy'"]}
    html = page.get("/jobs/?state=sleepy").content.decode()
    assert "unknown job state" in html and 'data-testid="filter-error"' in html
