"""Operators map users to cluster accounts in the admin: every permission on
ClusterIdentity, as ``core.roles.roles_sync`` grants them (all of nodes' models)."""

from django.contrib.auth.management import create_permissions
from django.db import migrations


def grant_operators(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    # Permissions are normally created after all migrations; the grant needs them now.
    app_config = apps.get_app_config("nodes")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    operators = Group.objects.filter(name="operators").first()
    if operators is not None:
        operators.permissions.add(
            *Permission.objects.filter(
                content_type__app_label="nodes", content_type__model="clusteridentity"
            )
        )


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0004_cluster_identities"),
        ("controlplane", "0002_roles"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(grant_operators, migrations.RunPython.noop)]
