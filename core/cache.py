"""The read-through cache of what pages, the API and ``/metrics`` compute and then reuse.

Each cached thing has a name (``JOB_FIGURES``, ...), one key function named for it
(``key_job_figures``) and one lifetime in ``LIFETIMES``. A key is built only from the typed
values its value is computed from (never from a raw query string), so nothing is ever
invalidated: a changed input is another key, and the old entry expires with its lifetime.
Every key starts with ``KEY_PREFIX``; bump its version when what a name holds changes shape,
and the old entries are never read again.

Reading goes through ``get_or_set`` (``get_many_or_set`` for many keys in one round trip;
``get_or_set`` computes each key once at a time: the callers that miss while another
computes it wait for its value, so an expensive entry's expiry is one computation, not one
per worker thread),
or ``get``/``put`` where a value is read, updated and kept again, and ``peek`` where a
conditional request only wants to know whether a value is there.

Fail-soft: the cache (the ``computed`` alias: Redis, short socket timeouts) being down,
slow or answering garbage is a miss, and the value is computed and not kept; nothing here
raises. The first failure is logged, once, and the cache is then left alone for
``RETRY_SECONDS``, so that an outage does not cost every read a socket timeout; the first
success after it is logged too.

Hits and misses are counted per name, in the process, and added to shared counters in the
``worker_stats`` cache (as ``core.worker_stats`` does for the watcher) at most every
``FLUSH_SECONDS``, so a cache read costs no extra round trip. ``console.exporter`` exports
them (``cache_counts``) as ``gantry_cache_hits_total`` and ``gantry_cache_misses_total``.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from django.conf import settings
from django.core.cache import caches

from core.worker_stats import CACHE_ALIAS as COUNTS_CACHE_ALIAS

logger = logging.getLogger(__name__)

CACHE_ALIAS = "computed"
# Bumped when what a name's value holds changes shape: every older entry is then ignored.
KEY_PREFIX = "v2:"

# The cached things.
JOB_FIGURES = "job_figures"
JOB_LIST_ROWS = "job_list_rows"
JOB_LIST_PAGE = "job_list_page"
JOB_METRICS = "job_metrics"
JOB_METRICS_BODY = "job_metrics_body"
JOB_SERIES_STATE = "job_series_state"
JOB_PLACEMENT = "job_placement"
GOODPUT_STEP_TOTALS = "goodput_step_totals"
CLUSTER_FAILURE_HISTORY = "cluster_failure_history"
METRICS_GOODPUT = "metrics_goodput"
OVERVIEW_NODE_COUNTS = "overview_node_counts"
OVERVIEW_SNAPSHOT = "overview_snapshot"
OVERVIEW_GOODPUT_WEEKS = "overview_goodput_weeks"


@dataclass(frozen=True)
class FromSetting:
    """A lifetime a setting holds, read on every use (so an overridden setting counts)."""

    setting: str


# Seconds each thing is kept. 0 (only a setting can say so) turns its cache off: the value
# is computed on every read, and nothing is counted.
LIFETIMES: Mapping[str, int | FromSetting] = {
    # The key names the minute (the page says the figures are at most a minute old); two
    # minutes, so an entry made late in its minute outlives it.
    JOB_FIGURES: 120,
    # The key names the page's row versions.
    JOB_LIST_ROWS: 600,
    # The key names the page's row versions and the minute (its ages are in words).
    JOB_LIST_PAGE: 120,
    # The key names the job's metrics offset (new points are another key).
    JOB_METRICS: 600,
    # The key names everything the answer shows (the offset and the events' values).
    JOB_METRICS_BODY: 600,
    # An unused series state; a new poll after that builds it again from every point.
    JOB_SERIES_STATE: 3600,
    # The key names the allocation, which does not change while the job runs.
    JOB_PLACEMENT: 7 * 86_400,
    # A redone job's split sums change only with its points, which are in the key.
    GOODPUT_STEP_TOTALS: 86_400,
    # An interruption rate over the cluster's whole history moves slowly.
    CLUSTER_FAILURE_HISTORY: 60,
    # /metrics' goodput of a week of jobs: computed again at most once a minute.
    METRICS_GOODPUT: 60,
    # The overview's node and GPU counts (a sync is in the key and renews them sooner).
    OVERVIEW_NODE_COUNTS: 30,
    # The overview's live part, shared by everyone with the same view.
    OVERVIEW_SNAPSHOT: FromSetting("OVERVIEW_SNAPSHOT_SECONDS"),
    # The overview's goodput table of eight weeks of jobs: a worker computes it again once
    # it is older than a minute (``get_or_refresh``); kept this long should none do so.
    OVERVIEW_GOODPUT_WEEKS: 600,
}
NAMES = tuple(LIFETIMES)

# After a failure, the cache is not asked again for this long (reads are misses).
RETRY_SECONDS = 5.0
# Counts are added to the shared counters at most this often per process...
FLUSH_SECONDS = 5.0
# ...and, when the counters' cache cannot be reached, tried again after this long.
FLUSH_RETRY_SECONDS = 60.0

HITS = "hits"
MISSES = "misses"
OUTCOMES = (HITS, MISSES)

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

_MISSING = object()


def lifetime(name: str) -> int:
    """Seconds ``name``'s values are kept (``LIFETIMES``)."""
    seconds = LIFETIMES[name]
    if isinstance(seconds, FromSetting):
        return int(getattr(settings, seconds.setting))
    return seconds


