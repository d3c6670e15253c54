# Who attested a drill (drills.attestation). Every drill before this ran as the checkpoint's
# owner, who wrote its report: they are self-attested, and the proofs they gave
# (Checkpoint.last_proven_at) no longer stand. A verifier-attested drill proves again.

from django.db import migrations, models


def withdraw_self_attested_proofs(apps, schema_editor):  # type: ignore[no-untyped-def]
    # We cannot know which earlier passes were honest: their reports were the owner's.
    checkpoint = apps.get_model("jobs", "Checkpoint")
    checkpoint.objects.filter(last_proven_at__isnull=False).update(last_proven_at=None)


class Migration(migrations.Migration):
    dependencies = [
        ("drills", "0005_drill_trigger_recovery"),
    ]

    operations = [
        migrations.AddField(
            model_name="restoredrill",
            name="attestation",
            field=models.CharField(
                choices=[
                    ("verifier", "verifier-attested (run as an account the owner cannot act as)"),
                    ("self", "self-attested (run as the checkpoint's owner; not proof)"),
                ],
                default="self",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="restoredrill",
            name="verifier_account",
            field=models.CharField(blank=True, max_length=32),
        ),
        migrations.AddConstraint(
            model_name="restoredrill",
            constraint=models.CheckConstraint(
                condition=models.Q(attestation="self")
                | (models.Q(attestation="verifier") & ~models.Q(verifier_account="")),
                name="drill_verifier_attested_names_its_verifier",
            ),
        ),
        migrations.RunPython(withdraw_self_attested_proofs, migrations.RunPython.noop),
    ]
