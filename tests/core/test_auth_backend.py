"""The session user's one query (``core.auth``): the same user row as the ORM reads, both
role memberships, and nothing for a missing or deactivated account; and a token's, which
brings its user and roles the same way (``core.selectors.api_token_find_by_secret``)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIRequestFactory

from core.auth import RoleAwareModelBackend
from core.ratelimit import ThrottledTokenAuthentication
from core.roles import OPERATORS, RESEARCHERS, is_operator, is_researcher
from core.selectors import api_token_find_by_secret
from core.services import api_token_create
from factories import legacy_api_token

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "groups", [(), (RESEARCHERS,), (OPERATORS,), (OPERATORS, RESEARCHERS)], ids=str
)
def test_the_user_comes_with_their_roles_in_one_query(groups: tuple[str, ...]) -> None:
    user = User.objects.create_user("auth-a", email="a@example.org", password="pw-12345678")
    other = User.objects.create_user("auth-b", password="pw-12345678")
    for name in (OPERATORS, RESEARCHERS):
        group, _ = Group.objects.get_or_create(name=name)
        other.groups.add(group)  # someone else's memberships are not theirs
        if name in groups:
            user.groups.add(group)
    with CaptureQueriesContext(connection) as captured:
        loaded = RoleAwareModelBackend().get_user(str(user.pk))
        roles = (is_operator(loaded), is_researcher(loaded))
    assert len(captured.captured_queries) == 1
    want = User.objects.get(pk=user.pk)
    assert [getattr(loaded, f.attname) for f in User._meta.concrete_fields] == [
        getattr(want, f.attname) for f in User._meta.concrete_fields
    ]
    assert loaded.check_password("pw-12345678")
    # An operator may do what a researcher may (core.roles); membership is what is read here.
    assert roles == (OPERATORS in groups, bool(groups))


def test_a_missing_or_deactivated_account_is_nobody(researcher: Any) -> None:
    backend = RoleAwareModelBackend()
    assert backend.get_user(str(researcher.pk + 1000)) is None
    page = Client()
    page.force_login(researcher)
    assert page.get("/jobs/").status_code == 200
    User.objects.filter(pk=researcher.pk).update(is_active=False)
    assert backend.get_user(researcher.pk) is None
    # The session no longer signs anyone in.
    assert page.get("/jobs/").status_code == 302


@pytest.mark.parametrize("kind", ["personal", "legacy"])
def test_a_token_reads_its_user_and_roles_in_one_query(researcher: Any, kind: str) -> None:
    if kind == "personal":
        token, secret = api_token_create(user=researcher, name="laptop", expires_at=None)
    else:
        secret = "0f" * 20
        token = legacy_api_token(user=researcher, key=secret)
    with CaptureQueriesContext(connection) as captured:
        found = api_token_find_by_secret(secret=secret)
        assert found is not None
        user = found.user
        roles = (is_operator(user), is_researcher(user))
    assert len(captured.captured_queries) == 1
    assert found.pk == token.pk
    assert roles == (False, True)
    want = User.objects.get(pk=researcher.pk)
    assert [getattr(user, f.attname) for f in User._meta.concrete_fields] == [
        getattr(want, f.attname) for f in User._meta.concrete_fields
    ]
    assert api_token_find_by_secret(secret=secret[:-1] + "x") is None


def test_a_token_request_signs_in_with_one_query(researcher: Any, operator: Any) -> None:
    """The whole of token authentication, roles included: one query once the token's last
    use is recent (a first use also writes ``last_used_at``)."""
    _, secret = api_token_create(user=researcher, name="laptop", expires_at=None)
    legacy_key = "1e" * 20
    legacy_api_token(user=operator, key=legacy_key)
    for key, want in ((secret, (False, True)), (legacy_key, (True, True))):
        request = APIRequestFactory().get("/api/v1/me/", HTTP_AUTHORIZATION=f"Token {key}")
        ThrottledTokenAuthentication().authenticate(request)
        with CaptureQueriesContext(connection) as captured:
            found = ThrottledTokenAuthentication().authenticate(request)
            assert found is not None
            user, _ = found
            roles = (is_operator(user), is_researcher(user))
        assert len(captured.captured_queries) == 1, captured.captured_queries
        assert roles == want
