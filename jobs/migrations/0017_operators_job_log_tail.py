"""Operators hold every permission of the jobs app (``core.roles.roles_sync``): the new
log tail model's too."""

from django.db import migrations


def grant_operators(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

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
                content_type__app_label="jobs", content_type__model="joblogtail"
            )
        )


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0016_job_log_tail"),
        ("controlplane", "0002_roles"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(grant_operators, migrations.RunPython.noop)]
