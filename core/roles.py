"""The two roles. A researcher acts on their own jobs; an operator on everything."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.types import MaybeUser, User

RESEARCHERS = "researchers"
OPERATORS = "operators"
# Where a request's user keeps its roles once read (``remember_roles``, the checks below).
_OPERATOR_CACHE = "_gantry_is_operator"
_RESEARCHER_CACHE = "_gantry_is_researcher"


def role_annotations(user_ref: str) -> dict[str, Any]:
    """Annotations that read whether the user named by ``user_ref`` (a field of the
    queryset's model: ``"pk"`` on users, ``"user_id"`` on tokens) is in each role's group,
    as subqueries of the query that loads the user: the role checks below then cost no
    query of their own (``remember_roles``)."""
    from django.contrib.auth.models import Group
    from django.db.models import Exists, OuterRef

    return {
        f"gantry_in_{name}": Exists(Group.objects.filter(user=OuterRef(user_ref), name=name))
        for name in (OPERATORS, RESEARCHERS)
    }


def remember_roles(user: User, source: Any) -> User:
    """``user`` with the role memberships read by ``role_annotations`` on ``source`` (the
    user itself or the row it came with), as ``is_operator`` and ``is_researcher`` keep
    them. Read once per request: a role change applies from the next request."""
    setattr(user, _OPERATOR_CACHE, bool(getattr(source, f"gantry_in_{OPERATORS}")))
    setattr(user, _RESEARCHER_CACHE, bool(getattr(source, f"gantry_in_{RESEARCHERS}")))
    return user


def stand_in(*, operator: bool, pk: int | None = None) -> User:
    """An unsaved user ``pk`` taken to be an operator, or else a researcher, without reading
    any role: what a read is compiled or computed for on behalf of anyone with that role
    (``core.prepared``, a worker's overview table), never someone who asks."""
    from django.contrib.auth import get_user_model

    user: User = get_user_model()(pk=pk)
    setattr(user, _OPERATOR_CACHE, operator)
    setattr(user, _RESEARCHER_CACHE, not operator)
    return user


def is_operator(user: MaybeUser | None) -> bool:
    """Whether ``user`` is an operator; False for someone not signed in."""
    if user is None or not user.is_authenticated:
        return False
    if user.is_superuser:
        return True
    cached = getattr(user, _OPERATOR_CACHE, None)
    if cached is None:
        cached = user.groups.filter(name=OPERATORS).exists()
        setattr(user, _OPERATOR_CACHE, cached)
    return bool(cached)


def is_researcher(user: MaybeUser | None) -> bool:
    """Whether ``user`` has the researcher role (operators have it too); False for someone
    not signed in."""
    if user is None or not user.is_authenticated:
        return False
    if is_operator(user):
        return True
    cached = getattr(user, _RESEARCHER_CACHE, None)
    if cached is None:
        cached = user.groups.filter(name=RESEARCHERS).exists()
        setattr(user, _RESEARCHER_CACHE, cached)
    return bool(cached)


def role_name(user: MaybeUser | None) -> str:
    if is_operator(user):
        return "operator"
    if is_researcher(user):
        return "researcher"
    return "none"


# The same grants as migration controlplane/0002_roles (whose drill grants moved to the
# drills app with drills 0001, and the audit log to core with core 0001); used to repair
# the groups after a database flush (transactional tests) and by `manage.py gantry_user`.
RESEARCHER_PERMISSIONS = (
    "nodes.view_cluster",
    "nodes.view_partition",
    "nodes.view_node",
    "nodes.view_gpu",
    "nodes.view_switch",
    "nodes.view_link",
    "nodes.view_nodeevent",
    "jobs.add_job",
    "jobs.view_job",
    "jobs.change_job",
    "jobs.view_jobevent",
    "jobs.view_metricpoint",
    "jobs.view_checkpoint",
    "drills.add_restoredrill",
    "drills.view_restoredrill",
    "drills.change_restoredrill",
)


def roles_sync() -> None:
    """Create the two groups with their permissions if they are missing."""
    from django.contrib.auth.models import Group, Permission

    def permission(dotted: str) -> Permission:
        app_label, codename = dotted.split(".")
        return Permission.objects.get(content_type__app_label=app_label, codename=codename)

    researchers, _ = Group.objects.get_or_create(name=RESEARCHERS)
    researchers.permissions.set([permission(p) for p in RESEARCHER_PERMISSIONS])
    operators, _ = Group.objects.get_or_create(name=OPERATORS)
    grants = list(
        Permission.objects.filter(content_type__app_label__in=["nodes", "jobs", "drills"])
    )
    grants += [
        permission("core.view_auditevent"),
        permission("core.view_apitoken"),
    ]
    # The delivery log of notifications (notifications 0002 grants the same).
    grants += list(
        Permission.objects.filter(
            content_type__app_label="notifications",
            codename__in=[
                "view_subscription",
                "view_event",
                "view_delivery",
                "view_deliveryattempt",
            ],
        )
    )
    # Each cluster's health source in the admin (health 0002 grants the same).
    grants += list(
        Permission.objects.filter(
            content_type__app_label="health",
            codename__in=["add_healthsource", "change_healthsource", "view_healthsource"],
        )
    )
    operators.permissions.set(grants)
