"""Who may do what: pages need a role, and acting on an owned object needs ``can_act``.

Pages need a role, the same as the API: an outsider (signed in, in no group) sees none.

The API checks roles per view (``IsResearcherOrOperator``); pages used to check only that
someone is signed in, so an outsider saw the inventory and the fleet's drill health that
the API refuses them. Deny by default here, so a new page cannot forget the check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from core.roles import is_operator, is_researcher

if TYPE_CHECKING:
    from rest_framework.request import Request

    from core.types import MaybeUser, User

NO_ROLE_MESSAGE = "You need the researcher or operator role; ask an operator to add you to one."
# The admin checks is_staff itself, the API checks roles per view, and the login and
# logout pages are what someone without a role still needs.
_EXEMPT_PREFIXES = ("/admin/", "/api/", "/static/", "/accounts/")


NOT_SIGNED_IN_MESSAGE = "Sign in first."


def request_user(request: HttpRequest | Request) -> User:
    """The signed-in user of a page's or API view's ``request``, as the ``User`` that
    services and selectors take; PermissionDenied for someone not signed in.

    Pages are behind ``login_required`` and API views behind a role permission, so for
    them this never refuses: it turns ``request.user`` (``User | AnonymousUser``) into a
    ``User`` without a cast, and fails closed should a view ever lose its guard."""
    user = request.user
    if not user.is_authenticated:
        raise PermissionDenied(NOT_SIGNED_IN_MESSAGE)
    return user


class RoleRequiredMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view: Any, args: Any, kwargs: Any
    ) -> HttpResponse | None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated or request.path.startswith(_EXEMPT_PREFIXES):
            # Anonymous callers get the views' own login redirect.
            return None
        if not is_researcher(user):
            raise PermissionDenied(NO_ROLE_MESSAGE)
        return None


def can_act(user: MaybeUser, *, owner_id: Any) -> bool:
    """The one rule for acting on an object that has an owner (a job, its checkpoints and
    drills, a study): an operator may act on everything, a researcher on what they own.

    Used by every page, API view and service; seeing an object is a selector's business
    (``job_get_for_user`` and friends), acting on it is this.
    """
    if is_operator(user):
        return True
    return owner_id is not None and getattr(user, "pk", None) == owner_id and is_researcher(user)


def is_own(user: MaybeUser, *, owner_id: Any) -> bool:
    """The object is ``user``'s own (whatever their role): for what differs between one's
    own objects and someone else's that one may use (a shared template's environment must
    be confirmed), not for who may act (``can_act``)."""
    return owner_id is not None and getattr(user, "pk", None) == owner_id


def require_can_act(user: MaybeUser, *, owner_id: Any, what: str) -> None:
    """``can_act`` or PermissionDenied naming what was refused."""
    if not can_act(user, owner_id=owner_id):
        raise PermissionDenied(f"Only the owner or an operator may {what}.")
