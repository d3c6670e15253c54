"""Moving models between apps (AuditEvent to core, RestoreDrill and DrillPolicy to drills)
keeps every row of a migrated database, and the permissions granted on them; DRF's
authtoken keys become personal API tokens that take the same key (core 0004)."""

from __future__ import annotations

import importlib
import secrets
from typing import Any

import pytest
from django.core.cache import caches
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from rest_framework.test import APIClient

from core.models import ApiToken

# The last migrations before the move, per app; the apps the models moved to, unapplied.
BEFORE = [
    ("controlplane", "0002_roles"),
    ("jobs", "0003_job_throughput_now"),
    ("nodes", "0001_initial"),
    ("studies", "0001_initial"),
]
NOT_YET = [("core", None), ("drills", None)]


@pytest.mark.django_db(transaction=True)
def test_rows_survive_the_move_between_apps() -> None:
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    executor.migrate(BEFORE + NOT_YET)
    executor = MigrationExecutor(connection)
    old: Any = executor.loader.project_state(BEFORE).apps
    user = old.get_model("auth", "User").objects.create(username="mover")
    cluster = old.get_model("nodes", "Cluster").objects.create(
        name="c1", ssh_host="h", ssh_user="u", workdir="/w", python="/p"
    )
    job = old.get_model("jobs", "Job").objects.create(
        owner=user, cluster=cluster, name="j", partition="batch"
    )
    checkpoint = old.get_model("jobs", "Checkpoint").objects.create(job=job, step=5, path="/c")
    drill = old.get_model("jobs", "RestoreDrill").objects.create(
        checkpoint=checkpoint,
        cluster=cluster,
        allocation_key="k",
        state="finished",
        verdict="passed",
    )
    old.get_model("jobs", "DrillPolicy").objects.create(cluster=cluster, enabled=True)
    old.get_model("controlplane", "AuditEvent").objects.create(
        actor=user, actor_name="mover", action="drill.start", target_id=str(drill.pk)
    )
    # Grants on the moving models (a group may hold them, as the roles do).
    content_type = old.get_model("contenttypes", "ContentType")
    permission = old.get_model("auth", "Permission")
    movers = old.get_model("auth", "Group").objects.create(name="movers")
    for label, model, codename in [
        ("jobs", "restoredrill", "add_restoredrill"),
        ("controlplane", "auditevent", "view_auditevent"),
    ]:
        kind, _ = content_type.objects.get_or_create(app_label=label, model=model)
        grant, _ = permission.objects.get_or_create(
            content_type=kind, codename=codename, defaults={"name": codename}
        )
        movers.permissions.add(grant)

    executor = MigrationExecutor(connection)
    executor.migrate(leaves)
    new: Any = executor.loader.project_state(leaves).apps
    moved = new.get_model("drills", "RestoreDrill").objects.get()
    assert (str(moved.pk), moved.verdict, moved.checkpoint.step) == (str(drill.pk), "passed", 5)
    assert new.get_model("drills", "DrillPolicy").objects.get().enabled
    assert new.get_model("core", "AuditEvent").objects.get().action == "drill.start"
    granted = {
        (grant.content_type.app_label, grant.codename)
        for grant in new.get_model("auth", "Group").objects.get(name="movers").permissions.all()
    }
    assert granted == {("drills", "add_restoredrill"), ("core", "view_auditevent")}


# DRF's authtoken migrations, which made its table on the databases that had the app.
DRF_AUTHTOKEN_MIGRATIONS = (
    "0001_initial",
    "0002_auto_20160226_1747",
    "0003_tokenproxy",
    "0004_alter_tokenproxy_options",
)
BEFORE_CONVERSION = [("core", "0003_apitoken_legacy")]


@pytest.mark.django_db(transaction=True)
def test_a_drf_token_made_before_the_conversion_signs_in_after_it() -> None:
    caches["ratelimit"].clear()
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    executor.migrate(BEFORE_CONVERSION)
    state = MigrationExecutor(connection).loader.project_state(BEFORE_CONVERSION)
    # The app is not installed any more, so its table is made here by its own migrations,
    # as it was on a database of before.
    with connection.schema_editor() as editor:
        for name in DRF_AUTHTOKEN_MIGRATIONS:
            module = importlib.import_module(f"rest_framework.authtoken.migrations.{name}")
            state = module.Migration(name, "authtoken").apply(state, editor)
    old: Any = state.apps
    try:
        user = old.get_model("auth", "User").objects.create(username="keyholder")
        researchers, _ = old.get_model("auth", "Group").objects.get_or_create(name="researchers")
        user.groups.add(researchers)
        # As DRF makes a key: 20 random bytes in hex.
        key = secrets.token_hex(20)
        drf_token = old.get_model("authtoken", "Token").objects.create(key=key, user_id=user.pk)

        MigrationExecutor(connection).migrate(leaves)

        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        response = client.get("/api/v1/me/")
        assert response.status_code == 200, response.content
        assert response.json()["username"] == "keyholder"
        assert response.json()["role"] == "researcher"
        converted = ApiToken.objects.get(user_id=user.pk)
        assert converted.legacy
        assert converted.key_hash == ApiToken.hash_secret(key)
        assert converted.prefix == key[:4]
        assert converted.created_at == drf_token.created
        assert converted.last_used_at is not None
        # The plain key is kept nowhere any more.
        assert not old.get_model("authtoken", "Token").objects.exists()
        wrong = key[:-1] + ("1" if key.endswith("0") else "0")
        client.credentials(HTTP_AUTHORIZATION=f"Token {wrong}")
        assert client.get("/api/v1/me/").status_code == 401
    finally:
        with connection.schema_editor() as editor:
            editor.delete_model(old.get_model("authtoken", "Token"))
        caches["ratelimit"].clear()
