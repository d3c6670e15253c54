"""The overview's snapshot of the fleet (``settings.OVERVIEW_SNAPSHOT_SECONDS``): reused by
everyone with the same view for its period, never shown to someone with another view, taken
again once it is older, and polls answered 304 while it shows the same."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

from core.cache import key_overview_snapshot
from factories import ClusterFactory, JobFactory
from jobs.models import Job

pytestmark = pytest.mark.django_db


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def queries(client: Client, path: str, **headers: Any) -> tuple[list[str], Any]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path, **headers)
    return [query["sql"] for query in captured.captured_queries], response


def running(owner: Any, cluster: Any, rate: float) -> Job:
    return JobFactory(owner=owner, cluster=cluster, state=Job.State.RUNNING, throughput_now=rate)


@pytest.fixture(autouse=True)
def _empty_cache() -> Any:
    cache.clear()
    yield
    cache.clear()


@override_settings(OVERVIEW_SNAPSHOT_SECONDS=5)
def test_viewers_with_the_same_view_share_one_snapshot_for_its_period(
    operator: Any, researcher: Any, django_user_model: Any
) -> None:
    from core.roles import OPERATORS

    cluster = ClusterFactory(name="snap-a")
    running(researcher, cluster, 40)
    first_operator = client_for(operator)
    cold, response = queries(first_operator, "/overview/live/")
    assert response.status_code == 200
    assert response.context["running_count"] == 1
    assert "at most 5 s old" in response.content.decode()
    # Another operator's poll within the period reads no job: only who is asking.
    second = django_user_model.objects.create_user("operator-two", password="x")
    second.groups.add(django_user_model.groups.rel.model.objects.get(name=OPERATORS))
    warm, response = queries(client_for(second), "/overview/live/")
    assert response.status_code == 200 and response.context["running_count"] == 1
    assert any("jobs_job" in sql for sql in cold)
    assert not any("jobs_job" in sql or "jobs_restoredrill" in sql for sql in warm), warm
    # A job that starts within the period shows once the snapshot is older than it.
    running(researcher, cluster, 60)
    assert first_operator.get("/overview/live/").context["running_count"] == 1
    cache.clear()  # the period is over (the snapshot's key expires with it)
    assert first_operator.get("/overview/live/").context["running_count"] == 2


@override_settings(OVERVIEW_SNAPSHOT_SECONDS=5)
def test_a_researcher_never_sees_a_snapshot_taken_for_another_view(
    operator: Any, researcher: Any, other_researcher: Any
) -> None:
    cluster = ClusterFactory(name="snap-b")
    running(researcher, cluster, 10)
    running(other_researcher, cluster, 20)
    JobFactory(owner=other_researcher, cluster=cluster, state=Job.State.FAILED, name="theirs-x")
    assert client_for(operator).get("/overview/live/").context["running_count"] == 2
    mine = client_for(researcher).get("/overview/live/")
    assert mine.context["running_count"] == 1
    assert mine.context["throughput_now"] == pytest.approx(10)
    theirs = client_for(other_researcher).get("/")
    assert theirs.context["running_count"] == 1
    assert theirs.context["throughput_now"] == pytest.approx(20)
    assert "theirs-x" in theirs.content.decode()
    assert "theirs-x" not in client_for(researcher).get("/").content.decode()


@override_settings(OVERVIEW_SNAPSHOT_SECONDS=5)
def test_overview_polls_are_answered_304_while_the_snapshot_shows_the_same(
    operator: Any, researcher: Any, still_clock: Any
) -> None:
    cluster = ClusterFactory(name="snap-c")
    running(researcher, cluster, 40)
    page = client_for(operator)
    page.get("/")  # the session's CSRF cookie: an operator's copy has "sync now" forms
    for path in ("/overview/live/", "/"):
        first = page.get(path)
        assert first.status_code == 200
        assert "no-cache" in first["Cache-Control"] and "private" in first["Cache-Control"]
        again = page.get(path, HTTP_IF_NONE_MATCH=first["ETag"])
        assert again.status_code == 304, path
        # Taken again with the same figures: still the same copy.
        cache.delete(key_overview_snapshot(scope="operators"))
        assert page.get(path, HTTP_IF_NONE_MATCH=first["ETag"]).status_code == 304, path
    etag = page.get("/overview/live/")["ETag"]
    # What the snapshot shows changed: the fresh copy once it is taken again.
    running(researcher, cluster, 60)
    assert page.get("/overview/live/", HTTP_IF_NONE_MATCH=etag).status_code == 304
    cache.delete(key_overview_snapshot(scope="operators"))
    fresh = page.get("/overview/live/", HTTP_IF_NONE_MATCH=etag)
    assert fresh.status_code == 200 and fresh.context["running_count"] == 2
    # A researcher's copy (no forms) is not an operator's.
    viewer = client_for(researcher)
    viewer.get("/")
    assert viewer.get("/overview/live/", HTTP_IF_NONE_MATCH=fresh["ETag"]).status_code == 200


def test_a_page_with_a_message_to_show_is_never_answered_304(rf: Any) -> None:
    from django.contrib.messages import get_messages, success
    from django.contrib.messages.storage.fallback import FallbackStorage
    from django.contrib.sessions.backends.signed_cookies import SessionStore

    from core.conditional import etag_for, not_modified

    etag = etag_for("the same page")
    request = rf.get("/", HTTP_IF_NONE_MATCH=etag)
    request.session = SessionStore()
    request._messages = FallbackStorage(request)
    assert not_modified(request, etag).status_code == 304
    # The page an action redirects to: its message must be shown, not the browser's copy.
    success(request, "Sync requested.")
    assert not_modified(request, etag) is None
    assert [str(m) for m in get_messages(request)] == ["Sync requested."]


def test_operators_share_one_goodput_table_and_a_researcher_keeps_their_own(
    operator: Any, researcher: Any, other_researcher: Any, django_user_model: Any
) -> None:
    """The goodput table sums eight weeks of ledgers (seconds at 100k jobs): computed once
    for every operator, never shared with a researcher (who sees their own jobs only)."""
    from core.roles import OPERATORS

    cluster = ClusterFactory(name="weeks-a")
    running(researcher, cluster, 40)
    running(other_researcher, cluster, 50)
    first = client_for(operator).get("/")
    assert first.status_code == 200
    second = django_user_model.objects.create_user("operator-weeks", password="x")
    second.groups.add(django_user_model.groups.rel.model.objects.get(name=OPERATORS))
    cache.delete(key_overview_snapshot(scope="operators"))  # only the table stays kept
    sql, response = queries(client_for(second), "/")
    assert response.status_code == 200
    # The snapshot is taken again (it reads running jobs), but no job's ledger inputs:
    # the ledger query is the one that reads jobs by when they ended.
    assert not [q for q in sql if '"ended_at" >=' in q], [q[:200] for q in sql]
    assert first.context["goodput_weeks"] == response.context["goodput_weeks"]
    mine = client_for(researcher).get("/").context["goodput_weeks"]
    counted = sum(cell["jobs"] for row in mine["rows"] for cell in row["cells"])
    assert counted == 1  # their own running job only, not the operators' table of two


def test_an_old_goodput_table_is_shown_while_a_worker_computes_it_again(
    operator: Any, researcher: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table takes seconds at 100k jobs: once one is kept, no page view computes it.
    Older than a minute, it is still shown (with its time) and a worker is asked, once, to
    compute it again (``console.tasks``); what the worker keeps is shown next."""
    import console.overview
    from console.tasks import overview_goodput_refresh_task
    from core import cache as computed

    sent: list[tuple[str, tuple[Any, ...]]] = []
    monkeypatch.setattr(
        console.overview, "task_send", lambda name, *args: sent.append((name, args))
    )
    now = [2_000_000_000.0]
    monkeypatch.setattr(computed, "_clock", lambda: now[0])
    cluster = ClusterFactory(name="weeks-b")
    running(researcher, cluster, 40)
    first = client_for(operator).get("/")
    assert "weeks-b" in first.content.decode() and sent == []
    running(researcher, cluster, 50)  # not in the kept table
    now[0] += 61
    cache.delete(key_overview_snapshot(scope="operators"))
    sql, stale = queries(client_for(operator), "/")
    assert not [q for q in sql if '"ended_at" >=' in q]  # no ledger read while it waits
    assert stale.context["goodput_weeks"] == first.context["goodput_weeks"]
    assert stale.context["goodput_weeks_at"] == first.context["goodput_weeks_at"]
    client_for(operator).get("/")
    assert sent == [("console.overview_goodput_refresh", (None,))]  # once, for all operators
    # A researcher's own table is refreshed for them alone.
    client_for(researcher).get("/")
    now[0] += 61
    client_for(researcher).get("/")
    assert sent[-1] == ("console.overview_goodput_refresh", (researcher.pk,))
    # The worker's run keeps a fresh table, which the next view shows.
    assert overview_goodput_refresh_task(None) is True
    assert overview_goodput_refresh_task(10**9) is False  # no such user any more
    fresh = client_for(operator).get("/")
    jobs = sum(
        cell["jobs"] for row in fresh.context["goodput_weeks"]["rows"] for cell in row["cells"]
    )
    assert jobs == 2
    assert fresh.context["goodput_weeks_at"].timestamp() == now[0]
    assert 'data-testid="goodput-weeks-at"' in fresh.content.decode()
