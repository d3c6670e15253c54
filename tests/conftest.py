"""Shared fixtures. Personas: an operator, a researcher, another researcher, an outsider."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from factories import UserFactory


@pytest.fixture
def operator(db: Any) -> Any:
    return UserFactory(username="olivia-operator", role="operators", is_staff=True)


@pytest.fixture
def researcher(db: Any) -> Any:
    return UserFactory(username="rita-researcher", role="researchers")


@pytest.fixture
def other_researcher(db: Any) -> Any:
    return UserFactory(username="rob-researcher", role="researchers")


@pytest.fixture
def outsider(db: Any) -> Any:
    """Signed in, but in no role."""
    return UserFactory(username="otto-outsider")


def _client_for(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=user)
    return client


@pytest.fixture
def operator_api(operator: Any) -> APIClient:
    return _client_for(operator)


@pytest.fixture
def researcher_api(researcher: Any) -> APIClient:
    return _client_for(researcher)


@pytest.fixture
def outsider_api(outsider: Any) -> APIClient:
    return _client_for(outsider)


@pytest.fixture
def anonymous_api() -> APIClient:
    return APIClient()
