"""The session user's one query (``core.auth``): the same user row as the ORM reads, both
role memberships, and nothing for a missing or deactivated account."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from core.auth import RoleAwareModelBackend
from core.roles import OPERATORS, RESEARCHERS, is_operator, is_researcher

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


def test_an_authtoken_reads_its_user_and_roles_in_one_query(researcher: Any) -> None:
    from rest_framework.authtoken.models import Token

    from core.auth import authtoken_user

    token = Token.objects.create(user=researcher)
    with CaptureQueriesContext(connection) as captured:
        found = authtoken_user(token.key)
        assert found is not None
        user, loaded = found
        roles = (is_operator(user), is_researcher(user))
    assert len(captured.captured_queries) == 1
    assert roles == (False, True)
    want = User.objects.get(pk=researcher.pk)
    assert [getattr(user, f.attname) for f in User._meta.concrete_fields] == [
        getattr(want, f.attname) for f in User._meta.concrete_fields
    ]
    assert (loaded.key, loaded.user_id, loaded.created) == (token.key, researcher.pk, token.created)
    assert authtoken_user(token.key[:-1] + "x") is None
