"""Hand-made bad requests everywhere under /api/: the one error shape, never a traceback.

Schemathesis only sends what the schema describes; these are the requests it does not
make: unknown paths, wrong methods, wrong content types, malformed JSON, and calls that
act on a cluster that does not answer.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from security_support import error_shape_problem


def _check(response: Any, status: int, figures: Any) -> dict[str, Any]:
    figures.add("api_errors.requests")
    content_type = response.headers.get("Content-Type", "")
    problem = error_shape_problem(response.status_code, content_type, response.content)
    if problem or response.status_code != status:
        figures.add("api_errors.violations")
    assert response.status_code == status, response.content[:300]
    assert problem is None, problem
    assert b"Traceback" not in response.content
    return json.loads(response.content)


def _token_client(token: str | None) -> Client:
    client = Client()
    if token:
        client.defaults["HTTP_AUTHORIZATION"] = f"Token {token}"
    return client


@pytest.mark.parametrize(
    "path",
    [
        "/api/",
        "/api/v1/",
        "/api/v1/nope/",
        "/api/v1/jobs/not-a-uuid/",
        "/api/v1/nodes/99999999/",
        "/api/v1/jobs/00000000-0000-0000-0000-000000000000/",
        "/api/v1/checkpoints/99999999/",
        "/api/v1/drills/00000000-0000-0000-0000-000000000000/",
        "/api/v1/clusters/99999999/drill-policy/",
        "/api/v1/jobs",  # no trailing slash: APPEND_SLASH must not answer an HTML 301/500
    ],
)
def test_not_found_is_json_everywhere(
    path: str, world: Any, persona_tokens: dict[str, str | None], security_figures: Any
) -> None:
    client = _token_client(persona_tokens["operator"])
    response = client.get(path)
    if response.status_code == 301:
        # APPEND_SLASH redirecting a GET is fine; the target must be the JSON API.
        security_figures.add("api_errors.requests")
        assert response.headers["Location"].endswith("/")
        return
    body = _check(response, 404, security_figures)
    assert "Traceback" not in body["message"]


def test_post_without_trailing_slash_is_json(
    world: Any, persona_tokens: dict[str, str | None], security_figures: Any
) -> None:
    """Django's APPEND_SLASH raises a RuntimeError page (500 in DEBUG) for a POST; the API
    must answer in its shape instead."""
    client = _token_client(persona_tokens["operator"])
    response = client.post("/api/v1/jobs/submit", data="{}", content_type="application/json")
    assert response.status_code in {404, 405, 301, 308}
    if response.status_code >= 400:
        _check(response, response.status_code, security_figures)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("delete", "/api/v1/me/"),
        ("put", "/api/v1/jobs/"),
        ("get", "/api/v1/jobs/submit/"),
        ("patch", "/api/v1/clusters/"),
        ("delete", "/api/v1/nodes/{node}/"),
        ("get", "/api/v1/nodes/{node}/drain/"),
    ],
)
def test_wrong_method_is_405_in_shape(
    method: str,
    path: str,
    world: Any,
    persona_tokens: dict[str, str | None],
    security_figures: Any,
) -> None:
    client = _token_client(persona_tokens["operator"])
    response = getattr(client, method)(path.format(node=world["node"].pk))
    _check(response, 405, security_figures)


@pytest.mark.parametrize("role", ["operator", "researcher"])
def test_unsupported_media_type_and_malformed_json(
    role: str, world: Any, persona_tokens: dict[str, str | None], security_figures: Any
) -> None:
    client = _token_client(persona_tokens[role])
    _check(
        client.post("/api/v1/jobs/submit/", data="name=x", content_type="text/plain"),
        415,
        security_figures,
    )
    _check(
        client.post("/api/v1/jobs/submit/", data="{not json", content_type="application/json"),
        400,
        security_figures,
    )
    _check(
        client.post("/api/v1/jobs/preview/", data="[1, 2]", content_type="application/json"),
        400,
        security_figures,
    )
    _check(
        client.post(
            "/api/v1/jobs/submit/",
            data=json.dumps({"name": "x", "config": "not an object"}),
            content_type="application/json",
        ),
        400,
        security_figures,
    )
    _check(
        client.post(
            "/api/v1/jobs/submit/",
            data=b"\xff\xfe\x00garbage",
            content_type="application/json",
        ),
        400,
        security_figures,
    )


def test_bad_and_missing_credentials(world: Any, security_figures: Any) -> None:
    body = _check(_token_client("0" * 40).get("/api/v1/jobs/"), 401, security_figures)
    assert "token" in body["message"].lower()
    _check(Client().get("/api/v1/jobs/"), 401, security_figures)
    malformed = Client(HTTP_AUTHORIZATION="Token a b c")
    _check(malformed.get("/api/v1/jobs/"), 401, security_figures)


@pytest.mark.parametrize(
    ("method", "path", "payload"),
    [
        ("post", "/api/v1/clusters/{cluster}/probe/", None),
        ("post", "/api/v1/nodes/{node}/drain/", {"reason": "maintenance"}),
        ("post", "/api/v1/nodes/{node}/resume/", None),
        # (The job's log tail is no longer here: it is read by a worker, never in the
        # request; tests/jobs/test_log_tail.py.)
    ],
)
def test_unreachable_cluster_is_502_or_503_in_shape(
    method: str,
    path: str,
    payload: Any,
    world: Any,
    persona_tokens: dict[str, str | None],
    security_figures: Any,
) -> None:
    """The cluster's login host refuses connections: the caller hears which cluster and
    why, in the error shape, fast; never a stack trace."""
    client = _token_client(persona_tokens["operator"])
    url = path.format(cluster=world["cluster"].pk, node=world["node"].pk, job=world["job"].pk)
    kwargs: dict[str, Any] = {}
    if payload is not None:
        kwargs = {"data": json.dumps(payload), "content_type": "application/json"}
    response = getattr(client, method)(url, **kwargs)
    assert response.status_code in {502, 503}, response.content[:300]
    body = _check(response, response.status_code, security_figures)
    assert body["message"]
