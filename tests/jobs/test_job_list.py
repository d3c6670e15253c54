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


def test_the_api_page_kept_rendered_is_what_drf_would_render(
    researcher: Any, researcher_api: APIClient
) -> None:
    import json

    from rest_framework.renderers import JSONRenderer

    from jobs.api.jobs import JobSerializer
    from jobs.models import Job

    for step in range(3):
        JobFactory(owner=researcher, name=f"kept-{step}")
    path = "/api/v1/jobs/?page_size=2"
    first = researcher_api.get(path)
    # The second answer comes from the rendered page in the cache.
    again = researcher_api.get(path)
    assert first.status_code == again.status_code == 200
    assert first["Content-Type"] == "application/json"
    assert again.content == first.content
    page = json.loads(again.content)
    assert list(page) == ["next", "previous", "results"]
    assert page["previous"] is None and "cursor=" in page["next"]
    jobs = Job.objects.filter(owner=researcher).order_by("-created_at")[:2]
    assert page["results"] == json.loads(JSONRenderer().render(JobSerializer(jobs, many=True).data))
    # The browsable API renders the same page itself.
    browsable = researcher_api.get(path + "&format=api")
    assert browsable.status_code == 200 and "kept-2" in browsable.content.decode()


def test_junk_query_parameters_add_no_cache_entries(
    researcher: Any, researcher_api: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rendered page's key names its rows, not the query string: a client (or a
    scanner) sending made-up parameters cannot fill Redis with copies of one page."""
    from django.core.cache import caches

    from core import cache

    for step in range(3):
        JobFactory(owner=researcher, name=f"junk-{step}")
    backend = caches[cache.CACHE_ALIAS]
    backend.clear()
    kept: list[str] = []
    original = backend.set_many

    def recording(values: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        kept.extend(key for key in values if key.startswith(cache.KEY_PREFIX + cache.JOB_LIST_ROWS))
        return original(values, *args, **kwargs)

    monkeypatch.setattr(backend, "set_many", recording)
    answers = [
        researcher_api.get(f"/api/v1/jobs/?page_size=2{junk}").json()["results"]
        for junk in ("", "&utm=1", "&utm=2", "&x=y&z=", "&page_size_junk=9", "&q=ignored")
    ]
    assert len(kept) == 1
    assert len(answers[0]) == 2 and all(answer == answers[0] for answer in answers)
    # What the view understands chooses other rows: another entry.
    researcher_api.get("/api/v1/jobs/?page_size=1")
    researcher_api.get("/api/v1/jobs/?page_size=2&search=junk-0")
    assert len(kept) == 3
