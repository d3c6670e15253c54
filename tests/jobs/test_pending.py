"""Why a job is pending: Slurm's reason codes in words (``jobs.pending``), on the job page
and in the API's job detail, with the job's place in Gantry's view of the queue."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from factories import ClusterFactory, JobFactory
from jobs.pending import pending_reason, pending_reason_explained, pending_reason_parts
from jobs.selectors import job_queue_position

CODES_AND_WORDS = [
    ("Resources", "in use now"),
    ("Priority", "higher priority"),
    ("ReqNodeNotAvail", "node it needs is not available"),
    ("NodeDown", "node it needs is down"),
    ("PartitionNodeLimit", "more nodes"),
    ("PartitionTimeLimit", "longer than the partition's maximum"),
    ("QOSMaxJobsPerUserLimit", "only so many running jobs"),
    ("AssocGrpGRES", "account's group limit on GPUs"),
    ("Dependency", "job it depends on"),
    ("DependencyNeverSatisfied", "never start"),
    ("JobHeldUser", "Held by its owner"),
    ("JobHeldAdmin", "Held by an administrator"),
    ("BeginTime", "start time (--begin)"),
    ("launch failed requeued held", "could not launch it"),
    ("BadConstraints", "constraints"),
    ("InvalidQOS", "QOS (quality of service) is not valid"),
    ("None", "has not given a reason yet"),
    ("", "has not given a reason yet"),
    (None, "has not given a reason yet"),
    # Decoded from the parts of a limit code the table does not name.
    ("QOSGrpCpuLimit", "the QOS's group limit on CPUs"),
    ("AssocMaxWallDurationPerJobLimit", "per-job limit on run time"),
    ("QOSMaxGRESPerUser", "GPUs (GRES)"),
]


@pytest.mark.parametrize(("reason", "words"), CODES_AND_WORDS)
def test_codes_read_as_words(reason: str | None, words: str) -> None:
    explained = pending_reason_explained(reason)
    assert words in explained
    assert not explained.startswith("Slurm says")


def test_unknown_code_is_passed_on_not_guessed() -> None:
    assert pending_reason_explained("FrobnicatedLimit") == "Slurm says: FrobnicatedLimit"
    assert pending_reason("QOS") == {"code": "QOS", "explanation": "Slurm says: QOS"}


def test_detail_and_squeue_text_forms() -> None:
    assert pending_reason_parts("(ReqNodeNotAvail, UnavailableNodes:n[1-2])") == (
        "ReqNodeNotAvail",
        "UnavailableNodes:n[1-2]",
    )
    assert pending_reason_explained("ReqNodeNotAvail, UnavailableNodes:n[1-2]").endswith(
        "(Unavailable nodes: n[1-2])"
    )
    assert "reserved for maintenance" in pending_reason_explained(
        "ReqNodeNotAvail, Reserved for maintenance"
    )
    assert "in use now" in pending_reason_explained("(Resources)")
    assert "not available" in pending_reason_explained(
        "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority "
        "partitions"
    )


@pytest.mark.parametrize("odd", ["(", ")", ",", ", ,", "()", "QOS,", "\x00\n\t", "ü" * 600])
def test_odd_text_never_raises(odd: str) -> None:
    assert pending_reason_explained(odd)
    assert set(pending_reason(odd)) == {"code", "explanation"}


@pytest.fixture
def queue(researcher: Any, other_researcher: Any) -> dict[str, Any]:
    cluster = ClusterFactory(name="east")
    now = timezone.now()

    def pending(name: str, minutes_ago: int, **extra: Any) -> Any:
        values: dict[str, Any] = {
            "owner": researcher,
            "cluster": cluster,
            "name": name,
            "state": "pending",
            "state_reason": "Priority",
            "submitted_at": now - timedelta(minutes=minutes_ago),
        }
        values.update(extra)
        return JobFactory(**values)

    return {
        "first": pending("first", 30, owner=other_researcher),
        "second": pending("second", 20, state_reason="Resources"),
        "third": pending("third", 10),
        "other_partition": pending("elsewhere", 40, partition="gpu"),
        "other_cluster": pending("west", 40, cluster=ClusterFactory(name="west")),
        "running": JobFactory(
            owner=researcher, cluster=cluster, name="running", state="running", started_at=now
        ),
    }


@pytest.mark.django_db
def test_queue_position_counts_pending_jobs_of_the_partition_by_submit_time(
    queue: dict[str, Any],
) -> None:
    second = job_queue_position(job=queue["second"])
    assert second is not None and (second.position, second.of) == (2, 3)
    third = job_queue_position(job=queue["third"])
    assert third is not None and (third.position, third.of) == (3, 3)
    alone = job_queue_position(job=queue["other_partition"])
    assert alone is not None and (alone.position, alone.of) == (1, 1)
    assert job_queue_position(job=queue["running"]) is None


@pytest.mark.django_db
def test_api_job_detail_explains_pending_jobs_only(
    researcher_api: APIClient, queue: dict[str, Any]
) -> None:
    body = researcher_api.get(f"/api/v1/jobs/{queue['second'].id}/").json()
    assert body["pending_reason"]["code"] == "Resources"
    assert "in use now" in body["pending_reason"]["explanation"]
    assert body["pending_reason"]["queue_position"] == {
        "position": 2,
        "of": 3,
        "partition": "batch",
        # Until the watcher has asked Slurm (squeue --start): Gantry's own view.
        "basis": "gantry",
    }
    running = researcher_api.get(f"/api/v1/jobs/{queue['running'].id}/").json()
    assert "pending_reason" in running and running["pending_reason"] is None


@pytest.mark.django_db
def test_job_page_says_why_it_is_pending(
    client: Client, researcher: Any, queue: dict[str, Any]
) -> None:
    client.force_login(researcher)
    page = client.get(f"/jobs/{queue['second'].id}/").content.decode()
    assert "Why pending:" in page and "in use now" in page
    assert "Position in Gantry's view of the queue: 2 of 3" in page
    live = client.get(f"/jobs/{queue['second'].id}/status/").content.decode()
    assert "Why pending:" in live
    running = client.get(f"/jobs/{queue['running'].id}/").content.decode()
    assert "Why pending:" not in running
