"""``gpubroker``: the broker from a shell. docs/cli.md is its manual (every command there is run by a test).

    gpubroker lease request --project vision --gpu mig:1g.10gb --duration 3600
    gpubroker lease list [--state active,queued] [--project vision] [--all]
    gpubroker lease logs 42 [--stream stderr] [--tail 4096] [--follow]
    gpubroker lease release 42
    gpubroker quote --project vision --gpu whole:H100-80GB
    gpubroker usage [--from 2026-11-01] [--to 2026-12-01] [--group-by project]

``--json`` prints the server's JSON answer instead of the table. Exit status: 0 done, 1 the server refused
(its problem+json on stderr: status, code, field, message), 2 a usage or configuration error, 3 the server
cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from typing import Any

import requests

from gpubroker_client.client import ApiError, Client
from gpubroker_client.config import ConfigError, load_config

GPU_HELP = ("mig:<profile> (mig:1g.10gb) | whole[:<model>[:<count>]] (whole:H100-80GB:2) | "
            "share:<milli>:<memory_mib> (share:250:8192) | auto | a JSON object ({\"kind\": \"mig\", ...})")
WORKLOAD_RUNNING = ("pending", "starting", "running", "backoff")  # --follow keeps reading while the workload is
LEASE_COLUMNS = ["id", "project", "state", "gpu", "tier", "requested_at", "ends_at", "reason"]


class UsageError(Exception):
    pass


def parse_labels(items: list[str]) -> dict[str, str]:
    """``--label key=value`` options as the API's ``labels`` object."""
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--label {item!r}: expected KEY=VALUE")
        labels[key] = value
    return labels


def parse_gpu(text: str) -> dict:
    """The ``gpu`` object from the shorthand (GPU_HELP) or JSON."""
    text = text.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise UsageError(f"--gpu: not valid JSON ({error.msg})") from None
        if not isinstance(value, dict):
            raise UsageError("--gpu: a JSON object is needed")
        return value
    kind, *rest = text.split(":")
    try:
        if kind == "mig" and len(rest) == 1 and rest[0]:
            return {"kind": "mig", "profile": rest[0]}
        if kind == "whole" and len(rest) <= 2:
            gpu: dict[str, Any] = {"kind": "whole"}
            if rest and rest[0]:
                gpu["model"] = rest[0]
            if len(rest) == 2:
                gpu["count"] = int(rest[1])
            return gpu
        if kind == "share" and len(rest) == 2:
            return {"kind": "share", "milli": int(rest[0]), "memory_mib": int(rest[1])}
        if kind == "auto" and not rest:
            return {"kind": "auto"}
    except ValueError:
        pass
    raise UsageError(f"--gpu {text!r}: expected {GPU_HELP}")


def _gpu_text(gpu: Any) -> str:
    if not isinstance(gpu, dict):
        return str(gpu)
    kind = gpu.get("kind", "?")
    if kind == "mig":
        return f"mig:{gpu.get('profile', '')}@{gpu.get('model', '')}"
    if kind == "share":
        return f"share:{gpu.get('milli')}:{gpu.get('memory_mib')}@{gpu.get('model', '')}"
    return f"{kind}:{gpu.get('model', '')}x{gpu.get('count', 1)}"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return _gpu_text(value)
    return str(value).replace("\n", " ")


def _table(rows: list[dict], columns: list[str], out) -> None:
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max([len(column), *(len(line[i]) for line in cells)]) for i, column in enumerate(columns)]
    print("  ".join(column.upper().ljust(width) for column, width in zip(columns, widths, strict=True)).rstrip(),
          file=out)
    for line in cells:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip(), file=out)


def _fields(obj: dict, keys: list[str], out) -> None:
    for key in keys:
        if key in obj:
            print(f"{key}: {_cell(obj[key])}", file=out)


def _emit(args, answer: Any, human) -> None:
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True), file=args.out)
    else:
        human(answer)


# -- commands ------------------------------------------------------------------------------------------------
def cmd_lease_request(client: Client, args) -> int:
    workload = {"command": shlex.split(args.command)} if args.command else None
    lease = client.lease_request(project=args.project, gpu=parse_gpu(args.gpu), duration_seconds=args.duration,
                                 workload_class=args.workload_class, priority=args.priority, workload=workload,
                                 idempotency_key=args.idempotency_key, labels=parse_labels(args.label or []))
    if args.quiet:
        print(lease["id"], file=args.out)
        return 0
    _emit(args, lease, lambda lease: _fields(lease, [*LEASE_COLUMNS, "queue_position"], args.out))
    return 0


def cmd_lease_list(client: Client, args) -> int:
    states = [s for s in args.state.split(",") if s] if args.state else None
    page = client.lease_list(state=states, project=args.project, limit=args.limit)
    leases = list(client.iterate(page)) if args.all else page.results
    if args.json:
        print(json.dumps(leases, indent=2, sort_keys=True), file=args.out)
        return 0
    _table(leases, LEASE_COLUMNS, args.out)
    if not args.all and page.count > len(leases):
        print(f"({len(leases)} of {page.count}; --all for every one)", file=args.out)
    return 0


