from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST

from core import cache
from core.access import can_act, request_user
from core.conditional import etag_for, not_modified, revalidate, static_release, this_minute
from core.errors import ApplicationError, FieldError
from core.roles import is_operator, is_researcher
from health.selectors import HealthNotice, job_health_notices
from jobs.goodput.ledger import format_duration
from jobs.goodput.work_at_risk import job_work_at_risk
from jobs.list_page import (
    Cursor,
    job_list_page_read,
    job_list_page_read_unfiltered,
    job_list_page_rows,
)
from jobs.models import Checkpoint, Job
from jobs.page_versions import JobVersion, job_page_rows, job_page_state, job_version
from jobs.pending_queue import job_pending_summary
from jobs.placement import JobPlacement, job_placement, job_placement_known
from jobs.script import job_script
from jobs.selectors import job_get_for_user, job_goodput, job_list
from jobs.services import job_cancel, job_resume
from jobs.stack_change import stack_changes


@login_required
def job_list_page(request: HttpRequest) -> HttpResponseBase:
    """One page of the job list, newest first (``jobs.list_page``: keyset pages, rows
    rendered once per version and minute); 304 when the browser's copy is current."""
    state = request.GET.get("state") or ""
    owner = request.GET.get("owner") or ""
    search = (request.GET.get("q") or "").strip()
    sees_all = is_operator(request.user)
    mine = request.GET.get("mine", "1" if not sees_all else "0") == "1"
    filters = {"state": state, "owner": owner if sees_all else "", "q": search}
    filters["mine"] = "1" if mine else "0"
    context: dict[str, Any] = {
        "error": "",
        "states": Job.State.choices,
        "state": state,
        "owner": owner,
        "search": search,
        "mine": mine,
        "sees_all": sees_all,
        "can_submit": is_researcher(request.user),
        "cursor": request.GET.get("cursor") or "",
        "newest_query": urlencode({k: v for k, v in filters.items() if v}),
    }
    try:
        cursor = Cursor.decode(context["cursor"]) if context["cursor"] else None
        filtered = bool(state or search or (owner and sees_all))

        def jobs() -> QuerySet[Job]:
            return job_list(
                user=request_user(request),
                state=state or None,
                owner=(owner or None) if sees_all else None,
                search=search or None,
                mine=mine,
            )

        if filtered:
            page = job_list_page_read(jobs(), cursor=cursor)
        else:
            page = job_list_page_read_unfiltered(
                user=request_user(request), mine=mine, cursor=cursor
            )
    except FieldError as refused:
        context.update(error=refused.message, shown=False)
        return render(request, "jobs/job_list.html", context, status=400)
    minute = this_minute()
    older = page.older.encode() if page.older else ""
    etag = etag_for(
        "job list",
        context,
        page.versions,
        older,
        minute,
        request.META.get("CSRF_COOKIE"),
        static_release(),
    )
    unchanged = not_modified(request, etag)
    if unchanged is not None:
        return unchanged
    rows = job_list_page_rows(
        page,
        jobs,
        minute=minute,
        render=lambda shown: render_to_string("jobs/_job_rows.html", {"jobs": shown}),
    )
    context.update(
        shown=bool(page.ids),
        # Rendered by this module's own template (autoescaped), kept in core.cache.
        rows=mark_safe(rows),  # noqa: S308
        older_query=urlencode({**{k: v for k, v in filters.items() if v}, "cursor": older})
        if older
        else "",
    )
    return revalidate(render(request, "jobs/job_list.html", context), etag)


def _job_live_context(request: HttpRequest, job: Job, *, page: bool = False) -> dict[str, Any]:
    """What the job page's polled header shows (``page``: and the rows only the whole page
    shows), its rows as ``jobs.page_versions.JOB_PAGE_SHOWS`` declares them: a fixed number
    of queries, whatever the job's points, checkpoints or cluster size (the placement
    verdict is worked out once per allocation, ``jobs.placement.job_placement``)."""
    shown = job_page_rows(job=job, page=page)
    checkpoints = shown.of("checkpoints")
    placement = job_placement(job)
    return {
        "job": job,
        "shown": shown,
        "throughput": job.throughput_now,
        "events": shown.of("events"),
        "checkpoints": checkpoints,
        # Job.newest_proven_checkpoint, from the checkpoints read anyway (newest first).
        "newest_proven": next((c for c in checkpoints if c.last_proven_at is not None), None),
        "can_act": can_act(request.user, owner_id=job.owner_id),
        "switches": placement.switches,
        "placement_check": placement.check,
        # Why a pending job waits, when Slurm expects it to start, its place in the queue.
        "pending": job_pending_summary(job=job),
        "can_submit": is_researcher(request.user),
    }


def _job_state(context: dict[str, Any]) -> list[Any]:
    """What the job's header shows (its row, its timeline and checkpoints, as
    ``_job_live_context`` read them), for ETags and cache keys: what
    ``jobs.page_versions`` digests in the database."""
    return job_page_state(context["shown"])


