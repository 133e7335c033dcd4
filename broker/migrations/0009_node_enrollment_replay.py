from django.db import migrations, models


class Migration(migrations.Migration):
    """A lost enrollment answer can be asked for again: the enrollment key, and when the secret was first used."""

    dependencies = [("broker", "0008_workload_placements_ports_avoid")]

    operations = [
        migrations.AddField(model_name="node", name="enrollment_key",
                            field=models.CharField(blank=True, default="", db_default="", max_length=64)),
        migrations.AddField(model_name="node", name="secret_used_at",
                            field=models.DateTimeField(blank=True, null=True)),
    ]
