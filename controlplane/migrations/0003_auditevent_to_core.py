"""AuditEvent now belongs to the core app (core 0001); drop it from this app's state only."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0002_roles"),
        ("core", "0001_auditevent_from_controlplane"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="AuditEvent")],
            database_operations=[],
        ),
    ]
