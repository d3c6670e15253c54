from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from core.roles import role_name


def gantry(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    return {"gantry_role": role_name(user) if user is not None else "none"}
