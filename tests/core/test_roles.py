from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.http import Http404

from core.roles import is_operator, is_researcher, role_name
from factories import JobFactory
from jobs.models import Job
from jobs.selectors import job_get_for_user, job_list_for_user

pytestmark = pytest.mark.django_db


def test_roles_exist_with_their_model_permissions(
    operator: Any, researcher: Any, outsider: Any
) -> None:
    # Researchers may submit and act on jobs, and see the inventory...
    assert researcher.has_perm("jobs.add_job")
    assert researcher.has_perm("drills.add_restoredrill")
    assert researcher.has_perm("nodes.view_node")
    # ...but may not change the inventory or read the audit log.
    assert not researcher.has_perm("nodes.change_node")
    assert not researcher.has_perm("nodes.add_cluster")
    assert not researcher.has_perm("core.view_auditevent")
    # Operators may do all of that, and read (never edit) the audit log.
    assert operator.has_perm("nodes.change_node")
    assert operator.has_perm("nodes.add_cluster")
    assert operator.has_perm("jobs.change_job")
    assert operator.has_perm("core.view_auditevent")
    assert not operator.has_perm("core.change_auditevent")
    assert not operator.has_perm("core.delete_auditevent")
    # Someone in no role gets nothing.
    assert not outsider.has_perm("jobs.add_job")
    assert not outsider.has_perm("nodes.view_node")


def test_role_helpers(operator: Any, researcher: Any, outsider: Any) -> None:
    assert (is_operator(operator), is_researcher(operator), role_name(operator)) == (
        True,
        True,
        "operator",
    )
    assert (is_operator(researcher), is_researcher(researcher), role_name(researcher)) == (
        False,
        True,
        "researcher",
    )
    assert (is_operator(outsider), is_researcher(outsider), role_name(outsider)) == (
        False,
        False,
        "none",
    )


def test_researcher_sees_only_their_own_jobs_operator_sees_all(
    operator: Any, researcher: Any, other_researcher: Any, outsider: Any
) -> None:
    mine = JobFactory(owner=researcher)
    theirs = JobFactory(owner=other_researcher)

    assert set(job_list_for_user(user=researcher)) == {mine}
    assert set(job_list_for_user(user=other_researcher)) == {theirs}
    assert set(job_list_for_user(user=operator)) == {mine, theirs}
    assert set(job_list_for_user(user=outsider)) == set()

    assert job_get_for_user(user=researcher, job_id=mine.id) == mine
    assert job_get_for_user(user=operator, job_id=theirs.id) == theirs
    # Someone else's job looks exactly like a missing one.
    with pytest.raises(Http404):
        job_get_for_user(user=researcher, job_id=theirs.id)
    with pytest.raises(Http404):
        job_get_for_user(user=researcher, job_id="not-a-uuid")
    # Nobody signed in sees no job; the answer reads the same for each role's compiled read.
    with pytest.raises(Http404):
        job_get_for_user(user=AnonymousUser(), job_id=mine.id)
    for user, job in ((researcher, mine), (operator, theirs), (operator, mine)):
        got = job_get_for_user(user=user, job_id=str(job.id))
        assert (got.owner, got.cluster) == (job.owner, job.cluster)
        assert [getattr(got, f.attname) for f in Job._meta.concrete_fields] == [
            getattr(job, f.attname) for f in Job._meta.concrete_fields
        ]


def test_migration_grants_match_roles_sync() -> None:
    from django.contrib.auth.models import Group

    from core.roles import RESEARCHER_PERMISSIONS, roles_sync

    def grants(name: str) -> set[str]:
        group = Group.objects.get(name=name)
        return {
            f"{p.content_type.app_label}.{p.codename}"
            for p in group.permissions.select_related("content_type")
        }

    from_migration = (grants("researchers"), grants("operators"))
    assert from_migration[0] == set(RESEARCHER_PERMISSIONS)
    roles_sync()
    assert (grants("researchers"), grants("operators")) == from_migration
