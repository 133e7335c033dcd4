"""Time to meter and invoice one month: 1,000 tenants and 10,000 GPUs; and the hourly metering run at 100,000 GPUs.

    .venv/bin/python bench/billing.py                 # month close: 1,000 tenants, 1,250 nodes x 8 GPUs, 31 days
    .venv/bin/python bench/billing.py --quick         # the same at 100 tenants, 400 GPUs (under 2 minutes)
    .venv/bin/python bench/billing.py --hourly        # one hour's metering at 12,500 nodes x 8 = 100,000 GPUs
    options: --tenants N --nodes N --days N --seed N --workers N (metering connections at once)
             --no-taxes-credits (tax rates and prepaid credit grants are on by default: issue 33)

Builds, in a scratch database (``<DATABASE_URL's database>_bench_billing``, dropped and created again), a
history of lease events on ``--nodes`` x 8 H100s: whole GPUs (three in four) run one lease after another,
MIG GPUs two ``3g.40gb`` slices side by side; each lease lasts 1–24 h with 0–4 h gaps and belongs to a
random tenant (one project each), a tenth over quota, a tenth interactive; every tenant has a tax rate (a tenth
a second, inclusive one; a twentieth is reverse-charged) and a prepaid credit grant; three leases in four carry cost
allocation labels (``team`` and ``cost-center``, issue 33), which metering copies into every usage row. Rows are
written with COPY (not timed). Then it times, in this process:

- month close: (1) allocation metering of every hour of the month (``usage_meter_window``), (2) ``invoice_run``
  for the month (SLO evaluation, pricing, lines, totals and finalization per tenant), then a re-run of both
  (which must change nothing);
- ``--hourly``: the allocation metering of the history's last hour, as the hourly run does it, with the hour
  before it already metered (so the table and its indexes are not empty).

Wall seconds depend on what else the machine runs; CPU seconds do much less, so both are printed: this
process (user + system) and PostgreSQL (the backends connected to the scratch database, sampled from
/proc every 0.1 s; the server's shared processes are not counted), and CPU µs per lease-hour row.
Results: ``bench/results/billing.json`` and ``billing_hourly.json`` through bench.record (``--quick``: in
``bench/results/quick/``).
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.record import write  # noqa: E402
from infra import services  # noqa: E402

MODEL = "H100-80GB"
HOUR = timedelta(hours=1)


def copy_rows(cursor, table: str, columns: list[str], rows) -> int:
    buffer = io.StringIO()
    count = 0
    for row in rows:
        buffer.write("\t".join("\\N" if v is None else str(v) for v in row) + "\n")
        count += 1
    buffer.seek(0)
    with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        while chunk := buffer.read(1 << 20):
            copy.write(chunk)
    return count


def build(args, url: str) -> dict:
    import psycopg

    rng = random.Random(args.seed)
    start = datetime(2026, 10, 1, tzinfo=UTC)
    end = start + timedelta(days=args.days)
    created = datetime(2026, 9, 1, tzinfo=UTC).isoformat()
    counts = {}
    with psycopg.connect(url, autocommit=False) as connection, connection.cursor() as cursor:
        counts["tenants"] = copy_rows(cursor, "tenants_tenant", [
            "id", "name", "slug", "status", "billing_email", "currency", "created_at", "updated_at"],
            ((i, f"Tenant {i}", f"t{i:05d}", "active", f"billing@t{i}.example", "USD", created, created)
             for i in range(1, args.tenants + 1)))
        copy_rows(cursor, "tenants_project", ["id", "tenant_id", "slug", "name", "description", "created_at"],
                  ((i, i, "main", "Main", "", created) for i in range(1, args.tenants + 1)))
        copy_rows(cursor, "broker_node", ["id", "node_id", "pool", "address", "hostname", "secret", "agent_version",
                                          "status", "cordoned", "enrolled_at"],
                  ((n, f"node-{n:05d}", "default", f"http://127.0.0.1:9/n/{n}", f"node-{n:05d}", "x" * 32, "0.1.0",
                    "ready", False, created) for n in range(1, args.nodes + 1)))
        gpus = [(g, (g - 1) // 8 + 1, f"GPU-bench-{g:06d}", (g - 1) % 8, MODEL, "mig" if g % 4 == 0 else "whole",
                 81559, "", None, "") for g in range(1, args.nodes * 8 + 1)]
        counts["gpus"] = copy_rows(cursor, "broker_gpu", ["id", "node_id", "uuid", "index", "model", "mode",
                                                          "memory_mib", "nvlink_domain", "lost_at", "mode_target"],
                                   gpus)
        leases, allocations, events = [], [], []
        lease_id = allocation_id = event_id = 0
        for gpu in gpus:
            tracks = [(0, 8)] if gpu[5] == "whole" else [(0, 4), (4, 4)]  # 3g.40gb holds 4 memory slots
            for slot, size in tracks:
                cursor_at = start - timedelta(hours=rng.uniform(0, 12))
                while cursor_at < end:
                    begin = cursor_at + timedelta(seconds=rng.uniform(0, 4 * 3600))
                    length = timedelta(seconds=rng.uniform(3600, 24 * 3600))
                    finish = begin + length
                    lease_id += 1
                    tenant = rng.randint(1, args.tenants)
                    over = rng.random() < 0.1
                    klass = "interactive" if rng.random() < 0.1 else "training"
                    requested = begin - timedelta(seconds=rng.uniform(1, 120))
                    done = finish < end + timedelta(days=1)
                    kind = "whole" if gpu[5] == "whole" else "mig"
                    profile = "" if kind == "whole" else "3g.40gb"
                    milli, memory = (1000, 81559) if kind == "whole" else (428, 40320)
                    labels = (f'{{"team": "team-{tenant % 8}", "cost-center": "cc-{rng.randint(1, 20)}"}}'
                              if rng.random() < 0.75 else "{}")
                    leases.append((lease_id, tenant, tenant, "released" if done else "active", "", kind, 1,
                                   "{" + MODEL + "}", profile, 0, 0, True, klass, 0, int(length.total_seconds()) + 1,
                                   MODEL, over, requested.isoformat(), requested.isoformat(), begin.isoformat(),
                                   finish.isoformat(), finish.isoformat() if done else None, "", "", "{}", "[]",
                                   labels))
                    allocation_id += 1
                    allocations.append((allocation_id, lease_id, gpu[0], MODEL, kind, profile,
                                        slot if kind == "mig" else None,
                                        f"[{slot},{slot + size})" if kind == "mig" else "[0,8)", milli,
                                        memory, over, "freed" if done else "ready", "", None, "{}",
                                        begin.isoformat(), begin.isoformat(), finish.isoformat() if done else None))
                    trail = [("", "requested", requested, "user:bench"), ("requested", "queued", requested, "broker"),
                             ("queued", "provisioning", begin - timedelta(seconds=1), "scheduler"),
                             ("provisioning", "active", begin, "worker")]
                    if done:
                        trail += [("active", "releasing", finish, "user:bench"),
                                  ("releasing", "released", finish, "worker")]
                    for from_state, to_state, at, actor in trail:
                        event_id += 1
                        events.append((event_id, lease_id, from_state, to_state, "bench", actor, at.isoformat()))
                    cursor_at = finish
        counts["leases"] = copy_rows(cursor, "broker_lease", [
            "id", "tenant_id", "project_id", "state", "reason", "kind", "count", "models_allowed", "profile", "milli",
            "memory_mib", "gang", "workload_class", "priority", "duration_seconds", "tier", "over_quota",
            "requested_at", "queued_at", "active_at", "ends_at", "finished_at", "idempotency_key", "request_hash",
            "access_extra", "avoid_nodes", "labels"],
            leases)
        counts["labelled_leases"] = sum(1 for lease in leases if lease[-1] != "{}")
        counts["allocations"] = copy_rows(cursor, "broker_allocation", [
            "id", "lease_id", "gpu_id", "tier", "kind", "mig_profile", "mig_start", "slots", "milli", "memory_mib",
            "preemptible", "state", "device_uuid", "gpu_instance_id", "access", "created_at", "ready_at", "freed_at"],
            allocations)
        counts["events"] = copy_rows(cursor, "broker_leaseevent", ["id", "lease_id", "from_state", "to_state",
                                                                   "reason", "actor", "at"], events)
        if args.taxes_credits:
            # issue 33: every tenant's invoice carries tax lines (an exclusive rate; every tenth an inclusive one
            # too; every twentieth reverse-charged) and draws a prepaid credit grant at finalisation
            copy_rows(cursor, "billing_taxrate", ["tenant_id", "jurisdiction", "name", "percentage", "inclusive",
                                                  "active", "created_at", "stripe_tax_rate_id"],
                      [(i, "US-CA", "Sales tax", "7.2500", False, True, created, "")
                       for i in range(1, args.tenants + 1)]
                      + [(i, "US", "Levy", "2.0000", True, True, created, "")
                         for i in range(10, args.tenants + 1, 10)])
            copy_rows(cursor, "billing_taxprofile", ["tenant_id", "tax_id", "reverse_charge", "legal_note"],
                      ((i, f"EU{i:09d}", True, "Reverse charge: VAT due by the recipient") for i in
                       range(20, args.tenants + 1, 20)))
            counts["credit_grants"] = copy_rows(
                cursor, "billing_creditgrant", ["tenant_id", "currency", "amount_minor", "priority", "expires_at",
                                                "granted_at", "reason"],
                ((i, "USD", rng.randint(1, 500_000), 0, None, created, "bench prepaid") for i in
                 range(1, args.tenants + 1)))
        for table in ("tenants_tenant", "tenants_project", "broker_node", "broker_gpu", "broker_lease",
                      "broker_allocation", "broker_leaseevent"):
            sql = f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"  # noqa: S608
            cursor.execute(sql)
        connection.commit()
        cursor.execute("ANALYZE")
    return counts


class Backends:
    """CPU seconds (user + system) of the PostgreSQL backends connected to ``database``: every process whose
    title names it, sampled every 0.1 s, so that backends which come and go (metering workers) count too."""

    def __init__(self, database: str):
        import threading

        self.marker = f" {database} "
        self.seen: dict[int, float] = {}
        self.own_cpu_s = 0.0  # this sampler's CPU, which is not the benchmark's: subtracted from this process's
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def sample(self) -> float:
        import psutil

        for process in psutil.process_iter(["cmdline"]):
            try:
                title = " ".join(process.info["cmdline"] or []) + " "
                if self.marker in title and "autovacuum" not in title:
                    times = process.cpu_times()
                    self.seen[process.pid] = times.user + times.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return sum(self.seen.values())

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            began = time.thread_time()
            self.sample()
            self.own_cpu_s += time.thread_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=None)
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--days", type=int, default=None)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workers", type=int, default=1, help="metering chunks on this many connections at once")
    parser.add_argument("--no-taxes-credits", dest="taxes_credits", action="store_false",
                        help="without tax rates and prepaid credit grants (on by default: issue 33)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="100 tenants, 400 GPUs, a month (under 2 minutes)")
    mode.add_argument("--hourly", action="store_true", help="the hourly metering run at 100,000 GPUs")
    args = parser.parse_args()
    sizes = (100, 50, 31) if args.quick else (1000, 12500, 2) if args.hourly else (1000, 1250, 31)
    for name, default in zip(("tenants", "nodes", "days"), sizes, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    name = "billing_hourly" if args.hourly else "billing"
    load_before = os.getloadavg()
    print(time.strftime("%Y-%m-%d %H:%M"), f"on {os.cpu_count()} cores, load average {load_before[0]:.1f};",
          vars(args))
    database = services.ensure_postgres()
    scratch = (urlsplit(database.url).path.lstrip("/") or "gpubroker") + "_bench_billing"
    url = services._with_database(database.url, scratch)
    import psutil
    import psycopg

    with psycopg.connect(database.url, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{scratch}"')
    os.environ.update({"DATABASE_URL": url, "SECRET_KEY": "bench", "RUNTIME_ENV_FILE": os.devnull,
                       "LOG_LEVEL": "WARNING", "DJANGO_SETTINGS_MODULE": "config.settings"})
    import django

    django.setup()
    from config.celery import app

    app.conf.broker_url = "memory://"  # finalization enqueues Stripe pushes: keep them inside this process
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    built = time.perf_counter()
    counts = build(args, url)
    print(f"history: {counts} written in {time.perf_counter() - built:.1f} s (COPY, not timed below)")

    from django.db import connection as db

    from billing import services as billing

    billing.price_book_create(name="list", currency="USD", effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                              rates=[{"tier": MODEL, "per_hour": "3.20"}])
    db.ensure_connection()
    backends = Backends(scratch)
    me = psutil.Process()

    def cpu() -> tuple[float, float]:
        times = me.cpu_times()
        return times.user + times.system - backends.own_cpu_s, backends.sample()

    def timed(label: str, work):
        before, wall = cpu(), time.perf_counter()
        result = work()
        seconds, after = time.perf_counter() - wall, cpu()
        return result, {"wall_s": round(seconds, 2), "python_cpu_s": round(after[0] - before[0], 2),
                        "postgres_cpu_s": round(after[1] - before[1], 2)}

    start = datetime(2026, 10, 1, tzinfo=UTC)
    figures: dict = {"history": counts, "load_average_before": round(load_before[0], 2)}
    if args.hourly:
        end = start + timedelta(days=args.days)
        now = end + timedelta(minutes=10)
        billing.usage_meter_window(start=end - 2 * HOUR, end=end - HOUR, now=now, workers=args.workers)
        rows, hour = timed("hourly", lambda: billing.usage_meter_window(start=end - HOUR, end=end, now=now,
                                                                         workers=args.workers))
        hour.update(rows=rows, postgres_cpu_us_per_row=round(hour["postgres_cpu_s"] / max(1, rows) * 1e6, 1),
                    python_cpu_us_per_row=round(hour["python_cpu_s"] / max(1, rows) * 1e6, 1))
        print(f"hourly metering run: {rows:,} lease-hour rows for {args.nodes * 8:,} GPUs in {hour['wall_s']:.1f} s "
              f"wall; CPU: this process {hour['python_cpu_s']:.1f} s, PostgreSQL {hour['postgres_cpu_s']:.1f} s "
              f"({hour['postgres_cpu_us_per_row']} µs per row)")
        figures["hourly_metering"] = hour
    else:
        period = date(2026, 10, 1)
        month_end = datetime(2026, 11, 1, tzinfo=UTC)
        now = month_end + timedelta(days=1)
        rows, meter = timed("metering", lambda: billing.usage_meter_window(start=start, end=month_end, now=now,
                                                                            workers=args.workers))
        meter.update(rows=rows, postgres_cpu_us_per_row=round(meter["postgres_cpu_s"] / max(1, rows) * 1e6, 1),
                     python_cpu_us_per_row=round(meter["python_cpu_s"] / max(1, rows) * 1e6, 1))
        print(f"1. allocation metering: {rows:,} lease-hour rows in {meter['wall_s']:.1f} s wall; CPU: this process "
              f"{meter['python_cpu_s']:.1f} s, PostgreSQL {meter['postgres_cpu_s']:.1f} s "
              f"({meter['postgres_cpu_us_per_row']} µs per row)")
        result, invoice = timed("invoice_run", lambda: billing.invoice_run(period=period, meter=False, now=now))
        from billing.models import CreditDraw, InvoiceLine

        invoice.update(tenants=result["tenants"], finalized=result["finalized"], errors=len(result["errors"]),
                       total_minor=result["total_minor"], tax_lines=InvoiceLine.objects.filter(kind="tax").count(),
                       credit_draws=CreditDraw.objects.count(),
                       cpu_ms_per_tenant=round((invoice["python_cpu_s"] + invoice["postgres_cpu_s"])
                                               / max(1, result["tenants"]) * 1000, 1))
        print(f"2. invoice_run: {result['finalized']} invoices finalized for {result['tenants']} tenants in "
              f"{invoice['wall_s']:.1f} s wall; total {result['total_minor']}; CPU: this process "
              f"{invoice['python_cpu_s']:.1f} s, PostgreSQL {invoice['postgres_cpu_s']:.1f} s "
              f"({invoice['cpu_ms_per_tenant']} ms per tenant); errors {len(result['errors'])}")
        (again, rerun), repeat = timed("re-run", lambda: (
            billing.usage_meter_window(start=start, end=month_end, now=now, workers=args.workers),
            billing.invoice_run(period=period, meter=False, now=now)))
        repeat.update(rows_changed=again, invoices_unchanged=rerun["unchanged"])
        print(f"re-run (changes nothing): metering changed {again:,} rows, invoices unchanged {rerun['unchanged']}, "
              f"{repeat['wall_s']:.1f} s wall; CPU: this process {repeat['python_cpu_s']:.1f} s, PostgreSQL "
              f"{repeat['postgres_cpu_s']:.1f} s")
        close = {key: round(meter[key] + invoice[key], 2) for key in ("wall_s", "python_cpu_s", "postgres_cpu_s")}
        print(f"month close (1 + 2): {close['wall_s']:.1f} s wall, CPU {close['python_cpu_s']:.1f} s here + "
              f"{close['postgres_cpu_s']:.1f} s PostgreSQL, for {args.tenants} tenants and {args.nodes * 8:,} GPUs")
        figures.update(metering=meter, invoice_run=invoice, rerun=repeat, month_close=close)
    backends.stop.set()
    figures["load_average_after"] = round(os.getloadavg()[0], 2)
    print(f"load average {figures['load_average_before']} before, {figures['load_average_after']} after "
          f"(on {os.cpu_count()} cores: wall seconds above include waiting for other work)")
    write(name, figures, settings=vars(args), quick=args.quick)


if __name__ == "__main__":
    main()
