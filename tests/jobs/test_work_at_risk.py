"""Work at risk of running jobs: GPU-hours since the newest proven and newest written
checkpoint; the cluster's proven-age limit (admin, API, audited) and its breaches (the
overview, the job page, the API)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.audit import AuditAction
from core.models import AuditEvent
from factories import CheckpointFactory, ClusterFactory, JobFactory
from jobs.goodput.work_at_risk import (
    job_work_at_risk,
    proven_age_breaches,
    since_checkpoint,
    work_at_risk,
    work_at_risk_by_cluster,
)
from jobs.models import Checkpoint, Job

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


# Pure ------------------------------------------------------------------------------


def test_since_a_checkpoint_and_since_the_start() -> None:
    with_checkpoint = since_checkpoint(step=100, at=at(30), started_at=at(0), gpus=8, now=at(90))
    assert with_checkpoint.age_s == 3600 and with_checkpoint.gpu_hours == 8.0
    none = since_checkpoint(step=None, at=None, started_at=at(0), gpus=8, now=at(90))
    assert none.step is None and none.at == at(0) and none.gpu_hours == 12.0
    # A checkpoint "saved" before the job started (another node's clock, or the resumed
    # checkpoint of the parent): counted from the start.
    early = since_checkpoint(step=5, at=at(-10), started_at=at(0), gpus=2, now=at(30))
    assert early.at == at(0) and early.gpu_hours == 1.0
    # Clocks that disagree never make work at risk negative.
    assert since_checkpoint(step=1, at=at(100), started_at=at(0), gpus=4, now=at(90)).age_s == 0


# Through the database ---------------------------------------------------------------


@pytest.fixture
def running(researcher: Any) -> dict[str, Any]:
    """A running 2×4-GPU job with checkpoints at 100 (proven), 200 (written), 300 (written
    but failed its integrity check) and 50 (proven, removed by retention)."""
    cluster = ClusterFactory(name="alpha", proven_checkpoint_max_age_minutes=60)
    job = JobFactory(
        owner=researcher,
        cluster=cluster,
        state=Job.State.RUNNING,
        nodes=2,
        gpus_per_node=4,
        submitted_at=at(-5),
        started_at=at(0),
    )
    CheckpointFactory(job=job, step=50, saved_at=at(5), last_proven_at=at(6), deleted_at=at(40))
    CheckpointFactory(job=job, step=100, saved_at=at(10), last_proven_at=at(20))
    CheckpointFactory(job=job, step=200, saved_at=at(40))
    CheckpointFactory(job=job, step=300, saved_at=at(70), integrity=Checkpoint.Integrity.FAILED)
    return {"cluster": cluster, "job": job}


@pytest.mark.django_db
def test_gpu_hours_since_the_newest_proven_and_written_checkpoint(running: dict[str, Any]) -> None:
    risk = job_work_at_risk(job=running["job"], now=at(100))
    assert risk is not None
    assert risk.gpus == 8
    assert risk.proven.step == 100 and risk.proven.age_s == 90 * 60
    assert risk.proven.gpu_hours == pytest.approx(8 * 1.5)
    # Step 300 failed its check: one cannot resume from it, so 200 is the newest written.
    assert risk.written.step == 200 and risk.written.gpu_hours == pytest.approx(8 * 1.0)
    assert risk.max_proven_age_s == 3600 and risk.breached
    assert risk.resumed_from_step is None


@pytest.mark.django_db
def test_a_job_without_gpus_counts_its_ranks_and_risks_all_since_its_start(
    researcher: Any,
) -> None:
    job = JobFactory(
        owner=researcher,
        state=Job.State.RUNNING,
        nodes=2,
        gpus_per_node=0,
        tasks_per_node=3,
        started_at=at(0),
    )
    risk = job_work_at_risk(job=job, now=at(30))
    assert risk is not None and risk.gpus == 6
    assert risk.proven.step is None and risk.written.step is None
    assert risk.proven.gpu_hours == risk.written.gpu_hours == pytest.approx(3.0)
    # No limit on this cluster: never a breach.
    assert risk.max_proven_age_s is None and not risk.breached


@pytest.mark.django_db
def test_a_resumed_job_says_whether_it_resumed_from_a_proven_checkpoint(
    running: dict[str, Any],
) -> None:
    parent = running["job"]
    resumed = JobFactory(
        owner=parent.owner,
        cluster=parent.cluster,
        state=Job.State.RUNNING,
        nodes=1,
        gpus_per_node=2,
        parent=parent,
        resume_from=parent.checkpoints.get(step=100),
        started_at=at(200),
    )
    risk = job_work_at_risk(job=resumed, now=at(230))
    assert risk is not None
    # Its own time only: the parent's allocation did the rest.
    assert risk.proven.step is None and risk.proven.gpu_hours == pytest.approx(1.0)
    assert (risk.resumed_from_step, risk.resumed_from_proven) == (100, True)
    assert risk.as_dict()["resumed_from"] == {"checkpoint_step": 100, "proven": True}


@pytest.mark.django_db
def test_only_running_jobs_are_at_risk_and_breaches_need_a_limit(researcher: Any) -> None:
    limited = ClusterFactory(proven_checkpoint_max_age_minutes=30)
    unlimited = ClusterFactory()
    old = JobFactory(owner=researcher, cluster=limited, state=Job.State.RUNNING, started_at=at(0))
    young = JobFactory(
        owner=researcher, cluster=limited, state=Job.State.RUNNING, started_at=at(80)
    )
    JobFactory(owner=researcher, cluster=unlimited, state=Job.State.RUNNING, started_at=at(0))
    JobFactory(owner=researcher, cluster=limited, state=Job.State.COMPLETED, started_at=at(0))
    JobFactory(owner=researcher, cluster=limited, state=Job.State.PENDING)
    risks = work_at_risk(jobs=Job.objects.all(), now=at(100))
    assert len(risks) == 3
    breaches = proven_age_breaches(jobs=Job.objects.all(), now=at(100))
    assert [risk.job_id for risk in breaches] == [str(old.id)]
    totals = work_at_risk_by_cluster(risks)
    assert totals[limited.pk].jobs == 2 and totals[limited.pk].breaches == 1
    assert totals[limited.pk].since_proven_gpu_hours == pytest.approx((100 + 20) / 60)
    assert str(young.id) not in {risk.job_id for risk in breaches}


@pytest.mark.django_db
def test_one_query_for_any_number_of_running_jobs(researcher: Any) -> None:
    cluster = ClusterFactory(proven_checkpoint_max_age_minutes=10)

    def queries(count: int) -> int:
        for _ in range(count):
            job = JobFactory(cluster=cluster, state=Job.State.RUNNING, started_at=at(0))
            CheckpointFactory(job=job, saved_at=at(1), last_proven_at=at(2))
        with CaptureQueriesContext(connection) as captured:
            work_at_risk(jobs=Job.objects.all(), now=at(60))
        return len(captured)

    assert queries(2) == queries(20) == 1


# The API, the page, the overview ----------------------------------------------------


@pytest.mark.django_db
def test_job_detail_api_has_work_at_risk_while_running(
    researcher_api: Any, running: dict[str, Any], monkeypatch: Any
) -> None:
    monkeypatch.setattr("jobs.goodput.work_at_risk.timezone.now", lambda: at(100))
    body = researcher_api.get(f"/api/v1/jobs/{running['job'].id}/").json()["work_at_risk"]
    assert body["gpus"] == 8 and body["breached"] is True
    assert body["since_proven"]["checkpoint_step"] == 100
    assert body["since_proven"]["gpu_hours"] == pytest.approx(12.0)
    assert body["since_written"]["checkpoint_step"] == 200
    assert body["max_proven_age_s"] == 3600
    Job.objects.filter(pk=running["job"].pk).update(state=Job.State.COMPLETED)
    ended = researcher_api.get(f"/api/v1/jobs/{running['job'].id}/").json()
    assert ended["work_at_risk"] is None


@pytest.mark.django_db
def test_job_page_shows_work_at_risk_and_the_breach(
    researcher: Any, running: dict[str, Any], monkeypatch: Any
) -> None:
    monkeypatch.setattr("jobs.goodput.work_at_risk.timezone.now", lambda: at(100))
    page = Client()
    page.force_login(researcher)
    html = page.get(f"/jobs/{running['job'].id}/").content.decode()
    assert 'data-testid="work-at-risk" data-breached="1"' in html
    assert "12.00 GPU-hours</strong> since its newest proven checkpoint (step 100" in html
    assert "8.00 GPU-hours</strong> since its newest written one (step 200" in html
    assert 'data-testid="proven-age-breach"' in html


@pytest.mark.django_db
def test_overview_lists_breaches_of_ones_own_jobs(
    researcher: Any, other_researcher: Any, running: dict[str, Any]
) -> None:
    theirs = JobFactory(
        owner=other_researcher,
        cluster=running["cluster"],
        name="robs-old-run",
        state=Job.State.RUNNING,
        started_at=timezone.now() - timedelta(days=1),
    )
    Job.objects.filter(pk=running["job"].pk).update(started_at=timezone.now() - timedelta(days=1))
    page = Client()
    page.force_login(researcher)
    html = page.get("/").content.decode()
    assert 'data-testid="proven-age-breaches"' in html
    assert f'data-breach-job="{running["job"].id}"' in html
    assert str(theirs.id) not in html and "robs-old-run" not in html
    assert 'data-testid="work-at-risk-table"' in html
    live = page.get("/overview/live/").content.decode()
    assert f'data-breach-job="{running["job"].id}"' in live


# The limit: admin and API, audited ---------------------------------------------------


@pytest.mark.django_db
def test_operators_set_the_limit_through_the_api_audited(
    operator_api: Any, researcher_api: Any
) -> None:
    cluster = ClusterFactory(name="beta")
    url = f"/api/v1/clusters/{cluster.pk}/update/"
    assert (
        researcher_api.patch(
            url, {"proven_checkpoint_max_age_minutes": 5}, format="json"
        ).status_code
        == 403
    )
    response = operator_api.patch(url, {"proven_checkpoint_max_age_minutes": 90}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["proven_checkpoint_max_age_minutes"] == 90
    cluster.refresh_from_db()
    assert cluster.proven_checkpoint_max_age_minutes == 90
    event = AuditEvent.objects.get(action=AuditAction.CLUSTER_UPDATE, target_id=str(cluster.pk))
    assert event.details == {
        "before": {"proven_checkpoint_max_age_minutes": None},
        "after": {"proven_checkpoint_max_age_minutes": 90},
    }
    bad = operator_api.patch(url, {"proven_checkpoint_max_age_minutes": 0}, format="json")
    assert bad.status_code == 400
    assert "proven_checkpoint_max_age_minutes" in bad.json()["extra"]["fields"]
    cleared = operator_api.patch(url, {"proven_checkpoint_max_age_minutes": None}, format="json")
    assert cleared.json()["proven_checkpoint_max_age_minutes"] is None
    # The login is pinned: not editable here.
    pinned = operator_api.patch(url, {"ssh_host": "elsewhere"}, format="json")
    assert pinned.status_code == 200
    cluster.refresh_from_db()
    assert cluster.ssh_host == "127.0.0.1"


@pytest.mark.django_db
def test_operators_set_the_limit_in_the_admin_audited(operator: Any) -> None:
    cluster = ClusterFactory(name="gamma", description="d")
    admin = Client()
    admin.force_login(operator)
    url = f"/admin/nodes/cluster/{cluster.pk}/change/"
    form = admin.get(url)
    assert form.status_code == 200
    assert "proven_checkpoint_max_age_minutes" in form.content.decode()
    # Post the form as the admin renders it (whatever fields others add), with the limit set.
    adminform = form.context["adminform"].form
    data = {
        name: value
        for name, field in adminform.fields.items()
        if (value := adminform.initial.get(name, field.initial)) is not None
    }
    for formset in form.context["inline_admin_formsets"]:
        management = formset.formset.management_form
        data.update(
            {f"{management.prefix}-{key}": value for key, value in management.initial.items()}
        )
    data["proven_checkpoint_max_age_minutes"] = "45"
    response = admin.post(url, data)
    assert response.status_code == 302, response.content.decode()[:2000]
    cluster.refresh_from_db()
    assert cluster.proven_checkpoint_max_age_minutes == 45
    event = AuditEvent.objects.get(action=AuditAction.CLUSTER_UPDATE, target_id=str(cluster.pk))
    assert event.actor == operator
    assert event.details["after"] == {"proven_checkpoint_max_age_minutes": 45}
