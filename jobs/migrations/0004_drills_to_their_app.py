"""RestoreDrill and DrillPolicy now belong to the drills app (drills 0001): state only."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0003_job_throughput_now"),
        ("drills", "0001_drills_from_jobs"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="RestoreDrill"),
                migrations.DeleteModel(name="DrillPolicy"),
            ],
            database_operations=[],
        ),
    ]
