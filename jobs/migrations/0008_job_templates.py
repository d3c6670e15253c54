"""Job templates (``jobs.JobTemplate``), and what the watcher learns of pending jobs from
``squeue --start`` (expected start, place in the partition's queue).

Operators get the template permissions here, as ``core.roles.roles_sync`` grants them
every permission of the jobs app.
"""

import django.db.models.deletion
from django.conf import settings
from django.contrib.auth.management import create_permissions
from django.db import migrations, models


def grant_operators(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    # Permissions are normally created after all migrations; the grant needs them now.
    app_config = apps.get_app_config("jobs")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    operators = Group.objects.filter(name="operators").first()
    if operators is not None:
        operators.permissions.add(
            *Permission.objects.filter(
                content_type__app_label="jobs", content_type__model="jobtemplate"
            )
        )


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0007_job_run_as_cluster_identities'),
        ('nodes', '0002_accounting_backoff'),
        ('controlplane', '0002_roles'),
        ('contenttypes', '0002_remove_content_type_name'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='expected_start_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='pending_checked_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='queue_length',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='queue_position',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name='JobTemplate',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=128)),
                ('description', models.CharField(blank=True, max_length=512)),
                ('shared', models.BooleanField(default=False, help_text='Everyone may see and use it.')),
                ('settings', models.JSONField(default=dict)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('cluster', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='job_templates', to='nodes.cluster')),
                ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='job_templates', to=settings.AUTH_USER_MODEL)),
                ('source_job', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='templates', to='jobs.job')),
            ],
            options={
                'ordering': ['name', 'id'],
                'indexes': [models.Index(fields=['shared', 'name'], name='jobtemplate_shared_name')],
                'constraints': [models.UniqueConstraint(fields=('owner', 'name'), name='jobtemplate_unique_owner_name')],
            },
        ),
        migrations.RunPython(grant_operators, migrations.RunPython.noop),
    ]
