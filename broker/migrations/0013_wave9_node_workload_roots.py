from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("broker", "0012_workload_secret_env"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="workload_roots",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
