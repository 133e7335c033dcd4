from django.db import migrations


class Migration(migrations.Migration):
    """The indexes named after the app's old label (fleet_adjus_…) take names of the capacity app's own."""

    dependencies = [("capacity", "0001_initial")]

    operations = [
        migrations.RenameIndex(model_name="adjustment", new_name="capacity_adj_state_kind",
                               old_name="fleet_adjus_state_505ede_idx"),
        migrations.RenameIndex(model_name="adjustment", new_name="capacity_adj_tenant_state",
                               old_name="fleet_adjus_tenant__804809_idx"),
    ]
