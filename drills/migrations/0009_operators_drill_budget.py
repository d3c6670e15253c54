"""Operators hold every permission of the drills app (``core.roles.roles_sync``): the drill
budget's too, so they edit it in the admin."""

from django.db import migrations


def grant_operators(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    # Permissions are normally created after all migrations; the grant needs them now.
    app_config = apps.get_app_config("drills")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    operators = Group.objects.filter(name="operators").first()
    if operators is not None:
        operators.permissions.add(
            *Permission.objects.filter(
                content_type__app_label="drills", content_type__model="drillbudget"
            )
        )


class Migration(migrations.Migration):
    dependencies = [
        ("drills", "0008_drill_budget"),
        ("controlplane", "0002_roles"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(grant_operators, migrations.RunPython.noop)]
