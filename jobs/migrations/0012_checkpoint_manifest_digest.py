from django.db import migrations, models

from trainer.schema import manifest_digest


def backfill_manifest_digests(apps, schema_editor):
    """Registered checkpoints keep the manifest Gantry read (less its fingerprint, which is
    also left out of the digest): its digest is the one registration stores now. A row
    without a usable manifest stays empty (unknown: only its step is held)."""
    Checkpoint = apps.get_model("jobs", "Checkpoint")
    rows = Checkpoint.objects.filter(manifest_digest="").only("id", "step", "manifest")
    changed = []
    for checkpoint in rows.iterator(chunk_size=500):
        manifest = checkpoint.manifest
        if not isinstance(manifest, dict) or manifest.get("step") != checkpoint.step:
            continue
        checkpoint.manifest_digest = manifest_digest(manifest)
        changed.append(checkpoint)
        if len(changed) >= 500:
            Checkpoint.objects.bulk_update(changed, ["manifest_digest"])
            changed = []
    Checkpoint.objects.bulk_update(changed, ["manifest_digest"])


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0011_job_event_kinds"),
    ]

    operations = [
        migrations.AddField(
            model_name="checkpoint",
            name="manifest_digest",
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.RunPython(backfill_manifest_digests, migrations.RunPython.noop),
    ]
