"""Small pieces every API view shares."""

from __future__ import annotations

from rest_framework import pagination


class CursorPagination(pagination.CursorPagination):
    """The default for lists that grow: stable under inserts, constant cost per page."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
    ordering = "-pk"
