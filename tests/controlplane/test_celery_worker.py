"""A real Celery worker answers through the real Redis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from celery_support import database_url_for, start_worker
from core.tasks import ping

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_worker_answers_ping_through_redis(tmp_path: Path, request: Any) -> None:
    worker = start_worker(
        database_url=database_url_for(connection.settings_dict), log_path=tmp_path / "worker.log"
    )
    request.addfinalizer(worker.stop)
    result = ping.apply_async()
    assert result.get(timeout=60) == "pong", worker.log()
    assert "core.ping" in worker.log()
