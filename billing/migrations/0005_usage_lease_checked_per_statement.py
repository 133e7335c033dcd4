"""A usage row's lease is checked once per statement instead of once per row (issue 16, docs/billing.md).

The foreign key from ``billing_allocationusage.lease_id`` to ``broker_lease`` ran one lookup and one row lock per
inserted usage row (8.7 M rows for a month of 10,000 GPUs): about a quarter of PostgreSQL's CPU per row. It is
replaced by triggers that keep what it guaranteed:

1. ``usage_lease_exists`` (after each INSERT or UPDATE statement on the usage table, over its new rows): every
   lease named exists, and is locked ``FOR KEY SHARE`` (as the foreign key's check locks it) until the
   transaction ends, so that it cannot be deleted before the rows are committed; otherwise a
   ``foreign_key_violation``;
2. ``lease_usage_protected`` (before a lease is deleted, or its id changed): refused with a
   ``foreign_key_violation`` while usage rows name it.

The project's index goes too: usage rows exist only for leases, and a project with leases cannot be deleted
(their ``PROTECT``), so the usage rows need not be looked up by project.
"""

import django.db.models.deletion
from django.db import migrations, models

SQL = r"""
CREATE FUNCTION billing_usage_lease_exists() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    missing bigint;
BEGIN
    SELECT named.lease_id INTO missing
      FROM (SELECT DISTINCT lease_id FROM new_rows) AS named
      LEFT JOIN LATERAL (SELECT l.id FROM broker_lease l WHERE l.id = named.lease_id FOR KEY SHARE) AS held ON true
     WHERE held.id IS NULL
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'usage names lease %, which does not exist', missing
          USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'usage_lease_exists';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER usage_lease_exists_insert AFTER INSERT ON billing_allocationusage
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION billing_usage_lease_exists();
CREATE TRIGGER usage_lease_exists_update AFTER UPDATE ON billing_allocationusage
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION billing_usage_lease_exists();

CREATE FUNCTION billing_lease_usage_protected() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM billing_allocationusage WHERE lease_id = OLD.id) THEN
        RAISE EXCEPTION 'lease % has metered usage, it cannot be deleted', OLD.id
          USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'lease_usage_protected';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER lease_usage_protected_delete BEFORE DELETE ON broker_lease
    FOR EACH ROW EXECUTE FUNCTION billing_lease_usage_protected();
CREATE TRIGGER lease_usage_protected_update BEFORE UPDATE OF id ON broker_lease
    FOR EACH ROW WHEN (OLD.id IS DISTINCT FROM NEW.id) EXECUTE FUNCTION billing_lease_usage_protected();
"""

REVERSE_SQL = r"""
DROP TRIGGER IF EXISTS lease_usage_protected_update ON broker_lease;
DROP TRIGGER IF EXISTS lease_usage_protected_delete ON broker_lease;
DROP FUNCTION IF EXISTS billing_lease_usage_protected();
DROP TRIGGER IF EXISTS usage_lease_exists_update ON billing_allocationusage;
DROP TRIGGER IF EXISTS usage_lease_exists_insert ON billing_allocationusage;
DROP FUNCTION IF EXISTS billing_usage_lease_exists();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0004_usage_lean_indexes_for_set_based_metering'),
        ('broker', '0008_workload_placements_ports_avoid'),
        ('tenants', '0003_slo_overlap_message'),
    ]

    operations = [
        migrations.AlterField(
            model_name='allocationusage',
            name='lease',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='usage', to='broker.lease'),
        ),
        migrations.AlterField(
            model_name='allocationusage',
            name='project',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='usage', to='tenants.project'),
        ),
        migrations.RunSQL(SQL, REVERSE_SQL),
    ]
