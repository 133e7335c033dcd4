"""Rules kept by PostgreSQL that a constraint cannot say:

1. ``allocation_share_capacity``: the live shares of a GPU stay within 1000 milli and the GPU's memory.
   The trigger locks the GPU row first, so two transactions adding shares to one GPU serialise and the
   second one sees the first one's row.
2. ``leaseevent_append_only``: lease events cannot be updated or deleted (``gpubroker_append_only()``
   from tenants 0002).
"""

from django.db import migrations

SHARE_SQL = r"""
CREATE FUNCTION broker_check_share_capacity() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_memory integer;
    v_milli bigint;
    v_used_memory bigint;
BEGIN
    IF NEW.kind <> 'share' OR NEW.freed_at IS NOT NULL THEN
        RETURN NULL;
    END IF;
    SELECT memory_mib INTO v_memory FROM broker_gpu WHERE id = NEW.gpu_id FOR UPDATE;
    SELECT coalesce(sum(milli), 0), coalesce(sum(memory_mib), 0) INTO v_milli, v_used_memory
      FROM broker_allocation WHERE gpu_id = NEW.gpu_id AND kind = 'share' AND freed_at IS NULL;
    IF v_milli > 1000 OR v_used_memory > v_memory THEN
        RAISE EXCEPTION 'shares on GPU % exceed it: % milli, % of % MiB', NEW.gpu_id, v_milli, v_used_memory, v_memory
          USING ERRCODE = 'check_violation', CONSTRAINT = 'allocation_share_capacity';
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER allocation_share_capacity AFTER INSERT OR UPDATE ON broker_allocation
    FOR EACH ROW EXECUTE FUNCTION broker_check_share_capacity();

CREATE TRIGGER leaseevent_append_only BEFORE UPDATE OR DELETE ON broker_leaseevent
    FOR EACH ROW EXECUTE FUNCTION gpubroker_append_only();
"""

REVERSE = """
DROP TRIGGER IF EXISTS leaseevent_append_only ON broker_leaseevent;
DROP TRIGGER IF EXISTS allocation_share_capacity ON broker_allocation;
DROP FUNCTION IF EXISTS broker_check_share_capacity();
"""


class Migration(migrations.Migration):
    dependencies = [("broker", "0001_initial"), ("tenants", "0002_quota_bound_and_audit_triggers")]

    operations = [migrations.RunSQL(SHARE_SQL, REVERSE)]
