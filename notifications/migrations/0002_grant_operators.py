"""Operators read the delivery log in the admin: view permissions on notifications' models,
as ``core.roles.roles_sync`` grants them."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

MODELS = ["subscription", "event", "delivery", "deliveryattempt"]


def grant_operators(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    # Permissions are normally created after all migrations; the grant needs them now.
    app_config = apps.get_app_config("notifications")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    operators = Group.objects.filter(name="operators").first()
    if operators is not None:
        operators.permissions.add(
            *Permission.objects.filter(
                content_type__app_label="notifications",
                codename__in=[f"view_{model}" for model in MODELS],
            )
        )


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0001_initial"),
        ("controlplane", "0002_roles"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(grant_operators, migrations.RunPython.noop)]
