"""SSH private keys (the service account's, the user CA's, per-user keys): 0600 files in a
0700 directory, never in the database, a page, the admin, the API or the logs. (Unknown
and changed host keys are refused: see tests/integration/test_clusters.py and
tests/slurm/.)"""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path
from typing import Any

from django.apps import apps
from django.db import models
from django.test import Client
from security_support import make_private_key_text

GET_PAGES = [
    "/",
    "/nodes/",
    "/nodes/{node}/",
    "/topology/",
    "/jobs/",
    "/jobs/{job}/",
    "/drills/",
    "/jobs/new/",
    "/admin/",
    "/admin/nodes/cluster/",
    "/admin/nodes/cluster/{cluster}/change/",
    "/admin/nodes/cluster/add/",
    "/clusters/{cluster}/access/",
    "/admin/nodes/clusteridentity/",
]
GET_API = [
    "/api/v1/clusters/",
    "/api/v1/clusters/{cluster}/",
    "/api/v1/nodes/",
    "/api/v1/topology/",
    "/api/v1/audit-events/",
    "/api/v1/jobs/{job}/",
    "/api/v1/clusters/{cluster}/drill-policy/",
    "/api/v1/clusters/{cluster}/user-ca/",
    "/api/v1/clusters/{cluster}/identities/",
    "/api/v1/clusters/{cluster}/identity/",
]


def _key_text(cluster: Any) -> str:
    from nodes.access.cluster import private_key_path

    return private_key_path(cluster).read_text()


def _fragments(key_text: str) -> list[str]:
    """Pieces of the key body long enough to be unmistakable. An OpenSSH private key holds
    its public key too; a piece that is also in the public key line (which Gantry shows, for
    the user CA and per-user keys) is no secret and is left out."""
    from cryptography.hazmat.primitives import serialization

    body = "".join(line for line in key_text.splitlines() if not line.startswith("-----"))
    try:
        key = serialization.load_ssh_private_key(key_text.encode(), password=None)
        public = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    except (ValueError, TypeError):
        public = b""
    pieces = [body[i : i + 24] for i in range(0, len(body) - 24, 24)]
    return [piece for piece in pieces if piece.encode() not in public]


