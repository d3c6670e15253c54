"""The web bench's in-process measurements: SQL queries per request, and a cProfile of one
endpoint. Each runs as a child in the tree's own directory and Python path, with Django's
test client, so the baseline's code counts its own queries."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

# Who asks: the researcher who owns the metric jobs, or an operator (who sees every job).
RESEARCHER, OPERATOR = "researcher", "operator"

# The part of the child both scripts share: a signed-in page client and an API client with
# a token, per persona (the users and tokens named in the environment).
_CLIENTS = r"""
import json, os
import django
django.setup()
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext


def clients(username, token):
    page = Client()
    page.force_login(User.objects.get(username=username))
    return page, Client(HTTP_AUTHORIZATION="Token " + token)


personas = {
    "researcher": clients(os.environ["BENCH_USER"], os.environ["BENCH_TOKEN"]),
    "operator": clients(os.environ["BENCH_OPERATOR"], os.environ["BENCH_OPERATOR_TOKEN"]),
}


def client_for(path, persona):
    page, api = personas[persona]
    return api if path.startswith("/api/v1/jobs/?") else page
"""

# SQL queries per request of each endpoint, as a second request finds the caches, and for a
# revalidation (If-None-Match with the ETag the response came with) where there is one.
QUERY_COUNTER = (
    _CLIENTS
    + r"""
counts = {}
for label, (path, persona) in json.loads(os.environ["BENCH_PATHS"]).items():
    client = client_for(path, persona)
    client.get(path)
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    again = None
    if response.get("ETag"):
        with CaptureQueriesContext(connection) as revalidated:
            second = client.get(path, HTTP_IF_NONE_MATCH=response["ETag"])
        again = len(revalidated.captured_queries) if second.status_code == 304 else None
    counts[label] = [len(captured.captured_queries), again]
print(json.dumps(counts))
"""
)

# Where one endpoint's time goes: cProfile over a few warm requests, the tree's own frames
# and the database, template and JSON calls under them.
PROFILER = (
    _CLIENTS
    + r"""
import cProfile, io, pstats

path, persona, restriction, requests = json.loads(os.environ["BENCH_PROFILE"])
client = client_for(path, persona)
client.get(path)
profile = cProfile.Profile()
profile.enable()
for _ in range(requests):
    client.get(path)
profile.disable()
out = io.StringIO()
pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(restriction, 14)
print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[-3000:])
"""
)


def _run_in_tree(tree: Path, env: dict[str, str], script: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tree,
        env=env,
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"in-process run in {tree} failed:\n{done.stderr[-4000:]}")
    return done.stdout


def query_counts(
    tree: Path, env: dict[str, str], paths: dict[str, tuple[str, str]]
) -> dict[str, list[int | None]]:
    """SQL queries per request of each endpoint in ``tree`` (see ``QUERY_COUNTER``):
    ``paths`` maps a label to its path and persona."""
    out = _run_in_tree(tree, {**env, "BENCH_PATHS": json.dumps(paths)}, QUERY_COUNTER)
    counts: dict[str, list[int | None]] = json.loads(out.strip().splitlines()[-1])
    return counts


def profile(tree: Path, env: dict[str, str], path: str, persona: str, *, requests: int) -> str:
    """The cProfile listing of ``requests`` requests to ``path`` in ``tree``: the tree's own
    frames (not its virtual environment's) and Django's execute, render and JSON calls."""
    restriction = rf"{re.escape(str(tree))}/(?!\.venv/)|execute\b|render\b|json"
    setting = json.dumps([path, persona, restriction, requests])
    return _run_in_tree(tree, {**env, "BENCH_PROFILE": setting}, PROFILER)
