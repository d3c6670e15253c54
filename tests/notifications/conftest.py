"""Fixtures for notifications: loopback allowed for webhooks (the receiver runs on
127.0.0.1), a receiver, and a one-step retry base so back-off is quick to test."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import pytest

from webhook_support import Receiver, webhook_receiver


@pytest.fixture
def loopback_allowed(settings: Any) -> Any:
    settings.WEBHOOK_ALLOW = [ipaddress.ip_network("127.0.0.1/32")]
    settings.WEBHOOK_TIMEOUT_SECONDS = 2
    settings.NOTIFY_RETRY_BASE_SECONDS = 1
    settings.NOTIFY_MAX_ATTEMPTS = 3
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    return settings


@pytest.fixture
def receiver(loopback_allowed: Any) -> Iterator[Receiver]:
    with webhook_receiver() as found:
        yield found
