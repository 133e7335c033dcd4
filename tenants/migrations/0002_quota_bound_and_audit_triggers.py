"""Rules that span rows, held by the database itself.

1. ``quota_within_tenant_quota``: for every tier, the sum of a tenant's project ``deserved`` stays
   within the tenant quota's ``deserved``, and no project ``limit`` exceeds the tenant ``limit``; a
   project quota needs a tenant quota for its tier. Checked after every write to either table. The
   trigger locks the tenant quota row, so two transactions racing to add project quotas serialise and
   the second one sees the first one's row.
2. ``auditevent_append_only``: audit events cannot be updated or deleted.
"""

from django.db import migrations

QUOTA_SQL = r"""
CREATE FUNCTION tenants_check_tenant_quota(p_tenant bigint, p_tier text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    bound RECORD;
    total bigint;
    widest bigint;
    n integer;
BEGIN
    SELECT deserved_gpu_milli, limit_gpu_milli INTO bound
      FROM tenants_tenantquota WHERE tenant_id = p_tenant AND tier = p_tier FOR UPDATE;
    SELECT count(*), COALESCE(sum(q.deserved_gpu_milli), 0), COALESCE(max(q.limit_gpu_milli), 0)
      INTO n, total, widest
      FROM tenants_quota q JOIN tenants_project p ON p.id = q.project_id
     WHERE p.tenant_id = p_tenant AND q.tier = p_tier;
    IF n = 0 THEN
        RETURN;
    END IF;
    IF bound IS NULL THEN
        RAISE EXCEPTION 'tenant % has project quotas for tier % but no tenant quota', p_tenant, p_tier
          USING ERRCODE = 'check_violation', CONSTRAINT = 'quota_within_tenant_quota';
    END IF;
    IF total > bound.deserved_gpu_milli THEN
        RAISE EXCEPTION 'projects of tenant % hold % milli-GPU deserved on %, above the tenant quota %',
            p_tenant, total, p_tier, bound.deserved_gpu_milli
          USING ERRCODE = 'check_violation', CONSTRAINT = 'quota_within_tenant_quota';
    END IF;
    IF widest > bound.limit_gpu_milli THEN
        RAISE EXCEPTION 'a project of tenant % has limit % on %, above the tenant limit %',
            p_tenant, widest, p_tier, bound.limit_gpu_milli
          USING ERRCODE = 'check_violation', CONSTRAINT = 'quota_within_tenant_quota';
    END IF;
END $$;

CREATE FUNCTION tenants_quota_bound_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    t_id bigint;
BEGIN
    IF TG_TABLE_NAME = 'tenants_quota' THEN
        IF TG_OP <> 'DELETE' THEN
            SELECT tenant_id INTO t_id FROM tenants_project WHERE id = NEW.project_id;
            PERFORM tenants_check_tenant_quota(t_id, NEW.tier);
        END IF;
        IF TG_OP = 'UPDATE' AND (OLD.tier <> NEW.tier OR OLD.project_id <> NEW.project_id) THEN
            SELECT tenant_id INTO t_id FROM tenants_project WHERE id = OLD.project_id;
            PERFORM tenants_check_tenant_quota(t_id, OLD.tier);
        END IF;
    ELSE
        IF TG_OP <> 'DELETE' THEN
            PERFORM tenants_check_tenant_quota(NEW.tenant_id, NEW.tier);
        END IF;
        IF TG_OP <> 'INSERT' THEN
            PERFORM tenants_check_tenant_quota(OLD.tenant_id, OLD.tier);
        END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER quota_within_tenant_quota
    AFTER INSERT OR UPDATE ON tenants_quota
    DEFERRABLE INITIALLY IMMEDIATE
    FOR EACH ROW EXECUTE FUNCTION tenants_quota_bound_trigger();

CREATE CONSTRAINT TRIGGER tenantquota_covers_projects
    AFTER UPDATE OR DELETE ON tenants_tenantquota
    DEFERRABLE INITIALLY IMMEDIATE
    FOR EACH ROW EXECUTE FUNCTION tenants_quota_bound_trigger();

CREATE FUNCTION tenants_project_tenant_fixed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.tenant_id <> OLD.tenant_id THEN
        RAISE EXCEPTION 'a project cannot move to another tenant'
          USING ERRCODE = 'check_violation', CONSTRAINT = 'project_tenant_immutable';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER project_tenant_immutable BEFORE UPDATE OF tenant_id ON tenants_project
    FOR EACH ROW EXECUTE FUNCTION tenants_project_tenant_fixed();
"""

QUOTA_REVERSE = """
DROP TRIGGER IF EXISTS project_tenant_immutable ON tenants_project;
DROP FUNCTION IF EXISTS tenants_project_tenant_fixed();
DROP TRIGGER IF EXISTS tenantquota_covers_projects ON tenants_tenantquota;
DROP TRIGGER IF EXISTS quota_within_tenant_quota ON tenants_quota;
DROP FUNCTION IF EXISTS tenants_quota_bound_trigger();
DROP FUNCTION IF EXISTS tenants_check_tenant_quota(bigint, text);
"""

AUDIT_SQL = """
CREATE FUNCTION gpubroker_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
      USING ERRCODE = 'check_violation', CONSTRAINT = TG_TABLE_NAME || '_append_only';
END $$;

CREATE TRIGGER auditevent_append_only BEFORE UPDATE OR DELETE ON tenants_auditevent
    FOR EACH ROW EXECUTE FUNCTION gpubroker_append_only();
"""

AUDIT_REVERSE = """
DROP TRIGGER IF EXISTS auditevent_append_only ON tenants_auditevent;
DROP FUNCTION IF EXISTS gpubroker_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]

    operations = [
        migrations.RunSQL(QUOTA_SQL, QUOTA_REVERSE),
        migrations.RunSQL(AUDIT_SQL, AUDIT_REVERSE),
    ]
