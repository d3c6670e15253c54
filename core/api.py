"""Small pieces every API view shares."""

from __future__ import annotations

from django.http import HttpResponse
from rest_framework import pagination
from rest_framework.renderers import JSONRenderer


class CursorPagination(pagination.CursorPagination):
    """The default for lists that grow: stable under inserts, constant cost per page."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
    ordering = "-pk"


def json_page_response(
    *, next_link: str | None, previous_link: str | None, results: bytes
) -> HttpResponse:
    """A cursor page as DRF's JSON renderer writes ``CursorPagination``'s answer
    (``{"next": ..., "previous": ..., "results": [...]}``), with the results already
    rendered: a page kept rendered in the cache is sent without being decoded and encoded
    again on every request."""
    renderer = JSONRenderer()
    links = renderer.render({"next": next_link, "previous": previous_link})
    body = links[:-1] + b',"results":' + results + b"}"
    return HttpResponse(body, content_type=renderer.media_type)
