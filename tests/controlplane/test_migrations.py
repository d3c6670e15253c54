"""Moving models between apps (AuditEvent to core, RestoreDrill and DrillPolicy to drills)
keeps every row of a migrated database, and the permissions granted on them."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

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
