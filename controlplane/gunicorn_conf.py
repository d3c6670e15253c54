"""The production web server's settings: ``gunicorn -c python:controlplane.gunicorn_conf
controlplane.wsgi`` (README, *Production*).

- Threaded workers (``gthread``): a request runs in one of a worker's threads, while the
  worker's own loop keeps telling the master it is alive. So a long download (a whole log
  or a rank's output, streamed by ``jobs.output``) is never cut by ``timeout``, which only
  ends a worker whose loop stopped, and it holds one thread, not a whole worker.
- Warm workers: a worker loads at start what its first requests would otherwise load in
  the middle of being answered (every URL pattern's view, every template, compiled and kept
  by the cached loader). Workers are replaced every ``max_requests``; a replaced one no
  longer answers its first requests cold (the first-view bench's periodic tails).
- Garbage collection: after a worker has loaded Django and warmed (and again once it has
  served its first requests), every object alive is moved out of the collector's sight
  (``gc.freeze``): they live as long as the worker, and a full
  collection no longer walks them. Without it each full collection walked the whole
  framework on every worker (bench/results: the job list's tails).

Every value comes from the environment (``GANTRY_WEB_*``, README's configuration table);
gunicorn's own command-line options still win over them.
"""

from __future__ import annotations

import gc
import logging
import os
from typing import Any

from controlplane.env import envint, envstr

logger = logging.getLogger("controlplane.gunicorn_conf")

bind = envstr("GANTRY_WEB_BIND", "127.0.0.1:8000")
worker_class = "gthread"
workers = envint("GANTRY_WEB_WORKERS", 2 * (os.cpu_count() or 1), minimum=1)
threads = envint("GANTRY_WEB_THREADS", 8, minimum=1, maximum=256)
# Seconds a worker's loop may be silent before the master replaces it (not a request limit).
timeout = envint("GANTRY_WEB_TIMEOUT", 30, minimum=1)
graceful_timeout = envint("GANTRY_WEB_GRACEFUL_TIMEOUT", 30, minimum=1)
# Keep-alive connections from the proxy are held by the worker's loop, not by a thread.
keepalive = envint("GANTRY_WEB_KEEPALIVE", 5, minimum=0)
# Replaced now and then, so that whatever a worker accumulates does not grow for ever.
max_requests = envint("GANTRY_WEB_MAX_REQUESTS", 20_000, minimum=0)
max_requests_jitter = max_requests // 10

# A worker's requests after which what they loaded is frozen too (templates, URL patterns).
FREEZE_AFTER_REQUESTS = 100


def _freeze() -> None:
    gc.collect()
    gc.freeze()


def _warm() -> None:
    from pathlib import Path

    from django.template import engines
    from django.urls import get_resolver

    resolver = get_resolver()
    _ = resolver.url_patterns  # imports every view module
    _ = resolver.reverse_dict  # what ``reverse`` and ``{% url %}`` build on first use
    for engine in engines.all():
        for folder in getattr(engine, "template_dirs", ()):
            root = Path(folder)
            for path in sorted(root.rglob("*.html")) if root.is_dir() else ():
                try:
                    engine.get_template(path.relative_to(root).as_posix())
                except Exception:  # a template that fails now fails in its view
                    logger.warning("could not load template %s at start", path, exc_info=True)


def post_worker_init(worker: Any) -> None:
    try:
        _warm()
    except Exception:  # a worker that cannot warm still serves
        logger.warning("worker warm-up failed", exc_info=True)
    _freeze()
    worker.gantry_requests = 0
    worker.gantry_frozen_again = False


def post_request(worker: Any, req: Any, environ: Any, resp: Any) -> None:
    # Threads may count at once: a count lost now and then only delays the freeze.
    worker.gantry_requests = getattr(worker, "gantry_requests", 0) + 1
    if worker.gantry_requests >= FREEZE_AFTER_REQUESTS and not worker.gantry_frozen_again:
        worker.gantry_frozen_again = True
        _freeze()
