from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission

from core.roles import is_operator, is_researcher


class IsOperator(BasePermission):
    message = "Only operators may do this."

    def has_permission(self, request: Any, view: Any) -> bool:
        return is_operator(request.user)


class IsResearcherOrOperator(BasePermission):
    message = "You need the researcher or operator role; ask an operator to add you to one."

    def has_permission(self, request: Any, view: Any) -> bool:
        return is_researcher(request.user)


class ReadByRolesWriteByOperators(BasePermission):
    """Anyone with a role reads (GET); only operators change (cluster policies)."""

    def has_permission(self, request: Any, view: Any) -> bool:
        if request.method == "GET":
            self.message = IsResearcherOrOperator.message
            return is_researcher(request.user)
        self.message = IsOperator.message
        return is_operator(request.user)