def _header_etag(
    request: HttpRequest, rows: object, placement: JobPlacement, owner_id: int, *parts: object
) -> str:
    """The ETag of the polled header: ``rows`` (what it shows of the job, its timeline and
    checkpoints, or their digest), the placement verdict, the viewer's rights, the session's
    CSRF secret (its forms carry tokens), the minute (it says "proven 3 minutes ago") and
    ``parts``."""
    check = placement.check
    return etag_for(
        rows,
        check.summary if check else None,
        check.flagged if check else None,
        placement.switches,
        can_act(request.user, owner_id=owner_id),
        is_researcher(request.user),
        request.META.get("CSRF_COOKIE"),
        this_minute(),
        *parts,
    )


def _job_live_etag(request: HttpRequest, context: dict[str, Any]) -> str:
    """The header's ETag from what it was rendered from (the pending summary included)."""
    placement = JobPlacement(check=context["placement_check"], switches=context["switches"])
    rows = (_job_state(context), context["pending"])
    return _header_etag(request, rows, placement, context["job"].owner_id)


def _job_version_etag(
    request: HttpRequest, version: JobVersion | None, *parts: object
) -> str | None:
    """The header's ETag from its version (``jobs.page_versions``: a digest the database
    computes of the rows it shows), without reading them. None where the version does not
    tell: no version (SQLite), a pending job (its place in the queue depends on other jobs),
    a placement not worked out yet."""
    if version is None or version.state == Job.State.PENDING:
        return None
    placement = job_placement_known(
        job_id=version.job_id,
        allocated_nodes=version.allocated_nodes,
        nodelist_requested=version.nodelist_requested,
        switches_requested=version.switches_requested,
    )
    if placement is None:
        return None
    return _header_etag(request, ("version", version.digest), placement, version.owner_id, *parts)


# The job page's goodput ledger and work at risk are reused while the job, its timeline,
# checkpoints and resumed jobs stay as they were, for at most this long (a running job's
# figures grow with the clock): the page says when they were worked out.
JOB_FIGURES_SECONDS = 60


def _job_figures(job: Job, context: dict[str, Any], children: list[Job]) -> dict[str, Any]:
    """``job_goodput`` (as the page shows it) and ``job_work_at_risk`` of the job, from
    ``core.cache`` under a key of what they are computed from and the minute."""
    version = etag_for(
        _job_state(context),
        [(child.id, child.state, child.metrics_offset, child.ended_at) for child in children],
    )

    def figures() -> dict[str, Any]:
        shown = {
            "goodput": _goodput_display(job_goodput(job=job)),
            "work_at_risk": job_work_at_risk(job=job),
            "figures_at": timezone.now(),
            "figures_seconds": JOB_FIGURES_SECONDS,
        }
        # The section as every viewer sees it (nothing in it depends on who asks), rendered
        # with the figures: a full view renders it again only when they change.
        return {**shown, "goodput_html": render_to_string("jobs/_goodput.html", shown)}

    found = cache.get_or_set(
        cache.JOB_FIGURES,
        cache.key_job_figures(job_id=job.id, version=version, minute=this_minute()),
        figures,
    )
    # Rendered by this module's own template (autoescaped), kept in core.cache.
    return {**found, "goodput_html": mark_safe(found["goodput_html"])}  # noqa: S308


def _health_notices(job: Job, events: list[Any]) -> list[HealthNotice]:
    """Nodes of the job's allocation that turned unhealthy while it ran: from its first
    running event to its end (or now)."""
    start = next((event.at for event in events if event.to_state == Job.State.RUNNING), None)
    return job_health_notices(
        cluster_id=job.cluster_id,
        node_names=job.allocated_node_names,
        start=start,
        end=job.ended_at or timezone.now(),
    )


def _job_page_context(request: HttpRequest, job: Job) -> dict[str, Any]:
    """The whole job page: the live header and what only the full page shows."""
    context = _job_live_context(request, job, page=True)
    children = context["shown"].of("children")
    context.update(
        children=children,
        acceptance_json=(
            json.dumps(job.acceptance, indent=2, sort_keys=True) if job.acceptance else ""
        ),
        config_json=json.dumps(job.config, indent=2, sort_keys=True),
        script=job_script(job),
        health_notices=_health_notices(job, context["events"]),
        stack_changes=stack_changes(job),
        **_job_figures(job, context, children),
    )
    return context


# Bucket colours and names on the job page's goodput bar, in bar order.
_GOODPUT_BUCKETS = (
    ("productive", "productive", "#15803d"),
    ("data_wait", "data wait", "#0e7490"),
    ("checkpoint_blocking", "checkpoint blocking", "#2563eb"),
    ("restore", "restore", "#7c3aed"),
    ("startup", "startup", "#a3a3a3"),
    ("queued", "queued", "#d4d4d8"),
    ("idle", "idle between jobs", "#fcd34d"),
    ("recovery", "recovery (incident → resumed)", "#f97316"),
    ("lost_progress", "lost progress (redone)", "#b91c1c"),
    ("other", "other", "#e5e7eb"),
)


