"""Open proposals are keyed by their decision, not its details (``capacity.services.common.proposal_identity``):
the open rows get the new fingerprint, so the loop's next run refreshes them instead of expiring them and
making them anew. Where two open rows are now the same decision the newest stays open and the others expire
(the partial unique index allows one open row per fingerprint). Decided rows keep their fingerprint: they
only hold back a rejected proposal, and one rejected under the old key is proposed again at most once."""

import hashlib
import json

from django.db import migrations


def _identity(kind: str, target: str, change: dict, risk: list) -> dict:
    # a copy of capacity.services.common.proposal_identity as of this migration (migrations do not import services)
    if kind == "warm_pool":
        what = {"grow": int(change.get("size_after", 0)) > int(change.get("size_before", 0))}
    elif kind in ("mode_switch", "mig_layout"):
        what = {"to_mode": change.get("to_mode", ""), "drain": sorted(str(r) for r in risk)}
    elif kind == "idle_reclaim":
        what = {"step": change.get("step", "")}
    elif kind == "right_size":
        what = {"model": change.get("model", ""), "profile": change.get("profile", "")}
    elif kind == "quota_advice":
        what = {"raise": int(change.get("size_after", 0)) > int(change.get("size_before", 0))}
    else:
        what = {"change": change}
    body = {"kind": kind, "target": target, **what}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def rekey_open_rows(apps, schema_editor):
    from django.utils import timezone

    Adjustment = apps.get_model("capacity", "Adjustment")
    now = timezone.now()
    keyed: dict[int, str] = {}
    # applying rows first (they cannot be expired), then the newest proposed
    rows = sorted(Adjustment.objects.filter(state__in=("proposed", "applying")),
                  key=lambda r: (r.state != "applying", -r.last_seen_at.timestamp(), -r.pk))
    for row in rows:
        key = _identity(row.kind, row.target, row.change or {}, row.risk or [])
        if key not in keyed.values():
            keyed[row.pk] = key
        elif row.state == "proposed":
            Adjustment.objects.filter(pk=row.pk).update(
                state="expired", finished_at=now, outcome="the same decision as a newer open proposal")
        # a second applying row of the same decision keeps its old key until it finishes
    for pk, key in keyed.items():  # after the duplicates left the open states: the unique index holds
        Adjustment.objects.filter(pk=pk).update(fingerprint=key)


class Migration(migrations.Migration):
    dependencies = [("capacity", "0003_adjustment_priced_with")]

    operations = [migrations.RunPython(rekey_open_rows, migrations.RunPython.noop)]
