"""The job list API: one page of the jobs a person may see, newest first, answered from
the cache framework while its rows are the same (the page is checked against the database
on every request: one narrow query)."""

from __future__ import annotations

import json
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from core import cache
from core.access import request_user
from core.api import CursorPagination, json_page_response
from core.conditional import etag_for, not_modified, revalidate
from core.permissions import IsResearcherOrOperator
from jobs.api.jobs import JobSerializer
from jobs.models import Job
from jobs.selectors import job_list, job_list_versions


class JobPagination(CursorPagination):
    ordering = "-created_at"


class JobListApi(generics.ListAPIView):
    """Jobs you may see (operators: all), newest first; filter by state, owner, cluster."""

    permission_classes = [IsResearcherOrOperator]
    serializer_class = JobSerializer
    pagination_class = JobPagination
    filter_backends: list[Any] = []

    @extend_schema(
        parameters=[
            OpenApiParameter("state", str, enum=[value for value, _ in Job.State.choices]),
            OpenApiParameter("owner", str),
            OpenApiParameter("cluster", str),
            OpenApiParameter("search", str),
        ]
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """One page, serialized and rendered only when it changed: the page is first read
        as row versions (``job_list_versions``), which give its ETag (a 304 answers a
        client that has it) and the key of its rendered rows in the cache framework; only
        a page not seen before reads, serializes and renders its jobs."""
        jobs = self.get_queryset()
        page = self.paginate_queryset(job_list_versions(jobs))
        paginator = self.paginator
        assert page is not None and isinstance(paginator, JobPagination)
        next_link, previous_link = paginator.get_next_link(), paginator.get_previous_link()
        etag = etag_for(
            request.get_full_path(), [tuple(row.values()) for row in page], next_link, previous_link
        )
        unchanged = not_modified(request, etag)
        if unchanged is not None:
            return unchanged  # type: ignore[return-value]

        # The rendered rows, under the key of the row versions they show (nothing to
        # invalidate; the query string is not in it, so no junk parameter adds an entry).
        def render_rows() -> bytes:
            ids = [row["id"] for row in page]
            found = {job.id: job for job in jobs.filter(id__in=ids)}
            rows = self.get_serializer([found[i] for i in ids if i in found], many=True).data
            return JSONRenderer().render(rows)

        rendered = cache.get_or_set(
            cache.JOB_LIST_ROWS,
            cache.key_job_list_rows(rows=[tuple(row.values()) for row in page]),
            render_rows,
        )
        if isinstance(request.accepted_renderer, JSONRenderer):
            response = json_page_response(
                next_link=next_link, previous_link=previous_link, results=rendered
            )
        else:
            # The browsable API renders the page itself.
            response = self.get_paginated_response(json.loads(rendered))
        revalidate(response, etag)
        return response  # type: ignore[return-value]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        params = self.request.query_params
        return job_list(
            user=request_user(self.request),
            state=params.get("state"),
            owner=params.get("owner"),
            cluster=params.get("cluster"),
            search=params.get("search"),
        )
