"""The read-through cache (``core.cache``): one key function and one lifetime per cached
thing, hits and misses counted and exported at /metrics without a round trip per read, and
a cache that is down is a miss, logged once, never an error."""

from __future__ import annotations

import inspect
import ipaddress
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.cache import caches
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families

from core import cache, worker_stats

TOKEN = "cache-scrape-token-0123456789"
JOB = uuid.UUID("00000000-0000-0000-0000-00000000000a")
WHEN = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)

# One example call of every key function, by the name it makes keys for.
EXAMPLE_KEYS = {
    cache.JOB_FIGURES: lambda: cache.key_job_figures(job_id=JOB, version='"abc"', minute=7),
    cache.JOB_LIST_ROWS: lambda: cache.key_job_list_rows(rows=[(JOB, WHEN, "digest")]),
    cache.JOB_LIST_PAGE: lambda: cache.key_job_list_page(rows=[(JOB, WHEN, "digest")], minute=7),
    cache.JOB_METRICS: lambda: cache.key_job_metrics(
        job_id=JOB, metrics_offset=3, step_min=None, step_max=10, max_points=2000
    ),
    cache.JOB_METRICS_BODY: lambda: cache.key_job_metrics_body(etag='"0123abcd"'),
    cache.JOB_SERIES_STATE: lambda: cache.key_job_series_state(
        job_id=JOB, rebuilt_offset=0, max_points=2000, series=("loss", "tokens_per_s")
    ),
    cache.JOB_PLACEMENT: lambda: cache.key_job_placement(
        job_id=JOB,
        allocated_nodes="gpu[001-512]",
        nodelist_requested="",
        switches_requested="leaf 1",
    ),
    cache.GOODPUT_STEP_TOTALS: lambda: cache.key_goodput_step_totals(
        job_id=JOB, metrics_offset=5, step_start=0, step_cutoff=40
    ),
    cache.CLUSTER_FAILURE_HISTORY: lambda: cache.key_cluster_failure_history(
        cluster_id=1, cluster_created_at=WHEN
    ),
    cache.METRICS_GOODPUT: lambda: cache.key_metrics_goodput(clusters=[(1, WHEN), (2, WHEN)]),
    cache.OVERVIEW_NODE_COUNTS: lambda: cache.key_overview_node_counts(
        clusters=[(1, WHEN, None), (2, WHEN, WHEN)]
    ),
    cache.OVERVIEW_SNAPSHOT: lambda: cache.key_overview_snapshot(scope="operators"),
    cache.OVERVIEW_GOODPUT_WEEKS: lambda: cache.key_overview_goodput_weeks(
        user_id=4, user_joined=WHEN, sees_all=False, weeks=8
    ),
}


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch: pytest.MonkeyPatch) -> Any:
    """An empty cache that answers, and no counts waiting from other tests."""
    monkeypatch.setattr(cache, "_availability", cache._Availability())
    cache.flush_counts()
    caches[cache.CACHE_ALIAS].clear()
    yield
    caches[cache.CACHE_ALIAS].clear()


def counts(name: str) -> tuple[int, int]:
    found = cache.cache_counts()
    assert found is not None
    return found[name].hits, found[name].misses


def counted_since(name: str, before: tuple[int, int]) -> tuple[int, int]:
    hits, misses = counts(name)
    return hits - before[0], misses - before[1]


class Computations:
    """A compute function that says how often it ran."""

    def __init__(self, value: Any = "computed") -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.value


# ------------------------------------------------------------------ keys and lifetimes


def test_every_cached_thing_has_one_key_function_and_one_lifetime() -> None:
    assert set(EXAMPLE_KEYS) == set(cache.NAMES) == set(cache.LIFETIMES)
    key_functions = {
        name for name, _ in inspect.getmembers(cache, inspect.isfunction) if name.startswith("key_")
    }
    assert key_functions == {f"key_{name}" for name in cache.NAMES}


