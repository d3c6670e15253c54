"""RestoreDrill and DrillPolicy move from the jobs app to drills; tables and rows stay.

State only: the tables ``jobs_restoredrill`` and ``jobs_drillpolicy`` were created by jobs
0001 and keep their names (``db_table``). The content types are renamed, so the
permissions granted on them (researchers may start and see drills) keep their grants.
"""

import uuid

import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from core.contenttypes import move_content_types


def move_to_drills(apps, schema_editor):
    move_content_types(apps, "jobs", "drills", ["restoredrill", "drillpolicy"])


def move_back_to_jobs(apps, schema_editor):
    move_content_types(apps, "drills", "jobs", ["restoredrill", "drillpolicy"])


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("jobs", "0003_job_throughput_now"),
        ("nodes", "0001_initial"),
        ("controlplane", "0002_roles"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("auth", "0012_alter_user_first_name_max_length"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='DrillPolicy',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('enabled', models.BooleanField(default=False)),
                        ('running_every_hours', models.FloatField(blank=True, help_text='Drill the newest checkpoint of every running job this often; empty: never.', null=True, validators=[django.core.validators.MinValueValidator(0.01)])),
                        ('drill_final_checkpoint', models.BooleanField(default=False, help_text="Drill each job's final checkpoint when it completes.")),
                        ('max_in_flight', models.PositiveSmallIntegerField(default=2, help_text='At most this many drills at once.', validators=[django.core.validators.MinValueValidator(1)])),
                        ('steps', models.PositiveIntegerField(default=5, validators=[django.core.validators.MinValueValidator(1)])),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('final_since', models.DateTimeField(blank=True, null=True)),
                        ('cluster', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='drill_policy', to='nodes.cluster')),
                        ('updated_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'jobs_drillpolicy',
                        'verbose_name_plural': 'drill policies',
                    },
                ),
                migrations.CreateModel(
                    name='RestoreDrill',
                    fields=[
                        ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('steps', models.PositiveIntegerField(default=5, validators=[django.core.validators.MinValueValidator(1)])),
                        ('allocation', models.JSONField(default=dict, help_text='nodes, gpus_per_node, tasks_per_node, partition')),
                        ('allocation_key', models.CharField(help_text='Canonical form of the allocation, for duplicate checks.', max_length=255)),
                        ('state', models.CharField(choices=[('queued', 'Queued'), ('submitting', 'Submitting'), ('pending', 'Pending'), ('running', 'Running'), ('finished', 'Finished'), ('cancelled', 'Cancelled')], default='queued', max_length=16)),
                        ('verdict', models.CharField(blank=True, choices=[('passed', 'Passed'), ('failed', 'Failed'), ('error', 'error (the drill could not run; not a verdict on the checkpoint)')], max_length=16)),
                        ('reason', models.TextField(blank=True)),
                        ('reason_code', models.CharField(blank=True, max_length=64)),
                        ('evidence', models.JSONField(blank=True, null=True)),
                        ('slurm_job_id', models.CharField(blank=True, max_length=32)),
                        ('trigger', models.CharField(choices=[('manual', 'Manual'), ('policy_running', 'policy: newest checkpoint of a running job'), ('policy_final', 'policy: final checkpoint of a completed job')], default='manual', max_length=16)),
                        ('submit_attempts', models.PositiveSmallIntegerField(default=0)),
                        ('submit_lease_until', models.DateTimeField(blank=True, null=True)),
                        ('last_seen_in_slurm_at', models.DateTimeField(blank=True, null=True)),
                        ('exit_code', models.IntegerField(blank=True, null=True)),
                        ('integrity_s', models.FloatField(blank=True, null=True)),
                        ('load_s', models.FloatField(blank=True, null=True)),
                        ('steps_s', models.FloatField(blank=True, null=True)),
                        ('queue_wait_s', models.FloatField(blank=True, null=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('submitted_at', models.DateTimeField(blank=True, null=True)),
                        ('started_at', models.DateTimeField(blank=True, null=True)),
                        ('finished_at', models.DateTimeField(blank=True, null=True)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('checkpoint', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='drills', to='jobs.checkpoint')),
                        ('cluster', models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name='restore_drills', to='nodes.cluster')),
                        ('requested_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='restore_drills', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'jobs_restoredrill',
                        'ordering': ['-created_at'],
                    },
                ),
                migrations.AddIndex(
                    model_name='restoredrill',
                    index=models.Index(fields=['cluster', 'state'], name='drill_cluster_state'),
                ),
                migrations.AddIndex(
                    model_name='restoredrill',
                    index=models.Index(fields=['state', '-created_at'], name='drill_state_created'),
                ),
                migrations.AddIndex(
                    model_name='restoredrill',
                    index=models.Index(fields=['verdict', '-finished_at'], name='drill_verdict_finished'),
                ),
                migrations.AddConstraint(
                    model_name='restoredrill',
                    constraint=models.UniqueConstraint(condition=models.Q(('state__in', ['queued', 'submitting', 'pending', 'running'])), fields=('checkpoint', 'allocation_key'), name='drill_one_active_per_checkpoint_allocation'),
                ),
                migrations.AddConstraint(
                    model_name='restoredrill',
                    constraint=models.CheckConstraint(condition=models.Q(('verdict', ''), ('state__in', ['finished', 'cancelled']), _connector='OR'), name='drill_verdict_only_when_finished'),
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(move_to_drills, move_back_to_jobs),
    ]
