from __future__ import annotations

import functools
from typing import Any

from django.http import HttpRequest
from django.urls import get_script_prefix, reverse

from core.roles import role_name

# The pages every page's header links to (templates/base.html), by URL name.
_HEADER_LINKS = (
    "overview",
    "node-list",
    "topology",
    "job-list",
    "drill-list",
    "recovery",
    "acceptance-list",
    "study-list",
    "admin:index",
    "api-token-list",
    "notification-subscription-list",
    "api-docs",
    "logout",
)


@functools.cache
def _header_links(prefix: str) -> dict[str, str]:
    """The header's links under the script prefix ``prefix``, reversed once per process (a
    dozen reversals on every page view otherwise); ``admin:index`` is ``admin_index``."""
    return {name.replace(":", "_").replace("-", "_"): reverse(name) for name in _HEADER_LINKS}


def gantry(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    return {
        "gantry_role": role_name(user) if user is not None else "none",
        "header_links": _header_links(get_script_prefix()),
    }