@pytest.mark.parametrize("name", sorted(EXAMPLE_KEYS))
def test_keys_are_under_the_versioned_prefix_of_their_name(name: str) -> None:
    key = EXAMPLE_KEYS[name]()
    assert key.startswith(f"{cache.KEY_PREFIX}{name}:")
    assert cache.KEY_PREFIX.startswith("v")
    # Short, no whitespace or control characters: valid for every cache backend.
    assert len(key) <= 200 and not any(c.isspace() or ord(c) < 32 for c in key)
    assert EXAMPLE_KEYS[name]() == key


def test_a_key_changes_with_every_input_it_names() -> None:
    base = cache.key_job_metrics(
        job_id=JOB, metrics_offset=3, step_min=None, step_max=10, max_points=2000
    )
    assert base != cache.key_job_metrics(
        job_id=JOB, metrics_offset=4, step_min=None, step_max=10, max_points=2000
    )
    assert base != cache.key_job_metrics(
        job_id=JOB, metrics_offset=3, step_min=0, step_max=10, max_points=2000
    )
    placement = {
        "job_id": JOB,
        "allocated_nodes": "a",
        "nodelist_requested": "b",
        "switches_requested": "",
    }
    assert cache.key_job_placement(**placement) != cache.key_job_placement(
        **{**placement, "allocated_nodes": "c"}
    )
    synced = cache.key_overview_node_counts(clusters=[(1, WHEN, None)])
    assert synced != cache.key_overview_node_counts(clusters=[(1, WHEN, WHEN)])
    assert cache.key_overview_snapshot(scope="operators") != cache.key_overview_snapshot(
        scope="user:4:1.0"
    )


def test_lifetimes_are_one_table_and_the_snapshot_follows_its_setting(settings: Any) -> None:
    assert cache.lifetime(cache.JOB_FIGURES) == 120
    assert cache.lifetime(cache.JOB_LIST_ROWS) == 600
    assert cache.lifetime(cache.JOB_LIST_PAGE) == 120
    assert cache.lifetime(cache.JOB_METRICS) == 600
    assert cache.lifetime(cache.JOB_SERIES_STATE) == 3600
    assert cache.lifetime(cache.JOB_PLACEMENT) == 7 * 86_400
    assert cache.lifetime(cache.GOODPUT_STEP_TOTALS) == 86_400
    assert cache.lifetime(cache.CLUSTER_FAILURE_HISTORY) == 60
    assert cache.lifetime(cache.METRICS_GOODPUT) == 60
    assert cache.lifetime(cache.OVERVIEW_NODE_COUNTS) == 30
    assert cache.lifetime(cache.OVERVIEW_GOODPUT_WEEKS) == 600
    settings.OVERVIEW_SNAPSHOT_SECONDS = 7
    assert cache.lifetime(cache.OVERVIEW_SNAPSHOT) == 7
    settings.OVERVIEW_SNAPSHOT_SECONDS = 0
    assert cache.lifetime(cache.OVERVIEW_SNAPSHOT) == 0


