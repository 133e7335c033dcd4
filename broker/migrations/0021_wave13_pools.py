"""A node's pool is a placement constraint now (issue 32 item 7: a project bound to pools is placed only in them),
so the scheduler's kept snapshot must learn when it changes: the node trigger (0011, widened by 0020 to the host's
CPU and memory) logs a change of ``pool`` too."""

from importlib import import_module

from django.db import migrations

node_trigger = import_module("broker.migrations.0020_wave13_topology")._node_trigger  # the same function, wider


class Migration(migrations.Migration):
    dependencies = [("broker", "0020_wave13_topology")]

    operations = [migrations.RunSQL(node_trigger("node_id cordoned status host_cpu_milli host_memory_mib pool"),
                                    reverse_sql=node_trigger("node_id cordoned status host_cpu_milli host_memory_mib"))]