# ------------------------------------------------------------------ keys


def _key(name: str, *parts: object) -> str:
    return KEY_PREFIX + ":".join((name, *(str(part) for part in parts)))


def _digest(*parts: object) -> str:
    """A short digest of ``parts`` (their ``repr``), for inputs of any length."""
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()


def _timestamp(moment: datetime | None) -> str:
    return "" if moment is None else repr(moment.timestamp())


def key_job_figures(*, job_id: UUID, version: str, minute: int) -> str:
    """A job page's goodput ledger and work at risk: the job as of ``version`` (a digest of
    what the page shows of it and of its resumed jobs), worked out in ``minute``."""
    return _key(JOB_FIGURES, job_id, version, minute)


def key_job_list_rows(*, rows: Sequence[Sequence[object]]) -> str:
    """One rendered page of the job list, by the row versions it shows
    (``jobs.selectors.job_list_versions``). The filters, cursor and page size choose the
    rows, so they are named through them; anything else in the query string is not."""
    return _key(JOB_LIST_ROWS, _digest([tuple(row) for row in rows]))


def key_job_list_page(*, rows: Sequence[Sequence[object]], minute: int) -> str:
    """The job list page's table rows, rendered, by the row versions they show
    (``jobs.list_page``) and the minute they were rendered in (the Age column)."""
    return _key(JOB_LIST_PAGE, _digest([tuple(row) for row in rows]), minute)


def key_job_metrics(
    *,
    job_id: UUID,
    metrics_offset: int,
    step_min: int | None,
    step_max: int | None,
    max_points: int,
) -> str:
    """A job's chart series for a step range, as of its metrics offset."""
    return _key(JOB_METRICS, job_id, metrics_offset, step_min, step_max, max_points)


def key_job_metrics_body(*, etag: str) -> str:
    """A job's metrics answer, rendered as JSON, under its ETag (which names the job, its
    metrics offset, the step range, the width and the events' values: everything it
    shows, and nothing of who asks)."""
    return _key(JOB_METRICS_BODY, etag)


def key_job_series_state(
    *, job_id: UUID, rebuilt_offset: int | None, max_points: int, series: Sequence[str]
) -> str:
    """A job's incrementally downsampled series (``jobs.metric_series``), built since the
    job's points were last rewritten (``rebuilt_offset``)."""
    return _key(JOB_SERIES_STATE, job_id, rebuilt_offset, max_points, ",".join(series))


def key_job_placement(
    *, job_id: object, allocated_nodes: str, nodelist_requested: str, switches_requested: str
) -> str:
    """A job's placement verdict for one allocation and request."""
    request = "|".join((allocated_nodes, nodelist_requested, switches_requested))
    digest = hashlib.blake2b(request.encode(), digest_size=16).hexdigest()
    return _key(JOB_PLACEMENT, job_id, digest)


def key_goodput_step_totals(
    *, job_id: object, metrics_offset: int, step_start: int, step_cutoff: int | None
) -> str:
    """A job's step totals split by kept and redone steps, for its step range."""
    return _key(GOODPUT_STEP_TOTALS, job_id, metrics_offset, step_start, step_cutoff)


