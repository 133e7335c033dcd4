"""The price book a saving was priced at becomes a field; the saving was written into a right-sizing's
``reason`` ("… would have fitted and saved 86.40 USD at the prices of acme contract", or "… and saved 8640 USD
minor units" as the planner priced it). Those rows get a reason without the saving (it is
``gain_money_minor``) and, where their evidence names the book, the field."""

from django.db import migrations, models


def move_saving_out_of_reason(apps, schema_editor):
    Adjustment = apps.get_model("capacity", "Adjustment")
    for row in Adjustment.objects.filter(kind="right_size", reason__contains=" and saved ").iterator():
        row.priced_with = str(row.evidence.get("priced_with", ""))[:200]
        row.reason = row.reason.split(" and saved ")[0]
        row.save(update_fields=["priced_with", "reason"])


class Migration(migrations.Migration):

    dependencies = [
        ('capacity', '0002_index_names'),
    ]

    operations = [
        migrations.AddField(
            model_name='adjustment',
            name='priced_with',
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.RunPython(move_saving_out_of_reason, migrations.RunPython.noop),
    ]