def test_key_file_is_0600_in_a_0700_directory(dead_cluster: Any, isolated_ssh_dir: Path) -> None:
    from nodes.access.cluster import known_hosts_path, private_key_path, user_ca_key_path
    from nodes.access.identities import cluster_user_ca_ensure

    cluster_user_ca_ensure(actor=None, cluster=dead_cluster)
    ca = user_ca_key_path(dead_cluster)
    assert (
        stat.S_IMODE(ca.stat().st_mode) == 0o600
        and ca.parent == private_key_path(dead_cluster).parent
    )
    key = private_key_path(dead_cluster)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(isolated_ssh_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(known_hosts_path(dead_cluster).stat().st_mode) == 0o600
    # Outside the database and outside anything the web server serves.
    assert "static" not in key.parts


def test_private_key_never_shown(
    world: dict[str, Any],
    operator: Any,
    persona_tokens: dict[str, Any],
    caplog: Any,
    security_figures: Any,
) -> None:
    from factories import JobFactory
    from nodes.access.cluster import user_ca_key_path, user_key_path
    from nodes.access.identities import cluster_user_auth_set, cluster_user_ca_ensure

    cluster = world["cluster"]
    fragments = _fragments(_key_text(cluster))
    assert fragments
    # The user CA, and (user_keys mode, then back) a per-user private key.
    cluster_user_auth_set(actor=operator, cluster=cluster, user_auth="user_keys")
    fragments += _fragments(user_key_path(cluster, "alice").read_text())
    cluster_user_auth_set(actor=operator, cluster=cluster, user_auth="certificate")
    cluster_user_ca_ensure(actor=operator, cluster=cluster)
    ca_fragments = _fragments(user_ca_key_path(cluster).read_text())
    assert len(ca_fragments) >= 5
    fragments += ca_fragments
    cluster.refresh_from_db()
    # A job that runs as alice: reading its log signs a certificate for her (and fails:
    # the host does not listen), which the logs talk about.
    as_alice = JobFactory(
        owner=world["job"].owner, cluster=cluster, run_as="alice", slurm_job_id="77"
    )
    ids = {"node": world["node"].pk, "job": world["job"].pk, "cluster": cluster.pk}
    pages = Client()
    pages.force_login(operator)
    api = Client(HTTP_AUTHORIZATION=f"Token {persona_tokens['operator']}")
    seen: list[tuple[str, str]] = []
    caplog.set_level(logging.DEBUG)
    for url in GET_PAGES:
        response = pages.get(url.format(**ids))
        assert response.status_code == 200, url
        seen.append((url, response.content.decode(errors="replace")))
    for url in GET_API:
        response = api.get(url.format(**ids))
        assert response.status_code == 200, url
        seen.append((url, response.content.decode(errors="replace")))
    # Calls that use the key (and fail: the host does not listen) and log about it.
    for url in (
        f"/api/v1/clusters/{cluster.pk}/probe/",
        f"/api/v1/nodes/{world['node'].pk}/resume/",
        f"/api/v1/clusters/{cluster.pk}/user-ca/create/",
    ):
        seen.append((url, api.post(url).content.decode(errors="replace")))
    # The log tail reads nothing here; the whole output is read as alice, signed for her.
    for url in (f"/api/v1/jobs/{as_alice.pk}/logs/", f"/api/v1/jobs/{as_alice.pk}/output/"):
        seen.append((url, api.get(url).content.decode(errors="replace")))
    assert "signed a 600 s certificate for alice@" in caplog.text

    # A registration that fails after the key was read: its answer must not echo the key.
    new_key = make_private_key_text()
    fragments += _fragments(new_key)
    for body in (
        {
            "name": "other",
            "ssh_host": "127.0.0.1",
            "ssh_port": 3,
            "ssh_user": "g",
            "private_key": new_key,
            "workdir": "/srv",
            "python": "/usr/bin/python3",
        },
        {
            "name": "other",
            "ssh_host": "127.0.0.1",
            "ssh_port": 3,
            "ssh_user": "g",
            "private_key": new_key,
            "workdir": "relative!",
            "python": "/usr/bin/python3",
        },
        {
            "name": "other",
            "ssh_host": "127.0.0.1",
            "ssh_port": 3,
            "ssh_user": "g",
            "private_key": new_key[:-80],
            "workdir": "/srv",
            "python": "/usr/bin/python3",
        },
    ):
        response = api.post(
            "/api/v1/clusters/register/", data=json.dumps(body), content_type="application/json"
        )
        assert response.status_code >= 400
        seen.append(("register", response.content.decode(errors="replace")))
    seen.append(("logs", caplog.text))

    # Every text column of every table.
    for model in apps.get_models():
        text_fields = [
            field.name
            for field in model._meta.get_fields()
            if isinstance(field, models.CharField | models.TextField | models.JSONField)
        ]
        if not text_fields:
            continue
        for row in model.objects.values_list(*text_fields):
            seen.append((f"db {model._meta.label}", json.dumps(row, default=str)))

    leaks = [
        where for where, text in seen if "PRIVATE KEY" in text or any(f in text for f in fragments)
    ]
    security_figures.add("keys.places_scanned", len(seen))
    security_figures.add("keys.leaks", len(leaks))
    assert not leaks, f"private key text in: {leaks}"


def test_the_web_role_never_opens_the_ca_key(
    world: dict[str, Any],
    operator: Any,
    persona_tokens: dict[str, Any],
    settings: Any,
    monkeypatch: Any,
) -> None:
    """With ``GANTRY_CA_KEY_ACCESS=signer`` (the web processes), every request that acts as
    a researcher's account gets its certificate from the signer, and this process never
    opens the CA key file: the whole output and the rank files. (The cluster does not
    listen: each request fails after its certificate was signed.) The log tail and cancel
    run no command in the request at all: answered from, and recorded in, the database."""
    from signer_support import in_process_round_trip, watching_opens

    from factories import JobFactory, map_personas
    from jobs.models import Job
    from nodes.access import signer_client
    from nodes.access.cluster import user_ca_key_path
    from nodes.access.identities import cluster_user_ca_ensure
    from slurm.transport import close_all

    cluster = world["cluster"]
    cluster_user_ca_ensure(actor=None, cluster=cluster)
    map_personas(cluster=cluster)
    as_alice = JobFactory(
        owner=world["job"].owner,
        cluster=cluster,
        run_as="alice",
        slurm_job_id="77",
        state=Job.State.RUNNING,
    )
    settings.CA_KEY_ACCESS = "signer"
    close_all()
    calls: list[str] = []
    api = Client(HTTP_AUTHORIZATION=f"Token {persona_tokens['operator']}")
    base = f"/api/v1/jobs/{as_alice.pk}"
    with watching_opens(user_ca_key_path(cluster)) as watch:
        monkeypatch.setattr(signer_client, "signer_round_trip", in_process_round_trip(watch, calls))
        answers = {
            "logs": api.get(f"{base}/logs/"),
            "output": api.get(f"{base}/output/"),
            "ranks": api.get(f"{base}/output/ranks/"),
            "cancel": api.post(f"{base}/cancel/"),
        }
    close_all()
    assert answers.pop("cancel").status_code == 202
    assert answers.pop("logs").json()["reading"] is True
    # Each got as far as connecting (refused: a passing error), with a certificate.
    for what, response in answers.items():
        body = response.content.decode(errors="replace")
        assert response.status_code in (200, 503), (what, response.status_code, body)
        assert response.status_code == 200 or "connection refused" in body, (what, body)
    assert calls and set(calls) == {"nodes.user_certificate_sign"}
    assert watch.opened == []
