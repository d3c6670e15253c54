"""What the pages poll answers 304 Not Modified while nothing it shows changed, and the fresh
content as soon as something did: the job page's header and metrics, the drill page's
status, the node table, the API's job list. And the overview's figures are the ones the
fleet's own reads give."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from drills.models import RestoreDrill
from drills.selectors import drill_fleet_health
from factories import CheckpointFactory, ClusterFactory, GpuFactory, JobFactory, NodeFactory
from jobs.ingest import metrics_ingest
from jobs.lifecycle import job_event
from jobs.models import Job
from nodes.models import Node, NodeEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def page(researcher: Any) -> Client:
    client = Client()
    client.force_login(researcher)
    return client


def first_and_again(client: Client, path: str, **headers: Any) -> tuple[Any, Any]:
    first = client.get(path, **headers)
    assert first.status_code == 200, first.status_code
    assert first["ETag"].startswith('"')
    # Kept by the browser, asked again on every poll, never shared.
    assert "no-cache" in first["Cache-Control"] and "private" in first["Cache-Control"]
    again = client.get(path, HTTP_IF_NONE_MATCH=first["ETag"], **headers)
    return first, again


def revalidate(client: Client, path: str, etag: str, **headers: Any) -> Any:
    return client.get(path, HTTP_IF_NONE_MATCH=etag, **headers)


def test_the_job_header_is_not_sent_again_until_the_job_changes(
    page: Client, researcher: Any, still_clock: Any
) -> None:
    job = JobFactory(owner=researcher, state=Job.State.RUNNING, started_at=timezone.now())
    path = f"/jobs/{job.id}/status/"
    page.get(path)  # the session's CSRF cookie, which the header's forms use
    first, again = first_and_again(page, path)
    assert again.status_code == 304 and not again.content
    assert again["ETag"] == first["ETag"]
    # A new timeline entry (the watcher adds them with plain inserts).
    job_event(job, "state", message="node n3 is draining")
    changed = revalidate(page, path, first["ETag"])
    assert changed.status_code == 200 and "node n3 is draining" in changed.content.decode()
    # A checkpoint proven by a drill (a conditional update, no save()).
    checkpoint = CheckpointFactory(job=job, step=200)
    fresh = revalidate(page, path, changed["ETag"])
    assert fresh.status_code == 200
    from jobs.models import Checkpoint

    Checkpoint.objects.filter(pk=checkpoint.pk).update(last_proven_at=timezone.now())
    proven = revalidate(page, path, fresh["ETag"])
    assert proven.status_code == 200
    assert 'data-testid="newest-proven"><a href' in proven.content.decode()
    # The state moves with a conditional update too.
    Job.objects.filter(pk=job.pk).update(state=Job.State.COMPLETED)
    done = revalidate(page, path, proven["ETag"])
    assert done.status_code == 200 and 'data-state="completed"' in done.content.decode()


def test_the_job_header_goes_stale_once_a_minute(
    page: Client, researcher: Any, monkeypatch: Any
) -> None:
    job = JobFactory(owner=researcher, state=Job.State.RUNNING, started_at=timezone.now())
    path = f"/jobs/{job.id}/status/"
    page.get(path)
    first, again = first_and_again(page, path)
    assert again.status_code == 304
    # "proven 3 minutes ago" must not stay "3 minutes" for ever.
    import core.conditional

    later = core.conditional.time.time() + 61
    monkeypatch.setattr(core.conditional.time, "time", lambda: later)
    assert revalidate(page, path, first["ETag"]).status_code == 200


def test_the_header_of_another_persons_job_is_still_refused(
    page: Client, other_researcher: Any
) -> None:
    theirs = JobFactory(owner=other_researcher)
    assert page.get(f"/jobs/{theirs.id}/status/", HTTP_IF_NONE_MATCH="*").status_code == 404


def test_metrics_are_sent_again_only_when_new_points_arrived(
    page: Client, researcher: Any, still_clock: Any
) -> None:
    job = JobFactory(owner=researcher, state=Job.State.RUNNING)
    line = {"step": 1, "time": 1_800_000_000, "loss": 2.0, "step_time": 0.1}
    metrics_ingest(job=job, data=(json.dumps(line) + "\n").encode(), start_offset=0)
    path = f"/api/v1/jobs/{job.id}/metrics/?max_points=500"
    first, again = first_and_again(page, path)
    assert again.status_code == 304
    # Another chart width is another answer.
    assert revalidate(page, path.replace("500", "600"), first["ETag"]).status_code == 200
    job.refresh_from_db()
    line.update(step=2, time=1_800_000_001)
    metrics_ingest(
        job=job, data=(json.dumps(line) + "\n").encode(), start_offset=job.metrics_offset
    )
    fresh = revalidate(page, path, first["ETag"])
    assert fresh.status_code == 200 and fresh.json()["count"] == 2


def test_a_first_view_of_a_chart_someone_has_seen_is_sent_as_kept(
    page: Client, researcher: Any, operator_api: Any, other_researcher: Any, still_clock: Any
) -> None:
    """The metrics answer is kept rendered under its ETag: another viewer's first view (no
    If-None-Match) gets the same bytes without the points being read, and what the answer
    shows changing (an event's target, new points) is another answer."""
    job = JobFactory(owner=researcher, state=Job.State.RUNNING)
    lines = [{"step": s, "time": 1_800_000_000 + s, "loss": 3.0 - s / 10} for s in range(1, 6)]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    metrics_ingest(job=job, data=data, start_offset=0)
    path = f"/api/v1/jobs/{job.id}/metrics/"
    owners = page.get(path)
    assert owners.status_code == 200 and owners.json()["count"] == 5
    with CaptureQueriesContext(connection) as captured:
        operators = operator_api.get(path)
    assert operators.status_code == 200 and operators.content == owners.content
    assert operators["ETag"] == owners["ETag"]
    # One narrow read of the job (its access check and ETag), and no point or whole job row.
    reads = [q["sql"] for q in captured.captured_queries if '"jobs_' in q["sql"]]
    assert len(reads) == 1 and "jobs_metricpoint" not in reads[0], reads
    # Kept for those who may see the job only: someone else's is still refused.
    stranger = Client()
    stranger.force_login(other_researcher)
    assert stranger.get(path).status_code == 404
    # An event's value changes what the chart shows, without new points.
    Job.objects.filter(pk=job.pk).update(target_loss=2.75)
    moved = operator_api.get(path)
    assert moved.json()["target_loss"] == 2.75 and moved["ETag"] != owners["ETag"]
    job.refresh_from_db()
    more = json.dumps({"step": 6, "time": 1_800_000_006, "loss": 2.4}) + "\n"
    metrics_ingest(job=job, data=more.encode(), start_offset=job.metrics_offset)
    assert page.get(path).json()["count"] == 6
    # The browsable API still renders its own page.
    assert operator_api.get(path, HTTP_ACCEPT="text/html").status_code == 200


def test_the_api_job_list_answers_304_until_a_job_on_the_page_changes(
    researcher_api: Any, researcher: Any
) -> None:
    jobs = [JobFactory(owner=researcher, state=Job.State.PENDING) for _ in range(3)]
    path = "/api/v1/jobs/?page_size=2"
    first, again = first_and_again(researcher_api, path)
    assert again.status_code == 304
    listed = [row["id"] for row in first.json()["results"]]
    assert listed == [str(jobs[2].id), str(jobs[1].id)]
    assert first.json()["next"]
    # A job off this page changes: this page is the same.
    Job.objects.filter(pk=jobs[0].pk).update(state=Job.State.RUNNING)
    assert revalidate(researcher_api, path, first["ETag"]).status_code == 304
    Job.objects.filter(pk=jobs[1].pk).update(state=Job.State.RUNNING, last_step=7)
    fresh = revalidate(researcher_api, path, first["ETag"])
    assert fresh.status_code == 200
    row = fresh.json()["results"][1]
    assert row["state"] == "running" and row["last_step"] == 7
    # The next page is another answer, and follows on from this one.
    second = researcher_api.get(fresh.json()["next"])
    assert [row["id"] for row in second.json()["results"]] == [str(jobs[0].id)]
    assert second["ETag"] != fresh["ETag"]


def test_the_drill_status_is_sent_again_when_the_drill_moves(
    page: Client, researcher: Any, still_clock: Any
) -> None:
    checkpoint = CheckpointFactory(job=JobFactory(owner=researcher))
    drill = RestoreDrill.objects.create(
        checkpoint=checkpoint,
        state=RestoreDrill.State.RUNNING,
        started_at=timezone.now() - timedelta(minutes=2),
    )
    path = f"/drills/{drill.id}/status/"
    first, again = first_and_again(page, path)
    assert again.status_code == 304
    RestoreDrill.objects.filter(pk=drill.pk).update(
        state=RestoreDrill.State.FINISHED, verdict=RestoreDrill.Verdict.PASSED
    )
    fresh = revalidate(page, path, first["ETag"])
    assert fresh.status_code == 200 and 'data-final="1"' in fresh.content.decode()


def test_the_node_table_is_sent_again_when_the_inventory_changes(page: Client) -> None:
    cluster = ClusterFactory()
    node = NodeFactory(cluster=cluster, name="gpu-a1")
    gpu = GpuFactory(node=node, index=0)
    path = "/nodes/live/"
    page.get(path)
    first, again = first_and_again(page, path)
    assert again.status_code == 304
    # The sync's state change: a conditional update that stamps state_changed_at.
    Node.objects.filter(pk=node.pk).update(
        state=Node.State.DRAINED, state_changed_at=timezone.now()
    )
    drained = revalidate(page, path, first["ETag"])
    assert drained.status_code == 200 and 'data-state="drained"' in drained.content.decode()
    # A drain that only changes the reason leaves a node event.
    Node.objects.filter(pk=node.pk).update(reason="fan failure")
    NodeEvent.objects.create(node=node, kind="drain", message="fan failure")
    reason = revalidate(page, path, drained["ETag"])
    assert reason.status_code == 200 and "fan failure" in reason.content.decode()
    # A GPU's state (the sync saves it).
    gpu.state = "allocated"
    gpu.save(update_fields=["state", "updated_at"])
    assert revalidate(page, path, reason["ETag"]).status_code == 200
    # Another filter is another table.
    assert revalidate(page, path + "?state=idle", reason["ETag"]).status_code == 200


def test_the_overview_counts_what_the_fleet_reads_count(
    page: Client, researcher: Any, other_researcher: Any
) -> None:
    cluster = ClusterFactory(name="ov-a")
    running = [
        JobFactory(owner=researcher, cluster=cluster, state=Job.State.RUNNING, throughput_now=50)
        for _ in range(3)
    ]
    CheckpointFactory(job=running[0], step=100, last_proven_at=timezone.now())
    CheckpointFactory(job=running[1], step=100, last_proven_at=timezone.now())
    # Its newest checkpoint is not proven: it does not count as proven.
    CheckpointFactory(job=running[1], step=200)
    for state in (Job.State.PENDING, Job.State.QUEUED, Job.State.SUBMITTING):
        JobFactory(owner=researcher, cluster=cluster, state=state)
    JobFactory(owner=other_researcher, cluster=cluster, state=Job.State.PENDING)
    JobFactory(owner=other_researcher, cluster=cluster, state=Job.State.RUNNING)
    cache.clear()
    context = page.get("/overview/live/").context
    health = drill_fleet_health(user=researcher)
    assert context["running_count"] == health["running_jobs"] == 3
    assert context["drill_health"]["running_jobs_proven"] == health["running_jobs_proven"] == 1
    assert context["pending_count"] == 3
    assert context["throughput_now"] == pytest.approx(150)
    html = page.get("/").content.decode()
    assert 'data-testid="node-counts-age"' in html
    assert "computed again in the background once it is 60 s old" in html
    assert 'data-testid="goodput-weeks-at"' in html


def test_the_job_page_is_revalidated_until_the_job_or_its_resumed_jobs_change(
    page: Client, researcher: Any, still_clock: Any
) -> None:
    job = JobFactory(owner=researcher, state=Job.State.FAILED, ended_at=timezone.now())
    path = f"/jobs/{job.id}/"
    page.get(path)  # the session's CSRF cookie (the page's forms)
    first, again = first_and_again(page, path)
    assert again.status_code == 304 and again["ETag"] == first["ETag"]
    # Resumed as a new job (shown under "Resumed as"), then that job starts.
    child = JobFactory(owner=researcher, parent=job, state=Job.State.PENDING, name="resumed-x")
    changed = revalidate(page, path, first["ETag"])
    assert changed.status_code == 200 and "resumed-x" in changed.content.decode()
    Job.objects.filter(pk=child.pk).update(state=Job.State.RUNNING)
    started = revalidate(page, path, changed["ETag"])
    assert started.status_code == 200 and "state-running" in started.content.decode()
    assert revalidate(page, path, started["ETag"]).status_code == 304
