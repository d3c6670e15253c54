"""Check, before starting, that the database and Redis answer; one line on failure."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.db.utils import OperationalError


def redis_ping(url: str, *, timeout: float = 3.0) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    finally:
        client.close()


class Command(BaseCommand):
    help = "Check that the database and the Redis broker answer."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--skip-redis", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            connection.ensure_connection()
        except OperationalError as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            raise CommandError(
                f"the database does not answer ({first}); check DATABASE_URL."
            ) from None
        if not options["skip_redis"]:
            import redis

            try:
                redis_ping(settings.CELERY_BROKER_URL)
            except redis.RedisError as error:
                raise CommandError(
                    f"Redis at {settings.CELERY_BROKER_URL} does not answer ({error}); "
                    "start it or set REDIS_URL / CELERY_BROKER_URL."
                ) from None
        self.stdout.write("preflight ok: database and Redis answer")
