from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("broker", "0014_wave9_node_isolation"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="workload_roots",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