def key_cluster_failure_history(*, cluster_id: int, cluster_created_at: datetime) -> str:
    """A cluster's interruption history (the cluster row: id and creation time)."""
    return _key(CLUSTER_FAILURE_HISTORY, cluster_id, _timestamp(cluster_created_at))


def key_metrics_goodput(*, clusters: Sequence[tuple[int, datetime]]) -> str:
    """/metrics' goodput ledgers per cluster, for these clusters (id, creation time)."""
    return _key(METRICS_GOODPUT, _digest([(pk, _timestamp(at)) for pk, at in clusters]))


def key_overview_node_counts(*, clusters: Sequence[tuple[int, datetime, datetime | None]]) -> str:
    """The overview's node and GPU counts, for these clusters (id, creation time, last
    inventory sync)."""
    rows = [(pk, _timestamp(created), _timestamp(synced)) for pk, created, synced in clusters]
    return _key(OVERVIEW_NODE_COUNTS, _digest(rows))


def key_overview_snapshot(*, scope: str) -> str:
    """The overview's live part as everyone in ``scope`` sees it ("operators", or one
    person: ``console.overview``'s viewer scope)."""
    return _key(OVERVIEW_SNAPSHOT, scope)


def key_overview_goodput_weeks(
    *, user_id: int | None, user_joined: datetime | None, sees_all: bool, weeks: int
) -> str:
    """The overview's goodput table of ``weeks`` weeks for one person (their row: id and
    creation time), or for everyone who sees every job (``sees_all``, no person)."""
    return _key(OVERVIEW_GOODPUT_WEEKS, user_id, _timestamp(user_joined), int(sees_all), weeks)


# ------------------------------------------------------------------ reading and keeping


def get_or_set(name: str, key: str, compute: Callable[[], T]) -> T:
    """The value kept under ``key`` (made by ``name``'s key function); on a miss,
    ``compute()``, kept for ``name``'s lifetime. A hit or a miss is counted."""
    seconds = lifetime(name)
    if seconds <= 0:
        return compute()
    found = _read(key)
    if found is not _MISSING:
        _count(name, HITS)
        return found  # type: ignore[no-any-return]
    _count(name, MISSES)
    # One computation per key at a time: the first to miss computes, the others wait for
    # its value (``_claim``, ``_wait_for``) instead of computing it on every thread.
    claimed = _claim(key)
    if not claimed:
        found = _wait_for(key)
        if found is not _MISSING:
            return found  # type: ignore[no-any-return]
    try:
        value = compute()
        _write({key: value}, seconds)
    finally:
        if claimed:
            _release(key)
    return value


def get_or_refresh(
    name: str,
    key: str,
    compute: Callable[[], T],
    *,
    fresh_seconds: float,
    refresh: Callable[[], object],
) -> tuple[T, float]:
    """``get_or_set`` for a value too costly to compute while someone waits, and the time
    (seconds since the epoch) it was computed. Once it is older than ``fresh_seconds`` it
    is still answered, and ``refresh()`` asks for it to be computed elsewhere (a worker,
    which keeps it with ``put_refreshed``), at most once per ``fresh_seconds`` across
    processes.
    ``compute()`` runs here only when nothing is kept: the first read, or no refresh for
    ``name``'s whole lifetime (workers down)."""
    value, at = get_or_set(name, key, lambda: (compute(), _clock()))
    if _clock() - at > fresh_seconds and _claim_refresh(key, fresh_seconds):
        refresh()
    return value, at


def put_refreshed(name: str, key: str, value: object) -> None:
    """Keep ``value``, computed now, as ``get_or_refresh`` answers it."""
    put(name, key, (value, _clock()))


def _clock() -> float:
    """Seconds since the epoch: when a refreshed value was computed (shared by processes)."""
    return time.time()


def _claim_refresh(key: str, seconds: float) -> bool:
    """True for the first caller to find ``key`` stale in ``seconds``; False when the cache
    cannot tell (unreachable: nothing is kept then, every read computes)."""
    return _mark(f"{key}:refresh", max(1, int(seconds))) is True


# Single flight: a miss claims ``<key>:computing`` (SET NX) for at most CLAIM_SECONDS; a
# miss that finds it claimed polls for the value every WAIT_POLL_SECONDS for at most
# WAIT_SECONDS, then computes itself (a computation that died, or is slower than that).
# With the cache unreachable nothing is claimed and nothing waits.
CLAIM_SECONDS = 30
WAIT_SECONDS = 10.0
WAIT_POLL_SECONDS = 0.02