def cmd_lease_logs(client: Client, args) -> int:
    tail = args.tail if args.tail is not None else (None if args.offset is not None else 16384)
    answer = client.lease_logs(args.lease, stream=args.stream, tail=tail, offset=args.offset)
    while True:
        if args.json:
            print(json.dumps(answer, sort_keys=True), file=args.out)
        else:
            args.out.write(answer.get("data", ""))
            args.out.flush()
        if not args.follow or answer.get("state") not in WORKLOAD_RUNNING:
            return 0
        if not answer.get("data"):
            time.sleep(0.2)  # the server's long poll already waited; a short pause between polls
        answer = client.lease_logs(args.lease, stream=args.stream, offset=answer["next_offset"], follow=5)


def cmd_lease_release(client: Client, args) -> int:
    lease = client.lease_release(args.lease)
    _emit(args, lease, lambda lease: _fields(lease, ["id", "state", "reason", "finished_at"], args.out))
    return 0


def cmd_quote(client: Client, args) -> int:
    quote = client.quote(project=args.project, gpu=parse_gpu(args.gpu), duration_seconds=args.duration,
                         workload_class=args.workload_class)

    def human(quote: dict) -> None:
        for key, value in quote.items():
            print(f"{key}: {json.dumps(value) if isinstance(value, dict | list) else _cell(value)}", file=args.out)

    _emit(args, quote, human)
    return 0


def cmd_usage(client: Client, args) -> int:
    usage = client.usage(start=args.start, end=args.end, group_by=args.group_by)

    def human(usage: dict) -> None:
        print(f"usage from {usage['start']} to {usage['end']} by {usage['group_by']} ({usage['currency']})",
              file=args.out)
        _table(usage["groups"], ["key", "gpu_hours", "idle_gpu_hours", "engine_active_avg", "amount_minor"], args.out)

    _emit(args, usage, human)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpubroker", description="The GPU broker from a shell (docs/cli.md). "
                                     "Server and token: GPUBROKER_URL, GPUBROKER_TOKEN or "
                                     "~/.config/gpubroker/config.toml (mode 600).")
    parser.add_argument("--json", action="store_true", help="print the server's JSON answer")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{lease,quote,usage}")

    lease = commands.add_parser("lease", help="request, list, read the log of, or release leases")
    lease_commands = lease.add_subparsers(dest="lease_command", required=True, metavar="{request,list,logs,release}")

    def shape(sub) -> None:
        sub.add_argument("--project", required=True, help="project slug")
        sub.add_argument("--gpu", required=True, help=GPU_HELP)
        sub.add_argument("--duration", type=int, help="seconds (default 3600)")
        sub.add_argument("--class", dest="workload_class", choices=["training", "inference", "interactive"])

    request = lease_commands.add_parser("request", help="request GPU capacity")
    shape(request)
    request.add_argument("--priority", type=int, help="-100..100, within the project")
    request.add_argument("--command", help="what the lease runs once placed (split like a shell)")
    request.add_argument("--idempotency-key", help="the same key and body give back the same lease")
    request.add_argument("--label", action="append", metavar="KEY=VALUE",
                         help="a cost allocation label (repeatable): --label team=vision --label cost-center=cc-42")
    request.add_argument("--quiet", "-q", action="store_true", help="print the lease's id only (for scripts)")
    request.set_defaults(run=cmd_lease_request)

    listing = lease_commands.add_parser("list", help="the tenant's leases, newest first")
    listing.add_argument("--state", help="comma-separated states (queued,active,...)")
    listing.add_argument("--project")
    listing.add_argument("--limit", type=int, help="page size (default 50)")
    listing.add_argument("--all", action="store_true", help="follow every page")
    listing.set_defaults(run=cmd_lease_list)

    logs = lease_commands.add_parser("logs", help="the lease's workload log")
    logs.add_argument("lease", type=int)
    logs.add_argument("--stream", choices=["stdout", "stderr"])
    logs.add_argument("--tail", type=int, help="the last bytes (default 16384)")
    logs.add_argument("--offset", type=int, help="from this byte on")
    logs.add_argument("--follow", "-f", action="store_true", help="keep reading while the workload runs")
    logs.set_defaults(run=cmd_lease_logs)

    release = lease_commands.add_parser("release", help="give a lease back (stops its meter)")
    release.add_argument("lease", type=int)
    release.set_defaults(run=cmd_lease_release)

    quote = commands.add_parser("quote", help="what a request would get and cost now (nothing is written)")
    shape(quote)
    quote.set_defaults(run=cmd_quote)

    usage = commands.add_parser("usage", help="metered GPU usage and its cost")
    usage.add_argument("--from", dest="start", help="ISO 8601 date or time (default: the month's start)")
    usage.add_argument("--to", dest="end", help="ISO 8601 date or time, exclusive (default: now)")
    usage.add_argument("--group-by", choices=["project", "model", "day"])
    usage.set_defaults(run=cmd_usage)
    return parser


def main(argv: list[str] | None = None, *, out=None, err=None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse: --help (0) or a usage error (2)
        return int(exit_.code or 0)
    args.out = out
    try:
        with Client.from_config(load_config()) as client:
            return args.run(client, args)
    except (ConfigError, UsageError) as error:
        print(f"gpubroker: {error}", file=err)
        return 2
    except ApiError as error:
        print(f"gpubroker: {error}", file=err)
        for item in error.errors[1:]:
            print(f"  {item.get('field')}: {item.get('message')}", file=err)
        return 1
    except requests.RequestException as error:
        print(f"gpubroker: the server cannot be reached ({type(error).__name__}: {error})", file=err)
        return 3


if __name__ == "__main__":
    raise SystemExit(main())
