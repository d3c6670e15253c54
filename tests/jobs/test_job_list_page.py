"""The job list page by keyset (``jobs.list_page``) and the job list API: every job once,
newest first, filters kept across pages, a fixed number of queries whatever the page holds,
rows rendered once per version."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from core import cache
from factories import JobFactory
from jobs.list_page import (
    PAGE_SIZE,
    Cursor,
    job_list_page_read,
    job_list_page_read_unfiltered,
)
from jobs.models import Job
from jobs.selectors import job_list

pytestmark = pytest.mark.django_db


@pytest.fixture
def page(researcher: Any) -> Client:
    client = Client()
    client.force_login(researcher)
    # The first request of a session also reads what later ones find cached on the user.
    client.get("/")
    return client


def _shown(response: Any) -> list[str]:
    return re.findall(r'<tr data-job="([0-9a-f-]+)"', response.content.decode())


def _older(response: Any) -> str | None:
    found = re.search(r'href="\?([^"]*)" id="jobs-older"', response.content.decode())
    return found.group(1).replace("&amp;", "&") if found else None


def _make(owner: Any, count: int, **fields: Any) -> list[Job]:
    # Some share a creation time: the keyset's tie-break (the id) must keep each once.
    start = timezone.now() - timedelta(days=1)
    return [
        JobFactory(owner=owner, created_at=start + timedelta(seconds=i // 3), **fields)
        for i in range(count)
    ]


def test_pages_show_every_job_once_newest_first(researcher: Any, page: Client) -> None:
    made = _make(researcher, 120, state="failed")
    _make(researcher, 5, state="running")
    seen: list[str] = []
    query: str | None = "state=failed"
    while query is not None:
        response = page.get(f"/jobs/?{query}")
        assert response.status_code == 200
        seen += _shown(response)
        query = _older(response)
        # The filters go along with the cursor.
        assert query is None or "state=failed" in query
    expected = sorted(made, key=lambda job: (job.created_at, job.id), reverse=True)
    assert seen == [str(job.id) for job in expected]


@pytest.mark.parametrize(
    ("who", "query", "whose"),
    [
        ("researcher", "", {"researcher"}),
        ("researcher", "mine=0", {"researcher"}),
        ("operator", "", {"researcher", "other", "operator"}),
        ("operator", "mine=1", {"operator"}),
    ],
)
def test_the_list_as_it_opens_pages_through_what_its_reader_may_see(
    who: str, query: str, whose: set[str], request: pytest.FixtureRequest
) -> None:
    # The list without filters is read by a compiled query per role, "mine" and cursor
    # (jobs.list_page.job_list_page_read_unfiltered): the same rule, every job once.
    users = {
        "researcher": request.getfixturevalue("researcher"),
        "other": request.getfixturevalue("other_researcher"),
        "operator": request.getfixturevalue("operator"),
    }
    made = {
        name: _make(user, {"researcher": 110, "other": 7, "operator": 4}[name])
        for name, user in users.items()
    }
    client = Client()
    client.force_login(users[who])
    seen: list[str] = []
    path: str | None = f"/jobs/?{query}"
    while path is not None:
        response = client.get(path)
        assert response.status_code == 200
        shown = _shown(response)
        older = _older(response)
        # Every page but the last is full: the read itself keeps to what the reader may
        # see (the rows' render reads through the rule again, and would only leave holes).
        assert len(shown) == PAGE_SIZE or older is None
        seen += shown
        path = None if older is None else f"/jobs/?{older}"
    expected = sorted(
        (job for name in whose for job in made[name]),
        key=lambda job: (job.created_at, job.id),
        reverse=True,
    )
    assert seen == [str(job.id) for job in expected]
    # Page by page, the compiled read answers what the ORM's read of job_list answers.
    mine = query != "mine=0" if who == "researcher" else query == "mine=1"
    cursor = None
    while True:
        got = job_list_page_read_unfiltered(user=users[who], mine=mine, cursor=cursor)
        want = job_list_page_read(job_list(user=users[who], mine=mine), cursor=cursor)
        assert got == want
        if got.older is None:
            break
        cursor = got.older


def test_bad_cursor_is_refused_with_a_form_error(page: Client) -> None:
    for junk in ("zzz", "%%%", Cursor.__name__, "MjAyNXxub3QtYS11dWlk"):
        response = page.get(f"/jobs/?cursor={junk}")
        assert response.status_code == 400, junk
        assert 'data-testid="filter-error"' in response.content.decode()


def _queries(client: Any, path: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path)
    assert response.status_code == 200, path
    return len(captured.captured_queries)


def _counts(page: Client, api: APIClient, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Queries of the page and the API: rendered (their rows' caches off), then warm."""
    paths = ("/jobs/", "/api/v1/jobs/?page_size=50")
    with monkeypatch.context() as off:
        off.setitem(cache.LIFETIMES, cache.JOB_LIST_PAGE, 0)  # type: ignore[arg-type]
        off.setitem(cache.LIFETIMES, cache.JOB_LIST_ROWS, 0)  # type: ignore[arg-type]
        rendered = [_queries(page, paths[0]), _queries(api, paths[1])]
    _queries(page, paths[0]), _queries(api, paths[1])
    return [*rendered, _queries(page, paths[0]), _queries(api, paths[1])]


def test_queries_do_not_grow_with_the_rows(
    researcher: Any, page: Client, researcher_api: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = JobFactory(owner=researcher)
    # The first request of an API client also reads what later ones find cached.
    researcher_api.get("/api/v1/jobs/")
    one = _counts(page, researcher_api, monkeypatch)
    # Resumed jobs show their parent and checkpoint: read with the rows, not per row.
    for job in _make(researcher, 29):
        job.parent = first
        job.save(update_fields=["parent"])
    thirty = _counts(page, researcher_api, monkeypatch)
    assert len(_shown(page.get("/jobs/"))) == 30
    assert one == thirty
    # A rendered page reads its row versions, then its jobs; a warm one only the versions.
    assert one[0] == one[2] + 1


def test_an_unchanged_page_is_answered_304_and_a_changed_row_renders_again(
    researcher: Any, page: Client
) -> None:
    job = _make(researcher, 3)[0]
    first = page.get("/jobs/")
    etag = first["ETag"]
    with CaptureQueriesContext(connection) as captured:
        again = page.get("/jobs/", HTTP_IF_NONE_MATCH=etag)
    assert again.status_code == 304
    # The session and the page's row versions: nothing is rendered.
    assert len(captured.captured_queries) <= 2
    Job.objects.filter(id=job.id).update(name="renamed-now")
    changed = page.get("/jobs/", HTTP_IF_NONE_MATCH=etag)
    assert changed.status_code == 200 and changed["ETag"] != etag
    assert ">renamed-now</a>" in changed.content.decode()
