"""A cluster's health source: the API (roles read, operators write, audited, bad paths
refused), beat's claim, the health-check hook on a real directory, the job page's notice of
a node that turned unhealthy during the run, and the /metrics gauges."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

import health.tasks
from core.models import AuditEvent
from factories import ClusterFactory, GpuFactory, JobFactory, NodeFactory
from health.models import GpuHealth, HealthEvent, HealthSource
from health.tasks import health_collect_due
from jobs.models import Job, JobEvent
from runs.runtime import TRAINER_BOOTSTRAP

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "scripts" / "gantry-health-check"


def url(cluster: Any) -> str:
    return f"/api/v1/clusters/{cluster.pk}/health-source/"


def test_roles_read_operators_write_and_changes_are_audited(
    operator_api: APIClient, researcher_api: APIClient, outsider_api: APIClient
) -> None:
    cluster = ClusterFactory()
    read = researcher_api.get(url(cluster))
    assert read.status_code == 200 and read.json()["configured"] is False
    assert outsider_api.get(url(cluster)).status_code == 403
    body = {"directory": "/var/lib/gantry/health", "interval_seconds": 30}
    assert researcher_api.put(url(cluster), body, format="json").status_code == 403
    assert not HealthSource.objects.exists()

    made = operator_api.put(url(cluster), body, format="json")
    assert made.status_code == 200, made.json()
    assert made.json()["configured"] and made.json()["interval_seconds"] == 30
    changed = operator_api.patch(url(cluster), {"enabled": False}, format="json")
    assert changed.status_code == 200 and changed.json()["enabled"] is False
    events = list(AuditEvent.objects.filter(action="health_source.update").order_by("id"))
    assert [e.details["created"] for e in events] == [True, False]
    assert events[1].details["before"]["enabled"] is True
    assert events[1].details["after"]["enabled"] is False
    assert events[1].actor_name == "olivia-operator"
    assert researcher_api.get(url(cluster)).json()["directory"] == "/var/lib/gantry/health"


@pytest.mark.parametrize(
    "directory",
    ["relative/health", "/", "/var/lib/../etc", "/var/lib/health/", "/var/lib//h", "/a b", "/a;b"],
)
def test_a_bad_directory_is_a_400(operator_api: APIClient, directory: str) -> None:
    cluster = ClusterFactory()
    response = operator_api.put(url(cluster), {"directory": directory}, format="json")
    assert response.status_code == 400, response.json()
    assert "directory" in json.dumps(response.json())
    assert not HealthSource.objects.exists()


def test_a_new_source_needs_a_directory(operator_api: APIClient) -> None:
    cluster = ClusterFactory()
    response = operator_api.put(url(cluster), {"interval_seconds": 60}, format="json")
    assert response.status_code == 400 and not HealthSource.objects.exists()


def test_beat_claims_each_due_source_once(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, tuple[Any, ...]]] = []
    monkeypatch.setattr(
        health.tasks, "task_send", lambda name, *args: sent.append((name, args)) or True
    )
    due = HealthSource.objects.create(cluster=ClusterFactory(), directory="/h")
    HealthSource.objects.create(cluster=ClusterFactory(), directory="/h", enabled=False)
    HealthSource.objects.create(
        cluster=ClusterFactory(),
        directory="/h",
        next_collect_at=timezone.now() + timedelta(hours=1),
    )
    assert health_collect_due() == 1
    assert sent == [("health.collect_cluster", (due.cluster_id,))]
    # Claimed: the next beat does not enqueue the same turn again.
    assert health_collect_due() == 0


# The hook: Slurm runs it as root; it refuses settings, programs and directories that are
# not root's alone, so it runs only as root here.
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the hook checks root ownership")


def test_the_hook_uses_the_trainers_bootstrap() -> None:
    assert f"BOOTSTRAP='{TRAINER_BOOTSTRAP}'" in HOOK.read_text()


def hook(tmp_path: Path, node: str, **settings: str) -> subprocess.CompletedProcess[str]:
    values = {
        "HEALTH_DIR": str(tmp_path / "probes"),
        "PYTHON": "/usr/bin/python3",
        "TRAINER_DIR": str(REPO),
        "NVIDIA_SMI": str(REPO / "scripts" / "fake-nvidia-smi"),
        "TIMEOUT": "30",
        "FAKE_GPU_DIR": str(tmp_path / "fake-gpu"),
        **settings,
    }
    (tmp_path / "fake-gpu").mkdir(exist_ok=True)
    (tmp_path / "fake-gpu" / node.replace("/", "_")).write_text("a100\n")
    conf = tmp_path / "gantry-health-check.env"
    conf.write_text("".join(f"{key}={value}\n" for key, value in values.items()))
    conf.chmod(0o644)
    return subprocess.run(
        [str(HOOK), str(conf)],
        env={"SLURMD_NODENAME": node, "GANTRY_FAKE_GPU_PROFILE": "h100 xid79"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@needs_root
def test_the_hook_writes_the_probe_atomically_as_root(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    done = hook(tmp_path, "n3")
    assert done.returncode == 0, done.stderr
    written = tmp_path / "probes" / "n3.json"
    assert oct(written.stat().st_mode & 0o777) == "0o644" and written.stat().st_uid == 0
    assert oct((tmp_path / "probes").stat().st_mode & 0o777) == "0o755"
    document = json.loads(written.read_text())
    assert document["schema"] == "gantry-node-probe/1" and document["node"] == "n3"
    # The hook's environment is fixed: a profile set around it does not reach the probe.
    smi = document["commands"]["nvidia_smi"]
    assert smi["exit_code"] == 0 and "<nvidia_smi_log>" in smi["stdout"]
    assert "Xid" not in document["commands"]["kernel_log"]["stdout"]
    assert os.listdir(tmp_path / "probes") == ["n3.json"]


@needs_root
def test_the_hook_writes_a_failed_probe_and_refuses_bad_settings(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    done = hook(tmp_path, "n4", TRAINER_DIR=str(tmp_path / "empty"))
    assert done.returncode == 0 and "TRAINER_DIR" not in done.stdout
    assert not (tmp_path / "probes" / "n4.json").exists()
    (tmp_path / "bin").mkdir(mode=0o755)
    failing = tmp_path / "bin" / "python"
    failing.write_text("#!/bin/sh\nexit 3\n")
    failing.chmod(0o755)
    done = hook(tmp_path, "n4", PYTHON=str(failing))
    assert done.returncode == 0
    document = json.loads((tmp_path / "probes" / "n4.json").read_text())
    assert document["commands"]["nvidia_smi"]["error"] == "the probe exited with 3"
    assert hook(tmp_path, "../n5").returncode == 0
    assert sorted(os.listdir(tmp_path / "probes")) == ["n4.json"]


# The job page: a node of the allocation turned unhealthy while the job ran.


def test_the_job_page_names_a_node_that_turned_unhealthy_during_the_run(
    researcher: Any,
) -> None:
    cluster = ClusterFactory()
    n1 = NodeFactory(cluster=cluster, name="n1")
    n2 = NodeFactory(cluster=cluster, name="n2")
    job = JobFactory(
        owner=researcher, cluster=cluster, state=Job.State.COMPLETED, allocated_nodes="n[1-2]"
    )
    started = timezone.now() - timedelta(hours=2)
    event = JobEvent.objects.create(job=job, kind="state", from_state="pending", to_state="running")
    JobEvent.objects.filter(pk=event.pk).update(at=started)
    Job.objects.filter(pk=job.pk).update(ended_at=started + timedelta(hours=1))
    during = started + timedelta(minutes=30)
    HealthEvent.objects.create(
        node=n2, at=during, from_state="ok", to_state="critical", reason="GPU 0: XID 79"
    )
    # Before the run and after it: not the job's business.
    HealthEvent.objects.create(
        node=n1, at=started - timedelta(minutes=5), from_state="ok", to_state="warning"
    )
    HealthEvent.objects.create(
        node=n1, at=started + timedelta(hours=1, minutes=5), from_state="ok", to_state="critical"
    )
    client = Client()
    client.force_login(researcher)
    page = client.get(f"/jobs/{job.id}/").content.decode()
    assert 'data-testid="health-notice"' in page
    assert "Ran on 1 node that turned unhealthy during the run" in page
    assert f'href="/nodes/{n2.pk}/">n2</a> turned' in page and "XID 79" in page
    assert "n1</a>" not in page.split('data-testid="health-notice"')[1].split("</p>")[0]


def test_no_notice_for_a_job_whose_nodes_stayed_healthy(researcher: Any) -> None:
    job = JobFactory(owner=researcher, state=Job.State.RUNNING, allocated_nodes="n1")
    JobEvent.objects.create(job=job, kind="state", from_state="pending", to_state="running")
    client = Client()
    client.force_login(researcher)
    assert "health-notice" not in client.get(f"/jobs/{job.id}/").content.decode()


# /metrics


def test_the_gauges_show_each_nodes_state_and_gpus_by_health(client: Client, settings: Any) -> None:
    settings.METRICS_TOKEN = "scrape-token-0123456789"
    cluster = ClusterFactory(name="gpu-c")
    ok = NodeFactory(cluster=cluster, name="a1", health_state="ok")
    bad = NodeFactory(cluster=cluster, name="a2", health_state="critical")
    never = NodeFactory(cluster=cluster, name="a3")
    for node in (ok, bad, never):
        GpuFactory(node=node, index=0)
        GpuFactory(node=node, index=1)
    GpuHealth.objects.create(node=ok, index=0, state="ok")
    GpuHealth.objects.create(node=ok, index=1, state="warning")
    GpuHealth.objects.create(node=bad, index=0, state="critical")
    GpuHealth.objects.create(node=bad, index=1, state="ok")
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token-0123456789")
    assert response.status_code == 200
    found = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def node(name: str, state: str) -> float:
        labels = frozenset({"cluster": "gpu-c", "node": name, "state": state}.items())
        return found[("gantry_node_health", labels)]

    def gpus(state: str) -> float:
        labels = frozenset({"cluster": "gpu-c", "state": state}.items())
        return found[("gantry_gpu_health_total", labels)]

    assert (node("a1", "ok"), node("a1", "critical")) == (1.0, 0.0)
    assert (node("a2", "critical"), node("a2", "ok")) == (1.0, 0.0)
    assert node("a3", "unknown") == 1.0
    # A critical node's GPUs all count critical; never probed: unknown.
    assert (gpus("ok"), gpus("warning"), gpus("critical"), gpus("unknown")) == (1, 1, 2, 2)


def test_operators_edit_a_health_source_in_the_admin_through_the_service(operator: Any) -> None:
    cluster = ClusterFactory()
    client = Client()
    client.force_login(operator)
    response = client.post(
        "/admin/health/healthsource/add/",
        {
            "cluster": cluster.pk,
            "directory": "/srv/health",
            "enabled": "on",
            "interval_seconds": 45,
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    source = HealthSource.objects.get(cluster=cluster)
    assert (source.directory, source.interval_seconds, source.updated_by) == (
        "/srv/health",
        45,
        operator,
    )
    assert AuditEvent.objects.get(action="health_source.update").actor == operator
