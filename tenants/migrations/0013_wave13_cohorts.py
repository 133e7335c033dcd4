"""Issue 32 item 7: cohorts of tenants that lend each other their idle guarantee (``Cohort``, ``Tenant.cohort``, the
lending and borrowing limits on ``TenantQuota``), a project's node pools (``Project.pools``) and a contract's minimum
runtime before reclaim (``SloContract.min_runtime_seconds``). docs/scheduling.md, "Cohorts, node pools and minimum
runtime"."""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0012_wave13_suspend_opt_out"),
    ]

    operations = [
        migrations.AddField(
            model_name="project",
            name="pools",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=63), blank=True, db_default=[], default=list, size=None),
        ),
        migrations.AddField(
            model_name="slocontract",
            name="min_runtime_seconds",
            field=models.PositiveIntegerField(
                blank=True, null=True,
                help_text="Over-quota leases are not reclaimed before this runtime; empty: the platform's minimum "
                          "runtime."),
        ),
        migrations.AddField(
            model_name="tenantquota",
            name="borrowing_limit_gpu_milli",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="tenantquota",
            name="lending_limit_gpu_milli",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="Cohort",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.SlugField(max_length=63, unique=True)),
                ("description", models.CharField(blank=True, default="", max_length=200)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "ordering": ["name"],
                "constraints": [models.CheckConstraint(
                    condition=models.Q(("name__regex", "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")),
                    name="cohort_name_format")],
            },
        ),
        migrations.AddField(
            model_name="tenant",
            name="cohort",
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT,
                                    related_name="members", to="tenants.cohort"),
        ),
    ]
