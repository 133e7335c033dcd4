# Live topology and host resources (issue 32 item 4): a node's host CPU and memory as its agent reports them, and
# a lease's host CPU and memory per GPU unit. The snapshot's change log (0011) learns of a node whose host changed.

from django.db import migrations, models

XID = "pg_current_xact_id()::text::bigint"


def _node_trigger(columns: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION broker_snapshot_node_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO broker_snapshotchange (xid, kind, key) SELECT {XID}, 'node', n.id FROM new_rows n;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO broker_snapshotchange (xid, kind, key) SELECT {XID}, 'node', o.id FROM old_rows o;
  ELSE
    INSERT INTO broker_snapshotchange (xid, kind, key) SELECT {XID}, 'node', n.id
      FROM new_rows n JOIN old_rows o ON o.id = n.id
      WHERE ({", ".join(f"o.{c}" for c in columns.split())}) IS DISTINCT FROM ({", ".join(f"n.{c}" for c in columns.split())});
  END IF;
  RETURN NULL;
END $$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('broker', '0019_wave10_leaseevent_retention'),
    ]

    operations = [
        migrations.AddField(
            model_name='lease',
            name='cpu_milli_per_unit',
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='lease',
            name='host_memory_mib_per_unit',
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='node',
            name='host_cpu_milli',
            field=models.PositiveBigIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='node',
            name='host_memory_mib',
            field=models.PositiveBigIntegerField(db_default=0, default=0),
        ),
        migrations.RunSQL(_node_trigger("node_id cordoned status host_cpu_milli host_memory_mib"),
                          reverse_sql=_node_trigger("node_id cordoned status")),
    ]
