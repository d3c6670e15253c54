"""Fixtures and the closing figures of the "bad input and security" suite.

Every test module here records what it covered in ``security_figures``; at the end of
the run ``pytest_terminal_summary`` prints one line per item of issue 8 (fuzzing,
injection, permission matrix, keys, deployment settings), so a reader sees the scale of
what passed, not only that it passed.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from core.services import api_token_create
from factories import ClusterFactory

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from security_support import make_private_key_text  # noqa: E402


class SecurityFigures:
    """Counters shared by the whole session (one instance per pytest process)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        self.notes: dict[str, list[str]] = defaultdict(list)
        self.sets: dict[str, set[str]] = defaultdict(set)

    def add(self, key: str, amount: int = 1) -> None:
        self.counts[key] += amount

    def note(self, key: str, text: str) -> None:
        self.notes[key].append(text)

    def member(self, key: str, value: str) -> None:
        self.sets[key].add(value)


FIGURES = SecurityFigures()


@pytest.fixture(scope="session")
def security_figures() -> SecurityFigures:
    return FIGURES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    counts, sets, notes = FIGURES.counts, FIGURES.sets, FIGURES.notes
    if not counts and not sets:
        return
    lines: list[str] = []
    if counts.get("fuzz.requests"):
        lines.append(
            f"schemathesis: {len(sets['fuzz.operations'])} operations × "
            f"{len(sets['fuzz.roles'])} roles, {counts['fuzz.requests']} requests, "
            f"{counts['fuzz.server_errors']} server errors, "
            f"{counts['fuzz.shape_violations']} shape violations "
            f"(statuses seen: {', '.join(sorted(sets['fuzz.statuses']))})"
        )
    if counts.get("api_errors.requests"):
        lines.append(
            f"api error shape: {counts['api_errors.requests']} hand-made bad requests "
            f"(404/405/415/400/401/403), {counts['api_errors.violations']} shape violations"
        )
    if counts.get("injection.cases"):
        lines.append(
            f"injection: {len(sets['injection.payloads'])} payloads × "
            f"{len(sets['injection.fields'])} fields = {counts['injection.cases']} cases "
            f"({counts['injection.refused']} refused with the field named, "
            f"{counts['injection.literal']} accepted literally), "
            f"{counts['injection.canary_hits']} canary hits"
        )
    if counts.get("matrix.cells"):
        lines.append(
            f"permission matrix: {len(sets['matrix.routes'])} routes × "
            f"{len(sets['matrix.personas'])} personas = {counts['matrix.cells']} cells, "
            f"{counts['matrix.leaks']} leaks"
            + (
                f"; skipped: {', '.join(sorted(sets['matrix.skipped']))}"
                if sets["matrix.skipped"]
                else ""
            )
        )
    if counts.get("keys.places_scanned"):
        lines.append(
            f"private keys: file 0600 / dir 0700 checked, {counts['keys.places_scanned']} "
            f"places scanned (API, pages, admin, logs, DB text columns), "
            f"{counts['keys.leaks']} leaks"
        )
    if counts.get("deploy.checks"):
        lines.append(
            f"deployment: {counts['deploy.checks']} checks (CSRF on {counts['csrf.forms']} "
            f"POST targets, TLS headers/cookies, login throttle), "
            f"{counts['deploy.failures']} failures"
        )
    for key in sorted(notes):
        for text in notes[key]:
            lines.append(f"{key}: {text}")
    terminalreporter.write_sep("=", "security figures (issue 8)")
    for line in lines:
        terminalreporter.write_line(line)


# ---------------------------------------------------------------- personas with tokens

PERSONAS = ("operator", "researcher", "other_researcher", "outsider", "anonymous")


@pytest.fixture
def persona_users(operator: Any, researcher: Any, other_researcher: Any, outsider: Any) -> Any:
    return {
        "operator": operator,
        "researcher": researcher,
        "other_researcher": other_researcher,
        "outsider": outsider,
        "anonymous": None,
    }


@pytest.fixture
def persona_tokens(persona_users: dict[str, Any]) -> dict[str, str | None]:
    """A personal API token's secret per persona (None for anonymous), made as on the
    tokens page."""
    return {
        name: (
            api_token_create(user=user, name="security tests", expires_at=None)[1]
            if user is not None
            else None
        )
        for name, user in persona_users.items()
    }


