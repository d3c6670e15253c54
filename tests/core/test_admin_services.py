"""No back doors: the admin console changes nothing the services would not, and every
change to a cluster, job, drill or policy there is validated and audited."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from core.models import AuditEvent
from drills.models import DrillPolicy, RestoreDrill
from factories import CheckpointFactory, ClusterFactory, JobFactory
from jobs.models import Job
from nodes.models import Cluster

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client: Client, operator: Any) -> Client:
    client.force_login(operator)
    return client


def test_a_job_cannot_be_edited_in_the_admin(admin_client: Client, researcher: Any) -> None:
    job = JobFactory(owner=researcher, partition="batch", environment={"A": "1"})
    url = reverse("admin:jobs_job_change", args=[job.pk])
    page = admin_client.get(url)
    assert page.status_code == 200 and 'name="partition"' not in page.content.decode()
    response = admin_client.post(url, {"partition": "evil", "environment": '{"B\\n": "x"}'})
    assert response.status_code == 403
    job.refresh_from_db()
    assert job.partition == "batch" and job.environment == {"A": "1"}


def test_deleting_a_job_that_has_a_slurm_job_is_refused(admin_client: Client) -> None:
    tracked = JobFactory(state="completed", slurm_job_id="12")
    never = JobFactory(state="cancelled")
    assert (
        admin_client.post(
            reverse("admin:jobs_job_delete", args=[tracked.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    admin_client.post(reverse("admin:jobs_job_delete", args=[never.pk]), {"post": "yes"})
    assert Job.objects.filter(pk=tracked.pk).exists()
    assert not Job.objects.filter(pk=never.pk).exists()
    assert AuditEvent.objects.filter(action="job.delete", target_id=str(never.pk)).exists()
    # Bulk deletion goes through the same service, one by one.
    admin_client.post(
        reverse("admin:jobs_job_changelist"),
        {"action": "delete_selected", "_selected_action": [tracked.pk], "post": "yes"},
    )
    assert Job.objects.filter(pk=tracked.pk).exists()


def test_cancel_from_the_admin_is_audited(admin_client: Client) -> None:
    job = JobFactory(state="queued")
    admin_client.post(
        reverse("admin:jobs_job_changelist"),
        {"action": "cancel_jobs", "_selected_action": [job.pk]},
    )
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert AuditEvent.objects.filter(action="job.cancel", target_id=str(job.pk)).exists()


def test_cluster_changes_go_through_the_service(admin_client: Client) -> None:
    first = ClusterFactory(name="first", is_default=True)
    second = ClusterFactory(name="second")
    url = reverse("admin:nodes_cluster_change", args=[second.pk])
    response = admin_client.post(
        url,
        {
            "description": "the big one",
            "workdir": "/srv/gantry2",
            "python": "/usr/bin/python3",
            "default_partition": "batch",
            "partitions-TOTAL_FORMS": "0",
            "partitions-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    second.refresh_from_db()
    assert second.workdir == "/srv/gantry2" and second.description == "the big one"
    event = AuditEvent.objects.get(action="cluster.update", target_id=str(second.pk))
    assert event.details["before"]["workdir"] == "/srv/gantry"
    assert event.details["after"]["workdir"] == "/srv/gantry2"
    admin_client.post(
        reverse("admin:nodes_cluster_changelist"),
        {"action": "make_default", "_selected_action": [second.pk]},
    )
    second.refresh_from_db()
    first.refresh_from_db()
    assert second.is_default and not first.is_default
    assert AuditEvent.objects.filter(action="cluster.update", details__after__is_default=True)


def test_a_cluster_with_jobs_cannot_be_deleted(admin_client: Client) -> None:
    used = JobFactory().cluster
    unused = ClusterFactory(name="unused")
    assert (
        admin_client.post(
            reverse("admin:nodes_cluster_delete", args=[used.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    admin_client.post(reverse("admin:nodes_cluster_delete", args=[unused.pk]), {"post": "yes"})
    assert Cluster.objects.filter(pk=used.pk).exists()
    assert not Cluster.objects.filter(pk=unused.pk).exists()
    assert AuditEvent.objects.filter(action="cluster.delete", target_repr="unused").exists()


def test_drills_and_policies(admin_client: Client) -> None:
    checkpoint = CheckpointFactory()
    active = RestoreDrill.objects.create(checkpoint=checkpoint, allocation_key="a", state="running")
    done = RestoreDrill.objects.create(
        checkpoint=checkpoint, allocation_key="b", state="finished", verdict="passed"
    )
    assert (
        admin_client.post(
            reverse("admin:drills_restoredrill_delete", args=[active.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    admin_client.post(reverse("admin:drills_restoredrill_delete", args=[done.pk]), {"post": "yes"})
    assert RestoreDrill.objects.filter(pk=active.pk).exists()
    assert AuditEvent.objects.filter(action="drill.delete", target_id=str(done.pk)).exists()
    policy = DrillPolicy.objects.create(cluster=checkpoint.job.cluster)
    assert (
        admin_client.post(
            reverse("admin:drills_drillpolicy_delete", args=[policy.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
