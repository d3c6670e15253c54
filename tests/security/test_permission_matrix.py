"""Who may do what: every URL pattern × every persona, and no data leaks.

The routes come from ``controlplane.urls`` itself, so a new endpoint without a row in
``EXPECTED`` fails ``test_every_route_has_a_row``. Personas: operator, researcher on their
own objects, researcher on another researcher's objects, outsider (signed in, no role),
anonymous. Kinds of answer:

- ``ok``: allowed (2xx, a redirect back into the app, 400 for an empty form, or 502/503
  from the cluster that does not listen);
- ``deny``: 403; ``hide``: 404, the same body as for an id that does not exist;
- ``login``: a page redirects to the login page; ``auth``: the API answers 401.

The ``studies`` app (pages and API) is skipped while another engineer writes it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

SKIPPED_PREFIXES = ("studies/", "api/v1/studies/")
NAMESPACED_SKIPS = {"admin"}

OK, DENY, HIDE, LOGIN, AUTH = "ok", "deny", "hide", "login", "auth"
PERSONAS = ("operator", "researcher", "researcher_on_other", "outsider", "anonymous")

# name: (method, owned, payload, {persona: kind}); "owned" routes take the researcher's
# own job/checkpoint/drill ids, and the other researcher's for "researcher_on_other".
INVENTORY_PAGE = {"operator": OK, "researcher": OK, "outsider": DENY, "anonymous": LOGIN}
OPERATOR_PAGE_ACTION = {"operator": OK, "researcher": DENY, "outsider": DENY, "anonymous": LOGIN}
OWNED_PAGE = {
    "operator": OK,
    "researcher": OK,
    "researcher_on_other": HIDE,
    "outsider": DENY,
    "anonymous": LOGIN,
}
ROLE_API = {"operator": OK, "researcher": OK, "outsider": DENY, "anonymous": AUTH}
OPERATOR_API = {"operator": OK, "researcher": DENY, "outsider": DENY, "anonymous": AUTH}
OWNED_API = {
    "operator": OK,
    "researcher": OK,
    "researcher_on_other": HIDE,
    "outsider": DENY,
    "anonymous": AUTH,
}
PUBLIC = {"operator": OK, "researcher": OK, "outsider": OK, "anonymous": OK}
NOT_OWN_API = {"operator": HIDE, "researcher": HIDE, "outsider": DENY, "anonymous": AUTH}

EXPECTED: dict[str, tuple[str, bool, dict[str, Any] | None, dict[str, str]]] = {
    # pages
    "overview": ("get", False, None, INVENTORY_PAGE),
    "overview-live": ("get", False, None, INVENTORY_PAGE),
    "node-list": ("get", False, None, INVENTORY_PAGE),
    "node-list-live": ("get", False, None, INVENTORY_PAGE),
    "node-detail": ("get", False, None, INVENTORY_PAGE),
    "node-drain": ("post", False, {"reason": "matrix"}, OPERATOR_PAGE_ACTION),
    "recovery": ("get", False, None, INVENTORY_PAGE),
    "acceptance-list": ("get", False, None, INVENTORY_PAGE),
    "acceptance-start": ("post", False, {}, OPERATOR_PAGE_ACTION),
    "acceptance-detail": ("get", False, None, INVENTORY_PAGE),
    "acceptance-cancel": ("post", False, {}, OPERATOR_PAGE_ACTION),
    "acceptance-certificate-download": ("get", False, None, INVENTORY_PAGE),
    "suspect-clear": ("post", False, {}, OPERATOR_PAGE_ACTION),
    "node-resume": ("post", False, {}, OPERATOR_PAGE_ACTION),
    "cluster-sync": ("post", False, {}, OPERATOR_PAGE_ACTION),
    "cluster-access": ("get", False, None, INVENTORY_PAGE),
    "topology": ("get", False, None, INVENTORY_PAGE),
    "job-list": ("get", False, None, INVENTORY_PAGE),
    "job-new": ("get", False, None, INVENTORY_PAGE),
    "job-detail": ("get", True, None, OWNED_PAGE),
    "job-status": ("get", True, None, OWNED_PAGE),
    "job-cancel": ("post", True, {}, OWNED_PAGE),
    "job-resume": ("post", True, {}, OWNED_PAGE),
    # Hold/release (the world's jobs run: refused with a message), whole output (the
    # cluster does not answer: a message), templates (private: hidden from others).
    "job-hold": ("post", True, {}, OWNED_PAGE),
    "job-release": ("post", True, {}, OWNED_PAGE),
    "job-output": ("get", True, None, OWNED_PAGE),
    "job-rank-output": ("get", True, None, OWNED_PAGE),
    "job-save-template": ("post", True, {"name": "matrix"}, OWNED_PAGE),
    "job-compose-check": ("post", False, {}, INVENTORY_PAGE),
    "job-template-list": ("get", False, None, INVENTORY_PAGE),
    "job-template-submit": ("post", True, {}, OWNED_PAGE),
    "job-template-share": ("post", True, {"shared": "1"}, OWNED_PAGE),
    "job-template-delete": ("post", True, {}, OWNED_PAGE),
    "drill-list": ("get", False, None, INVENTORY_PAGE),
    "drill-detail": ("get", True, None, OWNED_PAGE),
    "drill-status": ("get", True, None, OWNED_PAGE),
    "drill-cancel": ("post", True, {}, OWNED_PAGE),
    "checkpoint": ("get", True, None, OWNED_PAGE),
    "checkpoint-drill": ("post", True, {"steps": "3"}, OWNED_PAGE),
    "checkpoint-verify": ("post", True, {}, OWNED_PAGE),
    "drill-policy": ("post", False, {"max_in_flight": "1"}, OPERATOR_PAGE_ACTION),
    # One's own API tokens: every role has them, an outsider (no role) has no API to use.
    "api-token-list": ("get", False, None, INVENTORY_PAGE),
    # Without a token id of one's own: not found, the same as someone else's token.
    "api-token-revoke": (
        "post",
        False,
        {"token_id": "999999"},
        {"operator": HIDE, "researcher": HIDE, "outsider": DENY, "anonymous": LOGIN},
    ),
    # One's own notification subscriptions (notifications app), like API tokens.
    "notification-subscription-list": ("get", False, None, INVENTORY_PAGE),
    "notification-subscription-remove": (
        "post",
        False,
        {"subscription_id": "999999"},
        {"operator": HIDE, "researcher": HIDE, "outsider": DENY, "anonymous": LOGIN},
    ),
    "login": ("get", False, None, PUBLIC),
    "logout": ("post", False, {}, {persona: LOGIN for persona in PUBLIC}),
    "api-schema": ("get", False, None, PUBLIC),
    "api-docs": ("get", False, None, PUBLIC),
    # Off unless GANTRY_METRICS_TOKEN or _ALLOW is set; the scraper's access is in
    # tests/console/test_exporter.py. No session or API token opens it.
    "metrics": ("get", False, None, {persona: DENY for persona in PUBLIC}),
    # API
    "api:me": ("get", False, None, {**ROLE_API, "outsider": OK}),
    "api:audit-event-list": ("get", False, None, OPERATOR_API),
    "api:cluster-list": ("get", False, None, ROLE_API),
    "api:cluster-register": ("post", False, {}, OPERATOR_API),
    "api:cluster-detail": ("get", False, None, ROLE_API),
    "api:cluster-probe": ("post", False, {}, OPERATOR_API),
    "api:cluster-sync": ("post", False, {}, OPERATOR_API),
    "api:cluster-user-ca": ("get", False, None, ROLE_API),
    "api:cluster-user-ca-create": ("post", False, {}, OPERATOR_API),
    "api:cluster-user-auth": ("put", False, {"user_auth": "certificate"}, OPERATOR_API),
    "api:cluster-my-identity": ("get", False, None, ROLE_API),
    "api:cluster-identity-list": ("get", False, None, OPERATOR_API),
    "api:cluster-identity-set": (
        "post",
        False,
        {"user": "rita-researcher", "account": "alice"},
        OPERATOR_API,
    ),
    # No identity with that id: operators get not found, everyone else is refused first.
    "api:cluster-identity-delete": (
        "post",
        False,
        {},
        {"operator": HIDE, "researcher": DENY, "outsider": DENY, "anonymous": AUTH},
    ),
    "api:node-list": ("get", False, None, ROLE_API),
    "api:node-detail": ("get", False, None, ROLE_API),
    "api:node-drain": ("post", False, {"reason": "matrix"}, OPERATOR_API),
    "api:node-resume": ("post", False, {}, OPERATOR_API),
    "api:gpu-list": ("get", False, None, ROLE_API),
    # GPU and node health (health app): read by every role, like the inventory.
    "api:node-health": ("get", False, None, ROLE_API),
    "api:gpu-capacity": ("get", False, None, ROLE_API),
    # A cluster's health source: read by every role, changed by operators (EXTRA_CELLS).
    "api:health-source": ("get", False, None, ROLE_API),
    "api:topology": ("get", False, None, ROLE_API),
    "api:job-list": ("get", False, None, ROLE_API),
    "api:job-submit": ("post", False, {}, ROLE_API),
    "api:job-preview": ("post", False, {}, ROLE_API),
    "api:job-detail": ("get", True, None, OWNED_API),
    "api:job-cancel": ("post", True, {}, OWNED_API),
    "api:job-resume": ("post", True, {"checkpoint_step": 100}, OWNED_API),
    "api:job-metrics": ("get", True, None, OWNED_API),
    "api:job-checkpoints": ("get", True, None, OWNED_API),
    "api:job-logs": ("get", True, None, OWNED_API),
    "api:job-events": ("get", True, None, OWNED_API),
    "api:job-hold": ("post", True, {}, OWNED_API),
    "api:job-release": ("post", True, {}, OWNED_API),
    "api:job-run-again": ("post", True, {}, OWNED_API),
    "api:job-save-template": ("post", True, {"name": "matrix"}, OWNED_API),
    "api:job-output": ("get", True, None, OWNED_API),
    "api:job-rank-outputs": ("get", True, None, OWNED_API),
    "api:job-rank-output": ("get", True, None, OWNED_API),
    "api:job-template-list": ("get", False, None, ROLE_API),
    "api:job-template-create": ("post", False, {}, ROLE_API),
    "api:job-template-detail": ("get", True, None, OWNED_API),
    "api:job-template-update": ("post", True, {"shared": True}, OWNED_API),
    "api:job-template-delete": ("post", True, {}, OWNED_API),
    "api:job-template-submit": ("post", True, {}, OWNED_API),
    "api:trainer-presets": ("get", False, None, ROLE_API),
    "api:checkpoint-detail": ("get", True, None, OWNED_API),
    "api:checkpoint-verify": ("post", True, {}, OWNED_API),
    "api:drill-start": ("post", True, {"steps": 3}, OWNED_API),
    "api:drill-list": ("get", False, None, ROLE_API),
    "api:drill-detail": ("get", True, None, OWNED_API),
    "api:drill-cancel": ("post", True, {}, OWNED_API),
    "api:drill-policy": ("get", False, None, ROLE_API),
    "api:drill-budget": ("get", False, None, ROLE_API),
    "api:incident-list": ("get", False, None, ROLE_API),
    "api:recovery-policy": ("get", False, None, ROLE_API),
    "api:suspect-node-list": ("get", False, None, OPERATOR_API),
    "api:suspect-node-clear": ("post", False, {}, OPERATOR_API),
    "api:cluster-update": ("patch", False, {}, OPERATOR_API),
    # Acceptance: operators start and cancel; every role reads runs and certificates.
    "api:acceptance-run-list": ("get", False, None, ROLE_API),
    "api:acceptance-run-start": ("post", False, {}, OPERATOR_API),
    "api:acceptance-run-detail": ("get", False, None, ROLE_API),
    "api:acceptance-run-cancel": ("post", False, {}, OPERATOR_API),
    "api:acceptance-certificate": ("get", False, None, ROLE_API),
    # Subscriptions are one's own: an id that is not (999999) is not found for everyone.
    "api:notification-subscription-list": ("get", False, None, ROLE_API),
    "api:notification-subscription-create": ("post", False, {}, ROLE_API),
    "api:notification-subscription-detail": ("get", False, None, NOT_OWN_API),
    "api:notification-subscription-remove": ("post", False, {}, NOT_OWN_API),
    "api:notification-subscription-deliveries": ("get", False, None, NOT_OWN_API),
}
# The drill policy is readable by every role but changed by operators only.
EXTRA_CELLS = [
    ("api:drill-policy", "put", False, {"max_in_flight": 1}, OPERATOR_API),
    ("api:drill-budget", "put", False, {"max_active_drills": 2}, OPERATOR_API),
    ("api:recovery-policy", "put", False, {"max_attempts": 2}, OPERATOR_API),
    ("api:health-source", "put", False, {"interval_seconds": 60}, OPERATOR_API),
]


def _routes() -> list[tuple[str, str]]:
    """(name, route) for every named URL pattern outside the admin and the skipped apps."""
    found: list[tuple[str, str]] = []

    def walk(patterns: list[Any], prefix: str, namespace: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                if pattern.namespace in NAMESPACED_SKIPS or route.startswith(SKIPPED_PREFIXES):
                    continue
                inner = namespace + (f"{pattern.namespace}:" if pattern.namespace else "")
                walk(pattern.url_patterns, route, inner)
            elif isinstance(pattern, URLPattern):
                if route.startswith(SKIPPED_PREFIXES):
                    continue
                found.append((namespace + (pattern.name or f"<unnamed {route}>"), route))

    walk(get_resolver().url_patterns, "", "")
    return found


def test_every_route_has_a_row(security_figures: Any) -> None:
    routes = _routes()
    missing = [f"{name} ({route})" for name, route in routes if name not in EXPECTED]
    assert not missing, f"routes without a permission-matrix row: {missing}"
    stale = set(EXPECTED) - {name for name, _ in routes}
    assert not stale, f"rows for routes that no longer exist: {sorted(stale)}"
    for prefix in SKIPPED_PREFIXES:
        security_figures.member("matrix.skipped", f"/{prefix}")


def _kwargs(name: str, route: str, objects: dict[str, Any], world: dict[str, Any]) -> dict:
    values = {
        "node_id": world["node"].pk,
        "cluster_id": world["cluster"].pk,
        "job_id": objects["job"].pk,
        "checkpoint_id": objects["checkpoint"].pk,
        "drill_id": objects["drill"].pk,
        "step": objects["checkpoint"].step,
        "template_id": objects["template"].pk,
        "rank": 0,
        # Nobody's: the subscription routes answer "not found" the same for every role.
        "subscription_id": 999999,
        "identity_id": 999999,
        "run_id": world["acceptance_run"].pk,
    }
    return {
        key: value for key, value in values.items() if f"<{_converter(route, key)}:{key}>" in route
    }


def _converter(route: str, key: str) -> str:
    marker = f":{key}>"
    start = route.rfind("<", 0, route.find(marker))
    return route[start + 1 : route.find(marker)]


def _client(persona: str, users: dict[str, Any], tokens: dict[str, Any], api: bool) -> Client:
    client = Client()
    user = users["researcher" if persona == "researcher_on_other" else persona]
    if user is None:
        return client
    if api:
        client.defaults["HTTP_AUTHORIZATION"] = f"Token {tokens[user.username]}"
    else:
        client.force_login(user)
    return client


def _request(client: Client, method: str, url: str, payload: Any, api: bool) -> Any:
    if method == "get":
        return client.get(url)
    if api:
        return getattr(client, method)(
            url, data=json.dumps(payload or {}), content_type="application/json"
        )
    return getattr(client, method)(url, data=payload or {})


def _kind(response: Any, api: bool) -> str:
    status = response.status_code
    if status == 401:
        return AUTH
    if status == 403:
        return DENY
    if status == 404:
        return HIDE
    if status in (301, 302):
        location = response.headers.get("Location", "")
        if "/accounts/login/" in location or "/admin/login/" in location:
            return LOGIN
        return OK
    if status < 500 or status in (502, 503):
        return OK
    return f"server error {status}"


FOREIGN_MARKERS = ("robs-secret-run", "rob-researcher")


def _cells() -> list[tuple[str, str, bool, Any, dict[str, str], str]]:
    cells = []
    for name, (method, owned, payload, expected) in EXPECTED.items():
        for persona in PERSONAS:
            if persona == "researcher_on_other" and not owned:
                continue
            cells.append((name, method, owned, payload, expected, persona))
    for name, method, owned, payload, expected in EXTRA_CELLS:
        for persona in PERSONAS:
            if persona == "researcher_on_other" and not owned:
                continue
            cells.append((name, method, owned, payload, expected, persona))
    return cells


def test_matrix(
    world: dict[str, Any],
    operator: Any,
    researcher: Any,
    outsider: Any,
    persona_tokens: dict[str, Any],
    security_figures: Any,
) -> None:
    """One test for all cells (one database set-up): a failure lists every wrong cell."""
    users = {
        "operator": operator,
        "researcher": researcher,
        "outsider": outsider,
        "anonymous": None,
    }
    tokens = {user.username: persona_tokens[role] for role, user in users.items() if user}
    routes = dict(_routes())
    own = {key: world[key] for key in ("job", "checkpoint", "drill", "template")}
    other = {key: world[f"other_{key}"] for key in ("job", "checkpoint", "drill", "template")}
    wrong: list[str] = []
    for name, method, _owned, payload, expected, persona in _cells():
        route = routes[name]
        api = name.startswith("api:")
        objects = other if persona == "researcher_on_other" else own
        url = reverse(name, kwargs=_kwargs(name, route, objects, world) or None)
        client = _client(persona, users, tokens, api)
        from django.db import transaction

        with transaction.atomic():
            sid = transaction.savepoint()
            response = _request(client, method, url, payload, api)
            transaction.savepoint_rollback(sid)
        got = _kind(response, api)
        want = expected.get(persona, expected.get("researcher"))
        security_figures.add("matrix.cells")
        security_figures.member("matrix.routes", f"{method} {name}")
        security_figures.member("matrix.personas", persona)
        if got != want:
            wrong.append(
                f"{persona:20} {method.upper():4} {url}: want {want}, got {got} "
                f"({response.status_code})"
            )
        if persona.startswith("researcher") and response.status_code < 400:
            body = response.content.decode(errors="replace")
            leaked = [marker for marker in FOREIGN_MARKERS if marker in body]
            leaked += [str(world["other_job"].pk)] if str(world["other_job"].pk) in body else []
            if leaked:
                security_figures.add("matrix.leaks")
                wrong.append(f"LEAK {persona} {method.upper()} {url}: {leaked}")
        if got == HIDE and persona == "researcher_on_other" and api:
            # The same answer as for an id that does not exist: existence does not leak.
            body = json.loads(response.content)
            assert set(body) == {"message", "extra"}
            assert str(world["other_job"].pk) not in response.content.decode()
    assert not wrong, "\n".join(wrong)


def test_lists_and_counts_show_only_own_objects(
    world: dict[str, Any],
    researcher: Any,
    operator: Any,
    persona_tokens: dict[str, Any],
    security_figures: Any,
) -> None:
    researcher_api = Client(HTTP_AUTHORIZATION=f"Token {persona_tokens['researcher']}")
    operator_api = Client(HTTP_AUTHORIZATION=f"Token {persona_tokens['operator']}")

    def ids(client: Client, url: str) -> set[str]:
        body = client.get(url).json()
        return {str(item["id"]) for item in body["results"]}

    assert ids(researcher_api, "/api/v1/jobs/") == {str(world["job"].pk)}
    assert ids(researcher_api, "/api/v1/jobs/?owner=rob-researcher") == set()
    assert ids(researcher_api, "/api/v1/jobs/?search=robs") == set()
    assert ids(researcher_api, "/api/v1/drills/") == {str(world["drill"].pk)}
    assert ids(researcher_api, f"/api/v1/drills/?job={world['other_job'].pk}") == set()
    assert ids(operator_api, "/api/v1/jobs/") == {str(world["job"].pk), str(world["other_job"].pk)}
    assert ids(operator_api, "/api/v1/drills/") == {
        str(world["drill"].pk),
        str(world["other_drill"].pk),
    }

    pages = Client()
    pages.force_login(researcher)
    for url in ("/", "/jobs/?mine=0", "/jobs/?owner=rob-researcher&mine=0", "/drills/"):
        body = pages.get(url).content.decode()
        security_figures.add("matrix.cells")
        for marker in (*FOREIGN_MARKERS, str(world["other_job"].pk), str(world["other_drill"].pk)):
            if marker in body:
                security_figures.add("matrix.leaks")
            assert marker not in body, f"{url} shows {marker}"
    # Counts: the overview's running-job count is the researcher's own (1), not the fleet's (2).
    overview = pages.get("/")
    assert overview.context["running_count"] == 1
    drills = pages.get("/drills/")
    # The world's drills are self-attested (no verifier account): counted apart from proof.
    assert drills.context["health"]["self_attested_passed"] == 1
    assert drills.context["health"]["running_jobs"] == 1


def test_admin_is_for_staff_operators_only(
    world: dict[str, Any], operator: Any, researcher: Any, outsider: Any, security_figures: Any
) -> None:
    urls = [
        "/admin/",
        "/admin/jobs/job/",
        f"/admin/jobs/job/{world['other_job'].pk}/change/",
        "/admin/nodes/cluster/",
        f"/admin/nodes/cluster/{world['cluster'].pk}/change/",
    ]
    for persona, user in (("researcher", researcher), ("outsider", outsider), ("anonymous", None)):
        client = Client()
        if user is not None:
            client.force_login(user)
        for url in urls:
            response = client.get(url)
            security_figures.add("matrix.cells")
            security_figures.member("matrix.personas", persona)
            assert response.status_code == 302, (persona, url, response.status_code)
            assert "/admin/login/" in response.headers["Location"]
    client = Client()
    client.force_login(operator)
    for url in urls:
        security_figures.add("matrix.cells")
        assert client.get(url).status_code == 200, url


@pytest.mark.parametrize("path", ["/api/v1/jobs/{job}/", "/api/v1/checkpoints/{checkpoint}/"])
def test_not_found_bodies_do_not_tell_another_users_object_from_a_missing_one(
    path: str, world: dict[str, Any], persona_tokens: dict[str, Any]
) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Token {persona_tokens['researcher']}")
    other = client.get(
        path.format(job=world["other_job"].pk, checkpoint=world["other_checkpoint"].pk)
    )
    missing = client.get(
        path.format(job="00000000-0000-4000-8000-000000000000", checkpoint=987654321)
    )
    assert other.status_code == missing.status_code == 404
    assert other.json()["message"] == missing.json()["message"]