def test_entries_are_kept_for_their_lifetime(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = caches[cache.CACHE_ALIAS]
    kept: list[tuple[list[str], Any]] = []
    original = backend.set_many

    def recording(values: dict[str, Any], timeout: Any = None, **kwargs: Any) -> Any:
        kept.append((list(values), timeout))
        return original(values, timeout=timeout, **kwargs)

    monkeypatch.setattr(backend, "set_many", recording)
    key = EXAMPLE_KEYS[cache.CLUSTER_FAILURE_HISTORY]()
    cache.get_or_set(cache.CLUSTER_FAILURE_HISTORY, key, Computations())
    cache.put(cache.JOB_SERIES_STATE, EXAMPLE_KEYS[cache.JOB_SERIES_STATE](), {"offset": 1})
    assert kept == [
        ([key], 60),
        ([EXAMPLE_KEYS[cache.JOB_SERIES_STATE]()], 3600),
    ]


# ------------------------------------------------------------------ reading and counting


def test_get_or_set_computes_once_and_counts_the_miss_and_the_hits() -> None:
    before = counts(cache.JOB_FIGURES)
    compute = Computations({"goodput": 0.5})
    key = EXAMPLE_KEYS[cache.JOB_FIGURES]()
    assert cache.get_or_set(cache.JOB_FIGURES, key, compute) == {"goodput": 0.5}
    assert cache.get_or_set(cache.JOB_FIGURES, key, compute) == {"goodput": 0.5}
    assert cache.get_or_set(cache.JOB_FIGURES, key, compute) == {"goodput": 0.5}
    assert compute.calls == 1
    assert counted_since(cache.JOB_FIGURES, before) == (2, 1)


def test_a_kept_none_or_falsy_value_is_a_hit() -> None:
    compute = Computations({})
    key = EXAMPLE_KEYS[cache.CLUSTER_FAILURE_HISTORY]()
    cache.get_or_set(cache.CLUSTER_FAILURE_HISTORY, key, compute)
    cache.get_or_set(cache.CLUSTER_FAILURE_HISTORY, key, compute)
    assert compute.calls == 1


def test_a_lifetime_of_zero_turns_the_cache_of_that_name_off(settings: Any) -> None:
    settings.OVERVIEW_SNAPSHOT_SECONDS = 0
    before = counts(cache.OVERVIEW_SNAPSHOT)
    compute = Computations()
    key = EXAMPLE_KEYS[cache.OVERVIEW_SNAPSHOT]()
    cache.get_or_set(cache.OVERVIEW_SNAPSHOT, key, compute)
    cache.get_or_set(cache.OVERVIEW_SNAPSHOT, key, compute)
    assert compute.calls == 2
    assert caches[cache.CACHE_ALIAS].get(key) is None
    assert counted_since(cache.OVERVIEW_SNAPSHOT, before) == (0, 0)


def test_get_many_or_set_reads_and_keeps_in_one_pass_each() -> None:
    name = cache.GOODPUT_STEP_TOTALS

    def key(job: str) -> str:
        return cache.key_goodput_step_totals(
            job_id=job, metrics_offset=1, step_start=0, step_cutoff=9
        )

    asked: list[list[str]] = []

    def compute(missing: list[str]) -> dict[str, Any]:
        asked.append(sorted(missing))
        # "never-kept" stands for what the caller works out in the same pass, uncached.
        return {**{job: f"sum-{job}" for job in missing}, "never-kept": "summed"}

    before = counts(name)
    first = cache.get_many_or_set(name, {"a": key("a"), "b": key("b")}, compute)
    assert first == {"a": "sum-a", "b": "sum-b", "never-kept": "summed"}
    again = cache.get_many_or_set(name, {"a": key("a"), "b": key("b"), "c": key("c")}, compute)
    assert again == {"a": "sum-a", "b": "sum-b", "c": "sum-c", "never-kept": "summed"}
    # Called once per read, with only what was missing (none missing: called with none).
    cache.get_many_or_set(name, {"a": key("a")}, compute)
    assert asked == [["a", "b"], ["c"], []]
    assert caches[cache.CACHE_ALIAS].get("never-kept") is None
    assert counted_since(name, before) == (3, 3)


def test_get_and_put_for_a_value_updated_in_place() -> None:
    name, key = cache.JOB_SERIES_STATE, EXAMPLE_KEYS[cache.JOB_SERIES_STATE]()
    before = counts(name)
    assert cache.get(name, key) is None
    cache.put(name, key, {"offset": 3})
    assert cache.get(name, key) == {"offset": 3}
    assert counted_since(name, before) == (1, 1)


def test_a_stale_value_is_answered_while_one_refresh_is_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``get_or_refresh``: computed in the request only when nothing is kept; once older
    than its freshness, still answered, and a refresh asked for once per period."""
    now = [1_000_000.0]
    monkeypatch.setattr(cache, "_clock", lambda: now[0])
    key = EXAMPLE_KEYS[cache.OVERVIEW_GOODPUT_WEEKS]()
    compute, refreshes = Computations("first"), []

    def read() -> tuple[Any, float]:
        return cache.get_or_refresh(
            cache.OVERVIEW_GOODPUT_WEEKS,
            key,
            compute,
            fresh_seconds=60,
            refresh=lambda: refreshes.append(now[0]),
        )

    assert read() == ("first", 1_000_000.0) and compute.calls == 1
    now[0] += 59
    assert read() == ("first", 1_000_000.0) and refreshes == []
    now[0] += 2  # 61 s old: answered as kept, one refresh asked for, not one per read
    assert read() == read() == ("first", 1_000_000.0)
    assert refreshes == [1_000_061.0] and compute.calls == 1
    cache.put_refreshed(cache.OVERVIEW_GOODPUT_WEEKS, key, "second")
    assert read() == ("second", 1_000_061.0)
    now[0] += 61  # stale again, and the previous claim has run out: another refresh
    caches[cache.CACHE_ALIAS].delete(f"{key}:refresh")  # locmem's clock is the real one
    assert read() == ("second", 1_000_061.0) and refreshes == [1_000_061.0, 1_000_122.0]
    assert compute.calls == 1


def test_a_peek_counts_a_hit_but_not_a_miss() -> None:
    name, key = cache.JOB_PLACEMENT, EXAMPLE_KEYS[cache.JOB_PLACEMENT]()
    before = counts(name)
    assert cache.peek(name, key) is None
    cache.get_or_set(name, key, Computations("verdict"))
    assert cache.peek(name, key) == "verdict"
    assert counted_since(name, before) == (1, 1)


def test_counting_costs_no_round_trip_per_read(monkeypatch: pytest.MonkeyPatch) -> None:
    shared = caches[worker_stats.CACHE_ALIAS]
    calls: list[str] = []
    for method in ("incr", "add", "get_many", "set", "set_many"):
        original = getattr(shared, method)

        def spy(*args: Any, _original: Any = original, _method: str = method, **kw: Any) -> Any:
            calls.append(_method)
            return _original(*args, **kw)

        monkeypatch.setattr(shared, method, spy)
    monkeypatch.setattr(cache._counts, "flush_at", time.monotonic() + 3600)
    key = EXAMPLE_KEYS[cache.JOB_METRICS]()
    for _ in range(20):
        cache.get_or_set(cache.JOB_METRICS, key, Computations())
    assert calls == []
    # Once due, the next read adds the counts: one counter per name and outcome.
    monkeypatch.setattr(cache._counts, "flush_at", 0.0)
    cache.get_or_set(cache.JOB_METRICS, key, Computations())
    assert 0 < calls.count("incr") + calls.count("add") <= 4
    assert cache._counts.pending == {}


def test_counts_that_cannot_be_flushed_are_kept_for_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = counts(cache.JOB_METRICS)
    shared = caches[worker_stats.CACHE_ALIAS]

    def down(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("redis is down")

    key = EXAMPLE_KEYS[cache.JOB_METRICS]()
    cache.get_or_set(cache.JOB_METRICS, key, Computations())
    with monkeypatch.context() as patched:
        patched.setattr(shared, "incr", down)
        patched.setattr(shared, "add", down)
        cache.flush_counts()  # fails quietly
    assert cache._counts.pending == {(cache.JOB_METRICS, cache.MISSES): 1}
    assert counted_since(cache.JOB_METRICS, before) == (0, 1)


# ------------------------------------------------------------------ the cache down


def closed_port_cache(port: int, **options: Any) -> dict[str, Any]:
    from django.conf import settings

    return {
        **settings.CACHES,
        cache.CACHE_ALIAS: {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{port}/0",
            "OPTIONS": {"socket_connect_timeout": 0.25, "socket_timeout": 0.25, **options},
        },
    }


def test_a_cache_that_is_down_is_a_miss_logged_once(
    free_tcp_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    before = counts(cache.JOB_FIGURES)
    compute = Computations("fresh")
    key = EXAMPLE_KEYS[cache.JOB_FIGURES]()
    with (
        override_settings(CACHES=closed_port_cache(free_tcp_port)),
        caplog.at_level(logging.WARNING, logger="core.cache"),
    ):
        started = time.monotonic()
        for _ in range(5):
            assert cache.get_or_set(cache.JOB_FIGURES, key, compute) == "fresh"
        assert cache.get(cache.JOB_SERIES_STATE, key) is None
        assert cache.peek(cache.JOB_PLACEMENT, key) is None
        cache.put(cache.JOB_SERIES_STATE, key, {"offset": 1})
        many = cache.get_many_or_set(
            cache.GOODPUT_STEP_TOTALS, {"a": "k-a"}, lambda missing: {m: 1 for m in missing}
        )
        elapsed = time.monotonic() - started
    assert many == {"a": 1}
    assert compute.calls == 5
    warnings = [r for r in caplog.records if r.name == "core.cache"]
    assert len(warnings) == 1 and "failed" in warnings[0].getMessage()
    # After the first failure the cache is left alone: no socket timeout per read.
    assert elapsed < 2
    assert counted_since(cache.JOB_FIGURES, before) == (0, 5)


def test_a_cache_that_answers_again_is_used_again(
    free_tcp_port: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = EXAMPLE_KEYS[cache.JOB_FIGURES]()
    with override_settings(CACHES=closed_port_cache(free_tcp_port)):
        cache.get_or_set(cache.JOB_FIGURES, key, Computations())
    assert cache._availability.failing
    monkeypatch.setattr(cache._availability, "retry_at", 0.0)
    compute = Computations()
    with caplog.at_level(logging.INFO, logger="core.cache"):
        cache.get_or_set(cache.JOB_FIGURES, key, compute)
        cache.get_or_set(cache.JOB_FIGURES, key, compute)
    assert compute.calls == 1 and not cache._availability.failing
    assert any("answers again" in r.getMessage() for r in caplog.records)


def test_a_fail_soft_backend_that_is_down_is_a_miss_too(free_tcp_port: int) -> None:
    """django-redis with IGNORE_EXCEPTIONS (the default alias's settings) answers misses."""
    caches_setting = closed_port_cache(free_tcp_port)
    caches_setting[cache.CACHE_ALIAS] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://127.0.0.1:{free_tcp_port}/0",
        "OPTIONS": {
            "IGNORE_EXCEPTIONS": True,
            "SOCKET_CONNECT_TIMEOUT": 0.25,
            "SOCKET_TIMEOUT": 0.25,
        },
    }
    compute = Computations("fresh")
    with override_settings(CACHES=caches_setting, DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS=False):
        for _ in range(2):
            assert cache.get_or_set(cache.JOB_FIGURES, "k", compute) == "fresh"
    assert compute.calls == 2


# ------------------------------------------------------------------ /metrics


def scrape(client: Client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    found = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


@pytest.mark.django_db
def test_hits_and_misses_reach_metrics(client: Client, settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW = [ipaddress.ip_network("10.9.0.0/16")]
    caches[worker_stats.CACHE_ALIAS].clear()
    key = EXAMPLE_KEYS[cache.JOB_FIGURES]()
    for _ in range(3):
        cache.get_or_set(cache.JOB_FIGURES, key, Computations())
    # Counted in this process and not yet flushed: the scrape adds its own counts first.
    assert cache._counts.pending

    found = scrape(client)

    labels = frozenset({("cache", cache.JOB_FIGURES)})
    assert found[("gantry_cache_hits_total", labels)] == 2
    assert found[("gantry_cache_misses_total", labels)] == 1
    # Every cached thing is exported, zeros included.
    for name in cache.NAMES:
        assert ("gantry_cache_hits_total", frozenset({("cache", name)})) in found
    # The scrape's own goodput window was a miss, counted on the next one.
    again = scrape(client)
    goodput = frozenset({("cache", cache.METRICS_GOODPUT)})
    assert again[("gantry_cache_misses_total", goodput)] == 1


@pytest.mark.django_db
def test_metrics_leave_the_counts_out_when_they_cannot_be_read(
    client: Client, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW = []

    def down(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("redis is down")

    shared = caches[worker_stats.CACHE_ALIAS]
    for method in ("get_many", "incr", "add"):
        monkeypatch.setattr(shared, method, down)
    found = scrape(client)
    assert not [sample for sample in found if sample[0].startswith("gantry_cache_")]


# ------------------------------------------------------------------ against real Redis


@pytest.mark.integration
def test_reading_keeping_and_counting_against_redis(settings: Any) -> None:
    """The production backends (Django's RedisCache) on the test Redis database."""
    from controlplane.settings import CACHES as PRODUCTION_CACHES

    redis_caches = {
        **settings.CACHES,
        cache.CACHE_ALIAS: {**PRODUCTION_CACHES[cache.CACHE_ALIAS], "LOCATION": settings.REDIS_URL},
        worker_stats.CACHE_ALIAS: {
            **PRODUCTION_CACHES[worker_stats.CACHE_ALIAS],
            "LOCATION": settings.REDIS_URL,
            "KEY_PREFIX": f"gantry-test-counts-{uuid.uuid4().hex}",
        },
    }
    key = cache.key_overview_snapshot(scope=f"test-{uuid.uuid4().hex}")
    with override_settings(CACHES=redis_caches):
        before = counts(cache.OVERVIEW_GOODPUT_WEEKS)
        compute = Computations({"weeks": [1, 2]})
        for _ in range(3):
            assert cache.get_or_set(cache.OVERVIEW_GOODPUT_WEEKS, key, compute) == {"weeks": [1, 2]}
        assert compute.calls == 1
        assert counted_since(cache.OVERVIEW_GOODPUT_WEEKS, before) == (2, 1)
        caches[cache.CACHE_ALIAS].delete(key)


def test_one_computation_per_key_at_a_time_the_others_wait_for_it() -> None:
    """Threads that miss the same key while one computes it get its value, not a
    computation of their own (an expensive entry's expiry is one computation)."""
    import threading

    key = EXAMPLE_KEYS[cache.OVERVIEW_GOODPUT_WEEKS]()
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def slow() -> dict[str, int]:
        calls.append(1)
        started.set()
        release.wait(5)
        return {"rows": 7}

    got: list[Any] = []
    first = threading.Thread(
        target=lambda: got.append(cache.get_or_set(cache.OVERVIEW_GOODPUT_WEEKS, key, slow))
    )
    first.start()
    assert started.wait(5)
    others = [
        threading.Thread(
            target=lambda: got.append(cache.get_or_set(cache.OVERVIEW_GOODPUT_WEEKS, key, slow))
        )
        for _ in range(3)
    ]
    for thread in others:
        thread.start()
    time.sleep(0.2)  # they are waiting, not computing
    assert len(calls) == 1
    release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert got == [{"rows": 7}] * 4 and len(calls) == 1


def test_a_computation_that_fails_lets_the_next_caller_compute() -> None:
    key = EXAMPLE_KEYS[cache.JOB_FIGURES]()

    def broken() -> Any:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        cache.get_or_set(cache.JOB_FIGURES, key, broken)
    # Its claim went with it: the next miss computes at once, without waiting.
    started = time.monotonic()
    assert cache.get_or_set(cache.JOB_FIGURES, key, lambda: 5) == 5
    assert time.monotonic() - started < cache.WAIT_POLL_SECONDS * 10