def _goodput_display(ledger: dict[str, Any]) -> dict[str, Any]:
    """The goodput ledger as the page shows it: bar segments with widths in %, and the
    checkpoint-interval advice in words."""
    wall = ledger["wall_s"]
    rows = []
    for name, label, colour in _GOODPUT_BUCKETS:
        seconds = ledger["buckets"][name]
        rows.append(
            {
                "name": name,
                "label": label,
                "colour": colour,
                "seconds": seconds,
                "duration": format_duration(seconds),
                "job_seconds": ledger["job"]["buckets"][name],
                "percent": 100 * seconds / wall if wall > 0 else 0.0,
            }
        )
    advice = ledger["advice"]
    inputs = advice["inputs"]
    return {
        **ledger,
        "rows": rows,
        "wall": format_duration(wall),
        "percent": None if ledger["ratio"] is None else 100 * ledger["ratio"],
        "lineage_size": len(ledger["lineage"]),
        "current_interval": format_duration(advice["current_interval_s"]),
        "optimal_interval": format_duration(advice["optimal_interval_s"]),
        "expected_now": _percent(advice["expected_ratio_now"]),
        "expected_optimal": _percent(advice["expected_ratio_optimal"]),
        "checkpoint_cost": format_duration(inputs["checkpoint_cost_s"]),
        "mtti": format_duration(inputs["mtti_s"]),
        "restore": format_duration(inputs["restore_s"]),
    }


def _percent(ratio: float | None) -> str:
    return "—" if ratio is None else f"{100 * ratio:.1f}%"


@login_required
def job_detail_page(request: HttpRequest, job_id: uuid.UUID) -> HttpResponseBase:
    # A revalidation is answered from the page's version where there is one (PostgreSQL);
    # the figures and the script are current to the minute, which its ETag names.
    version = job_version(user=request_user(request), job_id=job_id, page=True)
    etag = _job_version_etag(request, version, "page", static_release())
    unchanged = None if etag is None else not_modified(request, etag)
    if unchanged is not None:
        return unchanged
    job = job_get_for_user(user=request_user(request), job_id=job_id)
    context = _job_page_context(request, job)
    if etag is None:
        # The header's ETag and what only the whole page shows (the rows it declares:
        # names, resumed jobs; figures; script).
        etag = etag_for(
            _job_live_etag(request, context),
            job_page_state(context["shown"], page=True),
            context["figures_at"],
            context["script"],
            [(n.node, n.state, n.at) for n in context["health_notices"]],
            context["stack_changes"],
            static_release(),
        )
        unchanged = not_modified(request, etag)
        if unchanged is not None:
            return unchanged
    return revalidate(render(request, "jobs/job_detail.html", context), etag)


@login_required
def job_status_partial(request: HttpRequest, job_id: uuid.UUID) -> HttpResponseBase:
    """The live header of the job page, polled while the tab is visible: rendered only
    when it changed since the poller's copy (304 otherwise, see ``core.conditional``),
    which one narrow query tells where the database digests the header's rows."""
    etag = _job_version_etag(request, job_version(user=request_user(request), job_id=job_id))
    unchanged = None if etag is None else not_modified(request, etag)
    if unchanged is not None:
        return unchanged
    job = job_get_for_user(user=request_user(request), job_id=job_id)
    context = _job_live_context(request, job)
    if etag is None:
        etag = _job_live_etag(request, context)
        unchanged = not_modified(request, etag)
        if unchanged is not None:
            return unchanged
    return revalidate(render(request, "jobs/_job_status.html", context), etag)


@login_required
@require_POST
def job_cancel_action(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    job = job_get_for_user(user=request_user(request), job_id=job_id)
    try:
        outcome = job_cancel(actor=request_user(request), job=job)
        messages.success(request, f"{job.name}: {outcome}.")
    except ApplicationError as error:
        messages.error(request, error.message)
    return HttpResponseRedirect(reverse("job-detail", args=[job.id]))


@login_required
@require_POST
def job_resume_action(request: HttpRequest, job_id: uuid.UUID, checkpoint_id: int) -> HttpResponse:
    job = job_get_for_user(user=request_user(request), job_id=job_id)
    checkpoint = Checkpoint.objects.filter(job=job, pk=checkpoint_id).first()
    if checkpoint is None:
        messages.error(request, "No such checkpoint.")
        return HttpResponseRedirect(reverse("job-detail", args=[job.id]))
    try:
        new_job = job_resume(actor=request_user(request), checkpoint=checkpoint)
    except ApplicationError as error:
        messages.error(request, error.message)
        return HttpResponseRedirect(reverse("job-detail", args=[job.id]))
    messages.success(request, f"Resuming from step {checkpoint.step} as a new job.")
    return HttpResponseRedirect(reverse("job-detail", args=[new_job.id]))