@pytest.fixture
def isolated_ssh_dir(settings: Any, tmp_path: Path) -> Path:
    """Keys and known_hosts of this test only, never the shared test data directory."""
    path = tmp_path / "ssh"
    settings.SSH_DIR = path
    settings.SSH_CONNECT_TIMEOUT = 2
    settings.SSH_COMMAND_TIMEOUT = 5
    return path


@pytest.fixture
def dead_cluster(db: Any, isolated_ssh_dir: Path) -> Any:
    """A cluster whose login host does not listen (127.0.0.1 port 1): every call that
    acts on it fails fast with 'connection refused' instead of reaching a real cluster."""
    from nodes.access.cluster import cluster_key_dir, write_private_file
    from nodes.registration import KEY_FILE_NAME

    cluster = ClusterFactory(
        name="deadcluster",
        ssh_host="127.0.0.1",
        ssh_port=1,
        ssh_key_name=KEY_FILE_NAME,
        is_default=True,
        host_key_type="ssh-ed25519",
        host_key_fingerprint="SHA256:" + "A" * 43,
        host_key_line="[127.0.0.1]:1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB" + "A" * 42,
    )
    write_private_file(cluster_key_dir(cluster.name) / KEY_FILE_NAME, make_private_key_text())
    return cluster


@pytest.fixture
def world(dead_cluster: Any, researcher: Any, other_researcher: Any) -> dict[str, Any]:
    """Inventory, and jobs/checkpoints/drills owned by the researcher and by another one."""
    from drills.models import RestoreDrill
    from factories import CheckpointFactory, GpuFactory, JobFactory, NodeFactory, PartitionFactory
    from jobs.models import Job
    from nodes.models import Switch

    PartitionFactory(cluster=dead_cluster, name="batch", is_default=True)
    leaf = Switch.objects.create(cluster=dead_cluster, name="leaf1")
    node = NodeFactory(cluster=dead_cluster, name="n1", leaf_switch=leaf)
    GpuFactory(node=node, index=0)

    def job_of(owner: Any, name: str, slurm_job_id: str) -> Any:
        job = JobFactory(
            owner=owner,
            cluster=dead_cluster,
            name=name,
            state=Job.State.RUNNING,
            slurm_job_id=slurm_job_id,
        )
        checkpoint = CheckpointFactory(job=job, step=100)
        drill = RestoreDrill.objects.create(
            checkpoint=checkpoint,
            requested_by=owner,
            cluster=dead_cluster,
            state=RestoreDrill.State.FINISHED,
            verdict=RestoreDrill.Verdict.PASSED,
        )
        return job, checkpoint, drill

    mine = job_of(researcher, "ritas-secret-run", "4242")
    theirs = job_of(other_researcher, "robs-secret-run", "4343")
    from jobs.models import JobTemplate

    def template_of(owner: Any, name: str) -> Any:
        # Private: only its owner and operators see it.
        settings = {"name": name, "partition": "batch", "config": {"preset": "tiny"}}
        return JobTemplate.objects.create(
            owner=owner, name=name, cluster=dead_cluster, settings=settings
        )

    from django.utils import timezone

    from acceptance.certificate import certificate_issue
    from acceptance.models import AcceptanceRun

    # An ended run with its certificate: the acceptance routes read and download it.
    acceptance_run = AcceptanceRun.objects.create(
        cluster=dead_cluster,
        scope="nodes",
        scope_value="n1",
        partition="batch",
        nodes=["n1"],
        tiers=["inventory"],
        state="finished",
        verdict="inconclusive",
    )
    certificate_issue(run=acceptance_run, now=timezone.now())
    return {
        "acceptance_run": acceptance_run,
        "template": template_of(researcher, "ritas-template"),
        "other_template": template_of(other_researcher, "robs-secret-template"),
        "cluster": dead_cluster,
        "node": node,
        "job": mine[0],
        "checkpoint": mine[1],
        "drill": mine[2],
        "other_job": theirs[0],
        "other_checkpoint": theirs[1],
        "other_drill": theirs[2],
    }


@pytest.fixture
def canary_dir() -> Path:
    """Where injected ``touch`` commands would leave their mark (the dev cluster runs on
    this host, so its /tmp is ours)."""
    path = Path("/tmp")
    assert os.access(path, os.W_OK)
    return path


@pytest.fixture(autouse=True)
def _fresh_rate_limits() -> Any:
    """Failure counters start at zero in every test and are left at zero for the next."""
    from django.core.cache import caches

    caches["ratelimit"].clear()
    yield
    caches["ratelimit"].clear()