def _claim(key: str) -> bool:
    """True when this caller is to compute ``key`` (or cannot tell: the cache failed)."""
    return _mark(f"{key}:computing", CLAIM_SECONDS) is not False


def _mark(marker: str, seconds: int) -> bool | None:
    """Whether this caller set ``marker`` (SET NX, kept ``seconds``), or None when the
    cache could not say."""
    if not _availability.usable():
        return None
    try:
        added = bool(caches[CACHE_ALIAS].add(marker, 1, timeout=seconds))
    except Exception:
        _availability.failed()
        return None
    _availability.answered()
    return added


def _release(key: str) -> None:
    if not _availability.usable():
        return
    try:
        caches[CACHE_ALIAS].delete(f"{key}:computing")
    except Exception:
        _availability.failed()


def _wait_for(key: str) -> Any:
    """The value another caller is computing, once it is kept; _MISSING when it is not
    within WAIT_SECONDS, when its claim went away without a value, or the cache failed."""
    # Counted in polls, not read from a clock (a test may hold the clock still).
    for _ in range(round(WAIT_SECONDS / WAIT_POLL_SECONDS)):
        time.sleep(WAIT_POLL_SECONDS)
        if not _availability.usable():
            return _MISSING
        try:
            found = caches[CACHE_ALIAS].get_many([key, f"{key}:computing"])
        except Exception:
            _availability.failed()
            return _MISSING
        if key in found:
            return found[key]
        if f"{key}:computing" not in found:
            return _MISSING
    return _MISSING


def get_many_or_set(
    name: str, keys: Mapping[K, str], compute: Callable[[list[K]], Mapping[K, V]]
) -> dict[K, V]:
    """The value of each item of ``keys`` (item -> its key), read in one round trip.

    ``compute`` is called exactly once, with the items not found (possibly none), so that
    the caller can work out in the same pass what it never keeps; what it returns for those
    items is kept (in one round trip), anything else it returns is handed back as it is.
    Each item found is a hit, each one not found a miss."""
    seconds = lifetime(name)
    if seconds <= 0:
        return dict(compute(list(keys)))
    found_by_key = _read_many(list(keys.values())) if keys else {}
    found = {item: found_by_key[key] for item, key in keys.items() if key in found_by_key}
    missing = [item for item in keys if item not in found]
    _count(name, HITS, len(found))
    _count(name, MISSES, len(missing))
    computed = compute(missing)
    kept = {keys[item]: computed[item] for item in missing if item in computed}
    if kept:
        _write(kept, seconds)
    return {**computed, **found}


def get(name: str, key: str) -> Any | None:
    """The value kept under ``key``, None when there is none (or the cache is off or
    unreachable). A hit or a miss is counted: use it where a miss is then computed and
    kept with ``put``."""
    if lifetime(name) <= 0:
        return None
    found = _read(key)
    _count(name, MISSES if found is _MISSING else HITS)
    return None if found is _MISSING else found


def put(name: str, key: str, value: object) -> None:
    """Keep ``value`` under ``key`` for ``name``'s lifetime."""
    seconds = lifetime(name)
    if seconds > 0:
        _write({key: value}, seconds)


def peek(name: str, key: str) -> Any | None:
    """``get`` for a shortcut that only uses a value already kept (a conditional request):
    a hit is counted, a miss is not, since the caller then reads it with ``get_or_set``."""
    if lifetime(name) <= 0:
        return None
    found = _read(key)
    if found is _MISSING:
        return None
    _count(name, HITS)
    return found


class _Availability:
    """Whether the cache answered last time; after a failure, when to ask it again."""

    def __init__(self) -> None:
        self.failing = False
        self.retry_at = 0.0

    def usable(self) -> bool:
        return not self.failing or time.monotonic() >= self.retry_at

    def failed(self) -> None:
        if not self.failing:
            logger.warning(
                "the %r cache failed; computing without it (retried every %s s)",
                CACHE_ALIAS,
                RETRY_SECONDS,
                exc_info=True,
            )
        self.failing = True
        self.retry_at = time.monotonic() + RETRY_SECONDS

    def answered(self) -> None:
        if self.failing:
            self.failing = False
            logger.info("the %r cache answers again", CACHE_ALIAS)


