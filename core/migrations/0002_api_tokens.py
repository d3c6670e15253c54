"""Personal API tokens (``core.ApiToken``): only a SHA-256 of each secret is stored.

Operators may see them in the admin (read-only, to revoke a leaked one): they get the view
permission here, as ``core.roles.roles_sync`` grants it.
"""

import django.db.models.deletion
from django.conf import settings
from django.contrib.auth.management import create_permissions
from django.db import migrations, models


def grant_operators(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    # Permissions are normally created after all migrations; the grant needs them now.
    app_config = apps.get_app_config("core")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    operators = Group.objects.filter(name="operators").first()
    if operators is not None:
        operators.permissions.add(
            *Permission.objects.filter(
                content_type__app_label="core",
                content_type__model="apitoken",
                codename="view_apitoken",
            )
        )


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0001_auditevent_from_controlplane'),
        ('controlplane', '0002_roles'),
        ('contenttypes', '0002_remove_content_type_name'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='ApiToken',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=64)),
                ('prefix', models.CharField(max_length=8)),
                ('key_hash', models.CharField(help_text='SHA-256 of the secret, hex', max_length=64, unique=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('expires_at', models.DateTimeField(blank=True, null=True)),
                ('last_used_at', models.DateTimeField(blank=True, null=True)),
                ('revoked_at', models.DateTimeField(blank=True, null=True)),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_tokens', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'verbose_name': 'API token',
                'ordering': ['-created_at', '-id'],
            },
        ),
        migrations.RunPython(grant_operators, migrations.RunPython.noop),
    ]
