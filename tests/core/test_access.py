"""The one rule for acting on owned objects (``core.access.can_act``), and that every
service uses it: the same answer for jobs, their checkpoints and drills, page and API."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser, Group
from django.core.exceptions import PermissionDenied
from django.test import RequestFactory
from rest_framework.request import Request
from rest_framework.test import APIClient

from core.access import can_act, request_user, require_can_act
from factories import CheckpointFactory, JobFactory, UserFactory

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("controlplane", "core", "nodes", "jobs", "drills", "watcher", "studies")


def test_operator_acts_on_everything_researcher_on_their_own(
    operator: Any, researcher: Any, other_researcher: Any, outsider: Any
) -> None:
    job = JobFactory(owner=researcher)
    assert can_act(operator, owner_id=job.owner_id)
    assert can_act(researcher, owner_id=job.owner_id)
    assert not can_act(other_researcher, owner_id=job.owner_id)
    assert not can_act(outsider, owner_id=job.owner_id)
    assert not can_act(researcher, owner_id=None)


def test_an_owner_who_lost_the_researcher_role_may_no_longer_act() -> None:
    owner = UserFactory(username="former", role="researchers")
    job = JobFactory(owner=owner)
    owner.groups.remove(Group.objects.get(name="researchers"))
    owner = type(owner).objects.get(pk=owner.pk)  # drop the cached role
    assert not can_act(owner, owner_id=job.owner_id)
    with pytest.raises(Exception, match="Only the owner or an operator may cancel"):
        require_can_act(owner, owner_id=job.owner_id, what="cancel this job")


@pytest.mark.parametrize("who", ["other_researcher", "outsider"])
def test_not_the_owner_cannot_cancel_resume_verify_or_drill(
    who: str, researcher: Any, request: Any
) -> None:
    """Through the API each refusal looks the same (a job they may not see is 404)."""
    checkpoint = CheckpointFactory(job=JobFactory(owner=researcher))
    client = APIClient()
    client.force_authenticate(user=request.getfixturevalue(who))
    job_id = checkpoint.job_id
    for path, body in [
        (f"/api/v1/jobs/{job_id}/cancel/", {}),
        (f"/api/v1/jobs/{job_id}/resume/", {"checkpoint_step": checkpoint.step}),
        (f"/api/v1/checkpoints/{checkpoint.pk}/verify/", {}),
        (f"/api/v1/checkpoints/{checkpoint.pk}/drills/", {"steps": 1}),
    ]:
        response = client.post(path, body, format="json")
        assert response.status_code in (403, 404), (path, response.status_code)
        assert set(response.json()) == {"message", "extra"}


def test_no_product_module_writes_the_owner_rule_by_hand() -> None:
    """``owner_id == user.pk`` appears only in core.access: one rule, one place."""
    offenders = []
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts or path.name == "access.py":
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Compare):
                    text = ast.unparse(node)
                    if "owner_id" in text and ("pk" in text or ".id" in text):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {text}")
    assert not offenders, offenders


def test_request_user_refuses_someone_not_signed_in(researcher: Any) -> None:
    """Views hand services ``request_user(request)``: the signed-in user, never an
    AnonymousUser, on a page's request and an API view's alike."""
    page = RequestFactory().get("/")
    page.user = AnonymousUser()
    api = Request(RequestFactory().get("/"))  # no credentials: DRF's anonymous user
    for request in (page, api):
        with pytest.raises(PermissionDenied, match="Sign in first"):
            request_user(request)
    page.user = researcher
    api.user = researcher
    assert request_user(page) == researcher
    assert request_user(api) == researcher
