"""The user types services and selectors take, defined once so mypy catches a wrong actor.

Gantry keeps Django's own user model (no ``AUTH_USER_MODEL``), so ``User`` is
``django.contrib.auth.models.User``. Pages and API views turn ``request.user`` into a
``User`` with ``core.access.request_user``.
"""

from __future__ import annotations

from typing import TypeAlias

from django.contrib.auth.models import AnonymousUser, User

# Who acts in a service that Gantry itself may also run (the command line, recovery,
# registration): ``None`` is Gantry, recorded in the audit log as "system".
Actor: TypeAlias = User | None

# What ``request.user`` can be before anyone checked it: for the role checks, which answer
# False for someone not signed in.
MaybeUser: TypeAlias = User | AnonymousUser

__all__ = ["Actor", "AnonymousUser", "MaybeUser", "User"]
