"""AuditEvent moves from the controlplane app to core; its table and rows stay.

State only: the table ``controlplane_auditevent`` was created by controlplane 0001 and is
kept. The content type is renamed, so permissions granted on it (the operators' view
permission) keep their ids and grants.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from core.contenttypes import move_content_types


def move_content_type(apps, schema_editor):
    move_content_types(apps, "controlplane", "core", ["auditevent"])


def move_content_type_back(apps, schema_editor):
    move_content_types(apps, "core", "controlplane", ["auditevent"])


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("controlplane", "0002_roles"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("auth", "0012_alter_user_first_name_max_length"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="AuditEvent",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("at", models.DateTimeField(auto_now_add=True, db_index=True)),
                        ("actor_name", models.CharField(blank=True, max_length=150)),
                        (
                            "action",
                            models.CharField(db_index=True, help_text="e.g. node.drain", max_length=64),
                        ),
                        ("target_type", models.CharField(blank=True, max_length=64)),
                        ("target_id", models.CharField(blank=True, max_length=64)),
                        ("target_repr", models.CharField(blank=True, max_length=255)),
                        ("details", models.JSONField(blank=True, default=dict)),
                        (
                            "actor",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="audit_events",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "controlplane_auditevent",
                        "ordering": ["-at", "-id"],
                        "indexes": [
                            models.Index(fields=["target_type", "target_id", "-at"], name="audit_target")
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(move_content_type, move_content_type_back),
    ]
