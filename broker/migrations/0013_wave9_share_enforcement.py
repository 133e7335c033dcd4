"""Whether a shared GPU's limits hold (issue 28): ``Gpu.share_enforcement`` (``mps`` | ``none``) and its reason, as
the node's agent reports them in its inventory. Rows from before: ``none`` until their agent says otherwise."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("broker", "0012_workload_secret_env")]

    operations = [
        migrations.AddField(
            model_name="gpu", name="share_enforcement",
            field=models.CharField(choices=[("mps", "Enforced by MPS"), ("none", "Not enforced")], default="none",
                                   max_length=8)),
        migrations.AddField(
            model_name="gpu", name="share_enforcement_reason",
            field=models.CharField(blank=True, default="its agent has not reported share enforcement",
                                   max_length=300)),
    ]
