"""Turn every DRF authtoken key into a personal API token of the same user, then delete it.

Gantry had two token systems: its own (``core.ApiToken``, only a hash kept) and DRF's
``rest_framework.authtoken`` (keys kept in plain text, made by operators in the admin).
DRF's is retired. Each of its keys becomes an ``ApiToken`` flagged ``legacy`` whose hash is
the key's, so a client that sends ``Authorization: Token <key>`` goes on working with the
key it has; the key itself is then deleted, so the plain text is stored nowhere any more.

The DRF app is not installed any more, so its model is not in the migration state: the
table is read by name, and only when it exists (a database created after the retirement
never had it). The empty table and DRF's rows in ``django_migrations`` are left as they
are: they belong to DRF's migrations, and dropping the table behind them would leave those
records wrong if the app were ever installed again.

Not reversible in substance: only hashes are kept, so the DRF keys cannot be written back.
Going back keeps the converted tokens (they still work with the code of this migration).
"""

import hashlib
from datetime import timezone

from django.conf import settings
from django.db import migrations

DRF_TABLE = "authtoken_token"
# The name a person sees on their tokens page (at most 64 characters).
CONVERTED_NAME = "API key made in the admin (converted)"
# As core.models.ApiToken.LEGACY_SHOWN_PREFIX_LENGTH (a migration keeps its own copy).
SHOWN_PREFIX_LENGTH = 4


def convert_drf_tokens(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if DRF_TABLE not in connection.introspection.table_names(cursor):
            return
        quote = connection.ops.quote_name
        # Fixed identifiers only; no value comes from outside.
        cursor.execute(
            f"SELECT {quote('key')}, {quote('user_id')}, {quote('created')} "
            f"FROM {quote(DRF_TABLE)}"
        )
        rows = cursor.fetchall()
    ApiToken = apps.get_model("core", "ApiToken")
    for key, user_id, created in rows:
        # SQLite hands back the stored UTC time without its zone.
        if created is not None and created.tzinfo is None:
            created = created.replace(tzinfo=timezone.utc)
        # As core.models.ApiToken.hash_secret.
        key_hash = hashlib.sha256(key.encode()).hexdigest()
        token, made = ApiToken.objects.get_or_create(
            key_hash=key_hash,
            defaults={
                "user_id": user_id,
                "name": CONVERTED_NAME,
                "prefix": key[:SHOWN_PREFIX_LENGTH],
                "legacy": True,
            },
        )
        if made and created is not None:
            # created_at is auto_now_add: the key's own age is set after the insert.
            ApiToken.objects.filter(pk=token.pk).update(created_at=created)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {connection.ops.quote_name(DRF_TABLE)}")


class Migration(migrations.Migration):
    # No dependency on DRF's authtoken migrations: the app is not installed. Where the
    # table exists they ran long ago; where they never ran there is nothing to convert.
    dependencies = [
        ("core", "0003_apitoken_legacy"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [migrations.RunPython(convert_drf_tokens, migrations.RunPython.noop)]
