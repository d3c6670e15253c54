"""Create the two roles and give them their model-level permissions.

researchers: see the inventory; create, see and act on jobs and drills (services and
selectors narrow this to their own jobs). operators: everything on Gantry's models,
and reading the audit log, which nobody may edit.
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations

GANTRY_APPS = ("controlplane", "nodes", "jobs")

RESEARCHER_PERMISSIONS = [
    "nodes.view_cluster",
    "nodes.view_partition",
    "nodes.view_node",
    "nodes.view_gpu",
    "nodes.view_switch",
    "nodes.view_link",
    "nodes.view_nodeevent",
    "jobs.add_job",
    "jobs.view_job",
    "jobs.change_job",
    "jobs.view_jobevent",
    "jobs.view_metricpoint",
    "jobs.view_checkpoint",
    "jobs.add_restoredrill",
    "jobs.view_restoredrill",
    "jobs.change_restoredrill",
]


def create_roles(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    # Permissions are normally created after all migrations; the roles need them now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None

    def permission(dotted):
        app_label, codename = dotted.split(".")
        return Permission.objects.get(content_type__app_label=app_label, codename=codename)

    researchers, _ = Group.objects.get_or_create(name="researchers")
    researchers.permissions.set([permission(p) for p in RESEARCHER_PERMISSIONS])

    operators, _ = Group.objects.get_or_create(name="operators")
    operator_permissions = list(
        Permission.objects.filter(content_type__app_label__in=["nodes", "jobs"])
    )
    operator_permissions.append(permission("controlplane.view_auditevent"))
    # It also granted authtoken.view_token, and depended on DRF's authtoken app, until that
    # app was retired (core 0004 converts its keys): a migration may not depend on an app
    # that is not installed. Databases migrated before keep that grant, of a permission
    # nothing checks any more.
    operators.permissions.set(operator_permissions)


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=["researchers", "operators"]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0001_initial"),
        ("nodes", "0001_initial"),
        ("jobs", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_roles, remove_roles)]