_availability = _Availability()


def _read(key: str) -> Any:
    if not _availability.usable():
        return _MISSING
    try:
        found = caches[CACHE_ALIAS].get(key, _MISSING)
    except Exception:
        # Any failure is a miss, never an error page.
        _availability.failed()
        return _MISSING
    _availability.answered()
    return found


def _read_many(keys: list[str]) -> dict[str, Any]:
    if not _availability.usable():
        return {}
    try:
        found = caches[CACHE_ALIAS].get_many(keys)
    except Exception:
        _availability.failed()
        return {}
    _availability.answered()
    return found


def _write(values: Mapping[str, object], seconds: int) -> None:
    if not _availability.usable():
        return
    try:
        caches[CACHE_ALIAS].set_many(dict(values), timeout=seconds)
    except Exception:
        _availability.failed()
        return
    _availability.answered()


# ------------------------------------------------------------------ hit and miss counts


@dataclass(frozen=True)
class CacheCounts:
    hits: int = 0
    misses: int = 0


def count_key(name: str, outcome: str) -> str:
    """The shared counter of ``name``'s hits or misses (in the ``worker_stats`` cache)."""
    return f"cache:{name}:{outcome}"


class _Counts:
    """This process's hits and misses not yet added to the shared counters."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: dict[tuple[str, str], int] = {}
        self.flush_at = time.monotonic() + FLUSH_SECONDS

    def add(self, name: str, outcome: str, count: int) -> bool:
        """Count; True when the counts are due to be flushed."""
        with self.lock:
            self.pending[(name, outcome)] = self.pending.get((name, outcome), 0) + count
            return time.monotonic() >= self.flush_at

    def take(self) -> dict[tuple[str, str], int]:
        with self.lock:
            pending, self.pending = self.pending, {}
            self.flush_at = time.monotonic() + FLUSH_SECONDS
            return pending

    def give_back(self, pending: Mapping[tuple[str, str], int]) -> None:
        """Counts that could not be flushed: kept for a later try."""
        with self.lock:
            for counter, count in pending.items():
                self.pending[counter] = self.pending.get(counter, 0) + count
            self.flush_at = time.monotonic() + FLUSH_RETRY_SECONDS

    def forget(self) -> None:
        """In a forked child: the parent flushes what it counted."""
        self.lock = threading.Lock()
        self.pending = {}


_counts = _Counts()
os.register_at_fork(after_in_child=_counts.forget)


def _count(name: str, outcome: str, count: int = 1) -> None:
    if count and _counts.add(name, outcome, count):
        flush_counts()


def flush_counts() -> None:
    """Add this process's counts to the shared counters (best effort: with their cache
    unreachable they are kept and tried again after ``FLUSH_RETRY_SECONDS``)."""
    pending = _counts.take()
    if not pending:
        return
    done: list[tuple[str, str]] = []
    try:
        shared = caches[COUNTS_CACHE_ALIAS]
        for (name, outcome), count in pending.items():
            key = count_key(name, outcome)
            try:
                shared.incr(key, count)
            except ValueError:
                # Not there yet (or evicted): start it; another process may just have.
                if not shared.add(key, count, timeout=None):
                    shared.incr(key, count)
            done.append((name, outcome))
    except Exception:
        logger.warning("could not record cache hit and miss counts", exc_info=True)
        _counts.give_back({counter: n for counter, n in pending.items() if counter not in done})


atexit.register(flush_counts)


def cache_counts() -> dict[str, CacheCounts] | None:
    """Every name's hits and misses as all processes have recorded them (this one's
    flushed first), in one round trip; None when their cache cannot be reached."""
    flush_counts()
    keys = {count_key(name, outcome): (name, outcome) for name in NAMES for outcome in OUTCOMES}
    try:
        found = caches[COUNTS_CACHE_ALIAS].get_many(list(keys))
    except Exception:
        logger.warning("could not read cache hit and miss counts", exc_info=True)
        return None
    values: dict[str, dict[str, int]] = {name: {} for name in NAMES}
    for key, value in found.items():
        name, outcome = keys[key]
        values[name][outcome] = int(value)
    return {name: CacheCounts(**counts) for name, counts in values.items()}
