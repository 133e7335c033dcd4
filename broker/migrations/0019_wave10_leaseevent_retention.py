"""Lease events stay append-only, but the retention purge (``tenants.retention``) may delete old ones: the
trigger now runs ``gpubroker_append_only_but_purge()`` (tenants 0008), which refuses UPDATE always and DELETE
unless the purge's own transaction set ``gpubroker.retention_purge``."""

from django.db import migrations

SQL = """
DROP TRIGGER leaseevent_append_only ON broker_leaseevent;
CREATE TRIGGER leaseevent_append_only BEFORE UPDATE OR DELETE ON broker_leaseevent
    FOR EACH ROW EXECUTE FUNCTION gpubroker_append_only_but_purge();
"""

REVERSE = """
DROP TRIGGER leaseevent_append_only ON broker_leaseevent;
CREATE TRIGGER leaseevent_append_only BEFORE UPDATE OR DELETE ON broker_leaseevent
    FOR EACH ROW EXECUTE FUNCTION gpubroker_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0018_wave10_lease_labels"),
        ("tenants", "0008_wave10_audit_retention_scoped_tokens"),
    ]

    operations = [migrations.RunSQL(SQL, REVERSE)]
