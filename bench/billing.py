"""Time to meter and invoice one month: 1,000 tenants and 10,000 GPUs.

    .venv/bin/python bench/billing.py [--tenants 1000] [--nodes 1250] [--days 30] [--seed 7]

Builds, in a scratch database (``gpubroker_bench_billing``, on the PostgreSQL ``make run`` finds), a
month of lease history on ``--nodes`` × 8 H100s: whole GPUs (three in four) run one lease after another,
MIG GPUs two ``3g.40gb`` slices side by side; each lease lasts 1–24 h with 0–4 h gaps and belongs to a
random tenant (one project each), a tenth over quota, a tenth interactive. Rows are written with COPY
(not timed). Then it times, in this process, the two jobs of a month's close:

1. allocation metering of every hour of the month (``usage_meter_window``), and
2. ``invoice_run`` for the month: SLO evaluation, pricing, lines, totals and finalization per tenant,

and prints rows, seconds and rates, and the CPU split between this process and PostgreSQL.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra import services  # noqa: E402

MODEL = "H100-80GB"


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
                    leases.append((lease_id, tenant, tenant, "released" if done else "active", "", kind, 1,
                                   "{" + MODEL + "}", profile, 0, 0, True, klass, 0, int(length.total_seconds()) + 1,
                                   MODEL, over, requested.isoformat(), requested.isoformat(), begin.isoformat(),
                                   finish.isoformat(), finish.isoformat() if done else None, "", ""))
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
            "requested_at", "queued_at", "active_at", "ends_at", "finished_at", "idempotency_key", "request_hash"],
            leases)
        counts["allocations"] = copy_rows(cursor, "broker_allocation", [
            "id", "lease_id", "gpu_id", "tier", "kind", "mig_profile", "mig_start", "slots", "milli", "memory_mib",
            "preemptible", "state", "device_uuid", "gpu_instance_id", "access", "created_at", "ready_at", "freed_at"],
            allocations)
        counts["events"] = copy_rows(cursor, "broker_leaseevent", ["id", "lease_id", "from_state", "to_state",
                                                                   "reason", "actor", "at"], events)
        for table in ("tenants_tenant", "tenants_project", "broker_node", "broker_gpu", "broker_lease",
                      "broker_allocation", "broker_leaseevent"):
            sql = f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"  # noqa: S608
            cursor.execute(sql)
        connection.commit()
        cursor.execute("ANALYZE")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--days", type=int, default=31)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    print(time.strftime("%Y-%m-%d %H:%M"), f"on {os.cpu_count()} cores;", vars(args))
    database = services.ensure_postgres()
    url = services._with_database(database.url, "gpubroker_bench_billing")
    import psutil
    import psycopg

    with psycopg.connect(database.url, autocommit=True) as connection:
        connection.execute("DROP DATABASE IF EXISTS gpubroker_bench_billing WITH (FORCE)")
        connection.execute("CREATE DATABASE gpubroker_bench_billing")
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
    backend = psutil.Process(db.connection.info.backend_pid)
    me = psutil.Process()

    def cpu():
        return me.cpu_times().user + me.cpu_times().system, backend.cpu_times().user + backend.cpu_times().system

    period = date(2026, 10, 1)
    start = datetime(2026, 10, 1, tzinfo=UTC)
    month_end = datetime(2026, 11, 1, tzinfo=UTC)
    now = month_end + timedelta(days=1)
    before, wall = cpu(), time.perf_counter()
    rows = billing.usage_meter_window(start=start, end=month_end, now=now)
    meter_s, after = time.perf_counter() - wall, cpu()
    print(f"1. allocation metering: {rows:,} lease-hour rows in {meter_s:.1f} s ({rows / meter_s:,.0f} rows/s); "
          f"CPU: this process {after[0] - before[0]:.1f} s, PostgreSQL {after[1] - before[1]:.1f} s")
    before, wall = cpu(), time.perf_counter()
    result = billing.invoice_run(period=period, meter=False, now=now)
    invoice_s, after = time.perf_counter() - wall, cpu()
    print(f"2. invoice_run: {result['finalized']} invoices finalized for {result['tenants']} tenants in "
          f"{invoice_s:.1f} s ({invoice_s / max(1, result['tenants']) * 1000:.0f} ms per tenant); total "
          f"{result['total_minor']}; CPU: this process {after[0] - before[0]:.1f} s, PostgreSQL "
          f"{after[1] - before[1]:.1f} s; errors {len(result['errors'])}")
    wall = time.perf_counter()
    again = billing.usage_meter_window(start=start, end=month_end, now=now)
    rerun = billing.invoice_run(period=period, meter=False, now=now)
    print(f"re-run (changes nothing): metering {again:,} rows, invoices unchanged {rerun['unchanged']}, "
          f"{time.perf_counter() - wall:.1f} s")
    print(f"month close (1 + 2): {meter_s + invoice_s:.1f} s for {args.tenants} tenants, {args.nodes * 8} GPUs")


if __name__ == "__main__":
    main()
