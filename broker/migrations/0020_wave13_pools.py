"""A node's pool is a placement constraint now (issue 32 item 7: a project bound to pools is placed only in them),
so the scheduler's kept snapshot must learn when it changes: the node trigger of migration 0011 logs a change of
``pool`` too (besides its id, cordon and status)."""

from django.db import migrations

WITH_POOL = """
CREATE OR REPLACE FUNCTION broker_snapshot_node_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO broker_snapshotchange (xid, kind, key) SELECT pg_current_xact_id()::text::bigint, 'node', n.id
      FROM new_rows n;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO broker_snapshotchange (xid, kind, key) SELECT pg_current_xact_id()::text::bigint, 'node', o.id
      FROM old_rows o;
  ELSE
    INSERT INTO broker_snapshotchange (xid, kind, key) SELECT pg_current_xact_id()::text::bigint, 'node', n.id
      FROM new_rows n JOIN old_rows o ON o.id = n.id
      WHERE (o.node_id, o.cordoned, o.status, o.pool) IS DISTINCT FROM (n.node_id, n.cordoned, n.status, n.pool);
  END IF;
  RETURN NULL;
END $$;
"""
WITHOUT_POOL = """
CREATE OR REPLACE FUNCTION broker_snapshot_node_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO broker_snapshotchange (xid, kind, key) SELECT pg_current_xact_id()::text::bigint, 'node', n.id
      FROM new_rows n;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO broker_snapshotchange (xid, kind, key) SELECT pg_current_xact_id()::text::bigint, 'node', o.id
      FROM old_rows o;
  ELSE
    INSERT INTO broker_snapshotchange (xid, kind, key) SELECT pg_current_xact_id()::text::bigint, 'node', n.id
      FROM new_rows n JOIN old_rows o ON o.id = n.id
      WHERE (o.node_id, o.cordoned, o.status) IS DISTINCT FROM (n.node_id, n.cordoned, n.status);
  END IF;
  RETURN NULL;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("broker", "0019_wave10_leaseevent_retention")]

    operations = [migrations.RunSQL(WITH_POOL, WITHOUT_POOL)]
