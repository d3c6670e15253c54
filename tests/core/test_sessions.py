"""Sessions read from the cache, kept in the database (``core.sessions``): a signed-in
request reads its session without a query, signing out ends it at once, and the cache's copy
is short-lived and never needed."""

from __future__ import annotations

import logging
from typing import Any
from unittest import mock

import pytest
from django.contrib.sessions.models import Session
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from core.sessions import SESSION_CACHE_SECONDS, SessionStore

pytestmark = pytest.mark.django_db


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_signed_in_request_reads_its_session_from_the_cache(researcher: Any) -> None:
    page = signed_in(researcher)
    page.get("/jobs/")
    with CaptureQueriesContext(connection) as captured:
        assert page.get("/jobs/").status_code == 200
    assert not [q for q in captured.captured_queries if "django_session" in q["sql"]]
    # The database is the record: with the copy gone (Redis emptied) it is read from there.
    cache.clear()
    with CaptureQueriesContext(connection) as captured:
        assert page.get("/jobs/").status_code == 200
    assert [q for q in captured.captured_queries if "django_session" in q["sql"]]


def test_signing_out_ends_the_session_for_every_copy_of_its_cookie(researcher: Any) -> None:
    page = signed_in(researcher)
    stolen = Client()
    stolen.cookies = page.cookies.__class__(page.cookies)
    assert stolen.get("/jobs/").status_code == 200
    page.post("/accounts/logout/")
    assert not Session.objects.exists()
    assert stolen.get("/jobs/").status_code == 302


def test_the_cache_keeps_a_copy_briefly(researcher: Any) -> None:
    page = signed_in(researcher)
    key = page.cookies["sessionid"].value
    cache.delete(SessionStore.cache_key_prefix + key)
    with mock.patch.object(cache, "set", wraps=cache.set) as kept:
        assert SessionStore(key).load()
    # Kept for a minute at most, not for the session's two weeks.
    assert 0 < kept.call_args.args[2] <= SESSION_CACHE_SECONDS


def test_a_sign_out_the_cache_did_not_hear_is_logged(
    researcher: Any, caplog: pytest.LogCaptureFixture
) -> None:
    page = signed_in(researcher)
    page.get("/jobs/")
    # A fail-soft cache that cannot reach its server answers None.
    with mock.patch.object(cache, "delete", return_value=None), caplog.at_level(logging.WARNING):
        page.post("/accounts/logout/")
    assert not Session.objects.exists()
    assert any("may remain" in record.getMessage() for record in caplog.records)
