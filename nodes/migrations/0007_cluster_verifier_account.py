# Restore drills that count as proof run as a verifier account (drills.attestation).

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0006_cluster_extra_allowed_environment"),
    ]

    operations = [
        migrations.AddField(
            model_name="cluster",
            name="verifier_account",
            field=models.CharField(
                blank=True,
                help_text="Unix user that runs restore drills counting as proof: not the "
                "service account, not any researcher's. Empty: drills are self-attested (run "
                "as the owner).",
                max_length=32,
                validators=[
                    django.core.validators.RegexValidator(
                        "^[a-z_][a-z0-9_-]{0,31}$",
                        "Use a valid Unix user name (lower-case, at most 32).",
                    )
                ],
                verbose_name="drill verifier account",
            ),
        ),
        migrations.AddConstraint(
            model_name="cluster",
            constraint=models.CheckConstraint(
                condition=models.Q(verifier_account="")
                | ~models.Q(verifier_account=models.F("ssh_user")),
                name="cluster_verifier_not_service_account",
            ),
        ),
    ]
