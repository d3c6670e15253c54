"""Per-cluster timings the Celery workers record for ``/metrics`` to export.

The watcher runs in Celery worker processes; ``/metrics`` is served by a web process.
Process-local Prometheus metrics would show each process only its own share, so the
workers add their numbers to plain counters in the ``worker_stats`` cache (Redis in
production, shared by every process) and the collector in ``console.exporter``
reads them at scrape time with one ``get_many``. Counters only grow (Prometheus's
``rate()`` copes with the reset when Redis restarts); the last cycle's duration is a
plain value.

Recording is best effort: with Redis down a watcher cycle goes on and the numbers of
that cycle are lost, rather than the cycle failing or waiting (the cache has a one
second socket timeout). Seconds are stored as whole microseconds, because the cache
can only increment integers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.core.cache import caches
from django.core.cache.backends.base import BaseCache

logger = logging.getLogger(__name__)

CACHE_ALIAS = "worker_stats"

# Counter names, one cache key per cluster and name.
WATCHER_CYCLES = "watcher_cycles"
WATCHER_CYCLE_MICROSECONDS = "watcher_cycle_us"
WATCHER_CYCLE_FAILURES = "watcher_cycle_failures"
SSH_COMMANDS = "ssh_commands"
SSH_COMMAND_MICROSECONDS = "ssh_command_us"
SSH_COMMAND_ERRORS = "ssh_command_errors"
COUNTERS = (
    WATCHER_CYCLES,
    WATCHER_CYCLE_MICROSECONDS,
    WATCHER_CYCLE_FAILURES,
    SSH_COMMANDS,
    SSH_COMMAND_MICROSECONDS,
    SSH_COMMAND_ERRORS,
)
# A plain value: the duration of the cluster's last watcher cycle, in microseconds.
WATCHER_LAST_CYCLE_MICROSECONDS = "watcher_last_cycle_us"
NAMES = (*COUNTERS, WATCHER_LAST_CYCLE_MICROSECONDS)


def stat_key(cluster_id: int, name: str) -> str:
    return f"cluster:{cluster_id}:{name}"


@dataclass(frozen=True)
class WatcherCycleStats:
    seconds: float
    failed: bool
    ssh_commands: int
    ssh_seconds: float
    ssh_errors: int


def watcher_cycle_record(*, cluster_id: int, stats: WatcherCycleStats) -> None:
    """Add one watcher cycle (and the SSH commands it ran) to the cluster's counters."""
    increments = {
        WATCHER_CYCLES: 1,
        WATCHER_CYCLE_MICROSECONDS: _microseconds(stats.seconds),
        WATCHER_CYCLE_FAILURES: int(stats.failed),
        SSH_COMMANDS: stats.ssh_commands,
        SSH_COMMAND_MICROSECONDS: _microseconds(stats.ssh_seconds),
        SSH_COMMAND_ERRORS: stats.ssh_errors,
    }
    cache = caches[CACHE_ALIAS]
    try:
        for name, delta in increments.items():
            if delta:
                _increment(cache, stat_key(cluster_id, name), delta)
        cache.set(
            stat_key(cluster_id, WATCHER_LAST_CYCLE_MICROSECONDS),
            _microseconds(stats.seconds),
            timeout=None,
        )
    except Exception:
        # Metrics must never break the watcher; the next cycle records again.
        logger.warning("could not record watcher stats for cluster %s", cluster_id, exc_info=True)


def worker_stats_for_clusters(cluster_ids: list[int]) -> dict[int, dict[str, int]]:
    """Every recorded number of these clusters, in one cache round trip; ``{}`` for a
    cluster with none, and for all of them when the cache cannot be reached."""
    keys = {
        stat_key(cluster_id, name): (cluster_id, name)
        for cluster_id in cluster_ids
        for name in NAMES
    }
    try:
        found = caches[CACHE_ALIAS].get_many(list(keys)) if keys else {}
    except Exception:
        logger.warning("could not read worker stats", exc_info=True)
        return {}
    stats: dict[int, dict[str, int]] = {}
    for key, value in found.items():
        cluster_id, name = keys[key]
        stats.setdefault(cluster_id, {})[name] = int(value)
    return stats


def _increment(cache: BaseCache, key: str, delta: int) -> None:
    # add() is a no-op when the key exists, so two workers starting a counter at once
    # both end up incrementing the same one.
    cache.add(key, 0, timeout=None)
    try:
        cache.incr(key, delta)
    except ValueError:
        # Evicted between add() and incr(): start it again with this delta.
        cache.add(key, delta, timeout=None)


def _microseconds(seconds: float) -> int:
    return max(0, round(seconds * 1_000_000))
