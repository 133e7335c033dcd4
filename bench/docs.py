"""The docs' benchmark tables, made from the results files.

A table in ``README.md`` or ``docs/*.md`` sits between two markers::

    <!-- bench:capacity -->
    ...made by the renderer named "capacity" from bench/results/*.json...
    <!-- /bench:capacity -->

``python -m bench docs`` rewrites every such block from its renderer; ``tests/test_bench_results.py`` fails when a
block differs from what its results files say (so a figure in a table is always the figure a command wrote), or
when a results file is not one a registered benchmark writes.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from pathlib import Path

from bench.record import RESULTS, ROOT
from bench.record import load as _load_file

STALE_MARK = "**Stale:**"  # the line a block gets when the code behind its figures changed since they were recorded
_LOADED: list[str] = []  # the results files the renderer now running has read


def load(name: str) -> dict:
    """The results file ``name`` (``bench.record.load``), noted as one the table being made is drawn from."""
    _LOADED.append(name)
    return _load_file(name)

BLOCK = re.compile(r"<!-- bench:(?P<name>[\w.-]+) -->\n(?P<body>.*?)<!-- /bench:(?P=name) -->", re.S)
RENDERERS: dict[str, Callable[[], str]] = {}


def renderer(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    def register(function: Callable[[], str]) -> Callable[[], str]:
        RENDERERS[name] = function
        return function

    return register


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def provenance(*names: str) -> str:
    """One line: the command(s), commit, date and machine of the results files behind a table."""
    payloads = [load(name) for name in names]
    first = payloads[0]
    machine = first["machine"]
    commands = list(dict.fromkeys(p["command"] for p in payloads))
    commits = sorted({p["commit"][:10] + (" (uncommitted changes)" if p.get("dirty") else "") for p in payloads})
    dates = sorted(p["date"] for p in payloads)
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    return (f"{'; '.join(f'`{c}`' for c in commands)} — commit {', '.join(commits)}, {when}, "
            f"{machine['cores']} cores ({machine['cpu']}), Python {machine['python']}")


def table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


# --- the renderers -------------------------------------------------------------------------------------------


@renderer("agent_ops")
def _agent_ops() -> str:
    figures = load("agent_ops")["figures"]
    rows = [[r["client_threads"], f"{r['operations_per_second']:,.0f}", r["p50_ms"], r["p99_ms"], r["seconds"]]
            for r in figures["runs"]]
    return provenance("agent_ops") + "\n\n" + table(
        ["client threads", "create+delete ops/s", "p50 ms", "p99 ms", "seconds"], rows)


@renderer("agent_scrape")
def _agent_scrape() -> str:
    f = load("agent_scrape")["figures"]
    rows = [["nodes (GPUs)", f"{f['nodes']:,} ({f['gpus']:,})"],
            ["fleet listening after", f"{f['listening_after_seconds']} s"],
            ["one sequential pass over every /metrics", f"{f['metrics_pass_seconds']} s"],
            ["per page p50 / p99", f"{f['metrics_page_p50_ms']} / {f['metrics_page_p99_ms']} ms"],
            ["page size", f"{f['metrics_page_kib']} KiB"]]
    prometheus = f.get("prometheus")
    if prometheus:
        rows += [["Prometheus targets up", f"{prometheus['targets_up']:,} / {f['nodes']:,}"],
                 ["scrape_duration mean / max", f"{prometheus['scrape_duration_mean_ms']} / "
                                                f"{prometheus['scrape_duration_max_ms']} ms"],
                 ["power / engine-active series", f"{prometheus['power_series']:,} / "
                                                  f"{prometheus['engine_active_series']:,}"]]
    return provenance("agent_scrape") + "\n\n" + table(["", ""], rows)


CAPACITY_SETTINGS = ("static", "fifo", "off", "advise", "default", "auto")
CAPACITY_LOADS = (0.6, 0.95)  # beside the headline load 0.8: the baseline settings only (bench.sim capacity)
CAPACITY_LOAD_SETTINGS = ("static", "off", "default")


def _capacity_row(r: dict) -> list:
    return [r["setting"], r["offered_load"], r["fleet_allocation_pct"], r["useful_share_pct"],
            f"{r['idle_allocated_gpu_hours']:,.0f}", f"{r['idle_allocated_cost_minor'] / 100:,.0f}",
            r["ttg_p95_s"]["in_quota"], r["ttg_p95_s"]["over_quota"], r["queue_wait_s"]["p50"],
            r["queue_wait_s"]["p95"], r["jct_s"]["mean"], f"{r['completed']:,} / {r['jobs']:,}", r["preemptions"],
            r["gpu_hours_lost_to_preemption"],
            f"{r['warm_holding_cost_minor'] / 100:,.0f}", r["in_quota_violations"],
            f"{r['cost_per_useful_gpu_hour_minor'] / 100:,.2f}", r["cpu_seconds"]]


CAPACITY_HEADERS = ["setting", "offered load", "fleet alloc %", "useful share %", "idle allocated GPU-h",
                    "idle cost (USD)", "in-quota p95 TTG s", "over-quota p95 TTG s", "wait p50 s", "wait p95 s",
                    "JCT mean s", "jobs completed", "preemptions", "GPU-h lost to preemption", "warm holding (USD)",
                    "in-quota violations", "USD per useful GPU-h", "CPU s"]


_QUOTAS_FROM = {"before": "the GPU-time of the days before the window (set ahead, as an operator sets them)",
                "window": "the window's own GPU-time (an oracle: every static partition fits the month it serves)"}


def _alone(figures: dict) -> str:
    """The in-quota p95 under the former rule (a request alone against its project's holdings, its project's own
    backlog ignored), where the results file has it."""
    alone = figures["ttg_p95_s"].get("in_quota_alone")
    return "" if alone is None else f" ({alone} s by the former rule that ignores the project's own backlog)"


@renderer("capacity")
def _capacity() -> str:
    """The six settings side by side on the same arrivals at load 0.8 (``capacity_<setting>``), and the
    issue's comparisons from them."""
    names = [f"capacity_{setting}" for setting in CAPACITY_SETTINGS]
    figures = {setting: load(f"capacity_{setting}")["figures"] for setting in CAPACITY_SETTINGS}
    rows = [_capacity_row(figures[setting]) for setting in CAPACITY_SETTINGS]
    static, off, default, auto = (figures[s] for s in ("static", "off", "default", "auto"))
    useful = default["useful_share_pct"] / max(static["useful_share_pct"], 1e-9)
    idle = (auto["idle_allocated_gpu_hours"] - off["idle_allocated_gpu_hours"]) / off["idle_allocated_gpu_hours"]
    classes = ", ".join(f"{name} {v['share_pct']} % ({v['jobs']:,} jobs)" for name, v in
                        sorted(off["classes"].items()))
    return (provenance(*names) + "\n\n" + table(CAPACITY_HEADERS, rows) + "\n\n"
            + f"{off['gpus']:,} H100 GPUs ({off['mig_gpus_at_start']} in MIG mode at the start), "
              f"{off['window_days']:g} days, {off['jobs']:,} jobs: {classes}. Quotas sized from "
              f"{_QUOTAS_FROM[off.get('quotas_from', 'window')]}. "
              f"The shipped default against static partitions: useful share × {useful:.2f}, in-quota p95 time "
              f"to GPU {default['ttg_p95_s']['in_quota']} s{_alone(default)}, {default['in_quota_violations']} "
              "in-quota violations. "
              f"`auto` against `off`: idle allocated GPU-hours {off['idle_allocated_gpu_hours']:,.0f} → "
              f"{auto['idle_allocated_gpu_hours']:,.0f} ({idle * 100:+.1f} %), mean JCT {off['jct_s']['mean']:,.0f} → "
              f"{auto['jct_s']['mean']:,.0f} s, {auto['preemptions']:,} preemptions losing "
              f"{auto['gpu_hours_lost_to_preemption']:,} GPU-h.")


@renderer("capacity_headline")
def _capacity_headline() -> str:
    """README's lines on the capacity replay: the shipped default's row beside static partitions and ``off``."""
    picked = ("static", "off", "default")
    figures = {setting: load(f"capacity_{setting}")["figures"] for setting in picked}
    f = figures["default"]
    words = {"static": "static partitions (each project owns its quota)", "off": "quotas with borrowing, no loop",
             "default": "**the shipped default** (the loop acting on idle capacity; in-quota work reclaims borrowed "
                        "GPUs of any mode)"}
    rows = [[words[s], figures[s]["fleet_allocation_pct"], figures[s]["useful_share_pct"],
             figures[s]["ttg_p95_s"]["in_quota"], f"{figures[s]['queue_wait_s']['p95'] / 3600:.1f} h",
             f"{figures[s]['jct_s']['mean'] / 3600:.1f} h", f"{figures[s]['completed']:,} of {figures[s]['jobs']:,}",
             figures[s]["in_quota_violations"]] for s in picked]
    return (f"A month of Philly arrivals on {f['gpus']:,} simulated H100s at 80 % offered load, the same arrivals for "
            f"each setting, quotas sized from {_QUOTAS_FROM[f.get('quotas_from', 'window')]} "
            "(`python -m bench.sim capacity`, [docs/capacity.md](docs/capacity.md)):\n\n"
            + table(["setting", "fleet allocated %", "useful share %", "in-quota p95 time to GPU s", "p95 wait",
                     "mean completion (of the jobs completed)", "jobs completed", "in-quota violations"], rows))


@renderer("capacity_loads")
def _capacity_loads() -> str:
    """The baseline settings at the other offered loads (``capacity_load<pct>_<setting>``), beside 0.8's."""
    names, rows = [], []
    for load_factor in (CAPACITY_LOADS[0], 0.8, CAPACITY_LOADS[1]):
        for setting in CAPACITY_LOAD_SETTINGS:
            name = f"capacity_{setting}" if load_factor == 0.8 else f"capacity_load{round(load_factor * 100)}_{setting}"
            names.append(name)
            rows.append(_capacity_row(load(name)["figures"]))
    return provenance(*names) + "\n\n" + table(CAPACITY_HEADERS, rows)


@renderer("idle_structure")
def _idle_structure() -> str:
    """Where the month's idle GPU-hours are and the most a rule acting after W minutes could remove
    (``idle_structure``), beside what ``off`` and ``auto`` measured (``capacity_off``, ``capacity_auto``)."""
    f = load("idle_structure")["figures"]
    off, auto = load("capacity_off")["figures"], load("capacity_auto")["figures"]
    classes = table(["class", "GPU-h of work in the window", "idle GPU-h (under 5 %)", "idle share %",
                     "at 0 % share %", "share of all idle %"],
                    [[k, f"{r['work_gpu_hours']:,.0f}", f"{r['idle_gpu_hours']:,.0f}", r["idle_share_pct"],
                      r["idle_zero_share_pct"], r["share_of_idle_pct"]] for k, r in f["by_class"].items()])
    durations = table(["training jobs running", "GPU-h of work", "idle share % (under 5 %)", "at 0 % share %"],
                      [[k, f"{r['work_gpu_hours']:,.0f}", r["idle_share_pct"], r["idle_zero_share_pct"]]
                       for k, r in f["training_by_duration"].items()])
    stretches = table(["idle stretch", *f["idle_by_stretch_length_pct"]],
                      [["share of idle GPU-h %", *f["idle_by_stretch_length_pct"].values()]])
    reach = table(["a rule acting after (window + notice)", *(f"{w} min" for w in f["reachable_share_pct"])],
                  [["at most removable, % of idle GPU-h", *f["reachable_share_pct"].values()]])
    rules = "; ".join(f"{k} {v} %" for k, v in f["auto_rules_reachable_pct"].items())
    halving = f["halving_needs_window_min_at_most"]
    change = (auto["idle_allocated_gpu_hours"] - off["idle_allocated_gpu_hours"]) / off["idle_allocated_gpu_hours"]
    return (provenance("idle_structure", "capacity_off", "capacity_auto") + "\n\n"
            + f"{f['jobs']:,} jobs, {f['work_gpu_hours']:,.0f} GPU-h of work inside the {f['days']:g}-day window "
              f"(each run as if started on arrival), {f['idle_gpu_hours']:,.0f} of them idle: "
              f"{f['idle_share_pct']} % under {f['idle_threshold_pct']} % engine activity, "
              f"{f['idle_zero_share_pct']} % at exactly 0 %, in {f['idle_stretches']:,} idle stretches. "
              "Measured by the replay: `off` "
              f"{off['idle_allocated_gpu_hours']:,.0f} idle allocated GPU-h, `auto` "
              f"{auto['idle_allocated_gpu_hours']:,.0f} ({change * 100:+.1f} %).\n\n"
            + classes + "\n\n" + durations + "\n\n" + stretches + "\n\n" + reach + "\n\n"
            + f"`auto`'s rules, each applied to every lease it could touch (upper bounds): {rules}. Halving the idle "
              + (f"GPU-hours needs a rule acting within {halving} min of idle, even if a resumed job skipped the rest "
                 "of its idle stretch." if halving else
                 "GPU-hours is out of reach of every window measured, even if a resumed job skipped the rest of its "
                 "idle stretch."))


@renderer("capacity_live")
def _capacity_live() -> str:
    f = load("capacity_live")["figures"]
    labels = {"cold_phase": "cold", "warm_phase_all": "warm, all", "warm_phase_bound_warm": "warm, bound a warm member",
              "warm_phase_cold_path": "warm, cold path (pool empty)",
              "warm_phase_bound_member_in_making": "warm, bound a member still being made"}
    rows = [[labels.get(key, key), v["n"], v["p50_s"], v["p95_s"], v["max_s"]]
            for key, v in f["time_to_gpu"].items() if v and v.get("n")]
    cpu = f["cpu"]
    lines = [
        table(["phase", "leases", "p50 s", "p95 s", "max s"], rows), "",
        f"- Share of warm-phase requests served warm: {f['warm_phase_served_warm_share'] * 100:.1f} %; "
        f"p95 bound-warm / p95 cold (the ratio a busy machine moves least): {f['p95_bound_warm_over_p95_cold']}; "
        f"target p95 < 1 s met: {'yes' if f['target_p95_under_1s_met'] else 'no'}.",
        f"- Warm pool: {f['warm_pool']['members_created']} members made, {f['warm_pool']['members_bound']} bound, "
        f"{f['warm_pool']['held_idle_gpu_hours']} GPU-hours held idle; {f['warm_pool']['adjustments_applied']} "
        f"adjustments applied, {f['warm_pool']['adjustments_failed']} failed.",
        f"- CPU per lease, all parts: {cpu['cold_phase']['ms_per_lease']['all']} ms cold, "
        f"{cpu['warm_phase']['ms_per_lease']['all']} ms warm.",
    ]
    return provenance("capacity_live") + "\n\n" + "\n".join(lines)


@renderer("quota")
def _quota() -> str:
    # ours without reservations and, beside it, as shipped: with reservations and backfill on (LEASE_RESERVATIONS)
    names = ("philly_quota_static", "philly_quota_fifo", "philly_quota_ours", "philly_quota_ours_reserve")
    runs = [load(name)["figures"] for name in names]

    def spread(d: dict) -> str:
        return f"{_duration(d['p50'])} / {_duration(d['p95'])} / {_duration(d['p99'])}"

    def estimate(r: dict) -> str:
        error = r.get("estimate_error_s") or {}
        if not error.get("n"):
            return "–"
        return (f"{_duration(error['p50'])} / {_duration(error['p90'])} / {_duration(error['mean'])} "
                f"({error['n']:,} jobs; {r.get('estimate_unknown', 0)} without an estimate)")

    def preemptions(r: dict) -> str:
        if not r["preemptions"]:
            return "0"
        return f"{r['preemptions']:,} ({r['preempted_jobs']:,}) / {r['gpu_hours_lost']:,} GPU-h"

    rows = [
        ["jobs / GPUs / offered load", *(f"{r['jobs']:,} / {r['gpus']} / {r['offered_load']}" for r in runs)],
        ["utilisation (first to last submission)", *(r["utilisation_window"] for r in runs)],
        ["queueing delay mean", *(_duration(r["queueing_delay_s"]["mean"]) for r in runs)],
        ["queueing delay p50 / p95 / p99", *(spread(r["queueing_delay_s"]) for r in runs)],
        ["in-quota time-to-GPU p50 / p95 / p99", *(spread(r["in_quota_ttg_s"]) for r in runs)],
        ["mean job completion time", *(_duration(r["jct_s"]["mean"]) for r in runs)],
        ["preemptions (jobs) / GPU-hours lost", *(preemptions(r) for r in runs)],
        ["Jain's index (over-quota share / weight)",
         *("–" if r["jain_over_quota"] is None else r["jain_over_quota"] for r in runs)],
        ["guarantee violations", *(f"{r['guarantee_violations']:,}" for r in runs)],
        ["in-quota gangs waiting for one node (not violations)", *(r["in_quota_fragmented_waits"] for r in runs)],
        ["in-quota multi-GPU jobs, time-to-GPU p95 / max",
         *(f"{_duration(r['in_quota_gang_ttg_s']['p95'])} / {_duration(r['in_quota_gang_ttg_s']['max'])}"
           if r.get("in_quota_gang_ttg_s", {}).get("n") else "–" for r in runs)],
        ["estimated start, error from the actual start: p50 / p90 / mean (sampled jobs that waited)",
         *(estimate(r) for r in runs)],
        ["wall time", *(f"{r['wall_seconds']} s" for r in runs)],
    ]
    static, ours = runs[0], runs[3]
    ratio = static["queueing_delay_s"]["mean"] / max(ours["queueing_delay_s"]["mean"], 1e-9)
    return (provenance(*names) + "\n\n" + table(["", "static", "fifo", "ours, no reservations",
                                                   "ours as shipped (reservations)"], rows) + "\n\n"
            + f"Mean queueing delay, static partitions against ours as shipped: {ratio:.1f}x lower with ours.")


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


@renderer("pipelines")
def _pipelines() -> str:
    f = load("pipelines")["figures"]
    s = f["summary"]
    even, even90, opt = (s["even_greedy_cost_over_esg"], s["even_greedy_cost_over_esg_headroom10"],
                         s["esg_cost_over_optimum"])
    rows = [
        ["ESG", _pct(s["esg"]["plan_meets_slo"]), _pct(s["esg"]["hit_rate_mean"]), "1"],
        ["ESG planned against 90 % of the SLO", _pct(s["esg_headroom10"]["plan_meets_slo"]),
         _pct(s["esg_headroom10"]["hit_rate_mean"]), "—"],
        ["even split + greedy", _pct(s["even_greedy"]["plan_meets_slo"]), _pct(s["even_greedy"]["hit_rate_mean"]),
         f"**{even['mean']:.2f}×** ESG (max {even['max']:.2f}×; {even['pipelines']} pipelines both meet); "
         f"{even90['mean']:.2f}× ESG-90 % (max {even90['max']:.2f}×)"],
        [f"A\\* optimum ({opt['pipelines']} pipelines of ≤ 6 stages)", _pct(s["optimum"]["plan_meets_slo"]),
         _pct(s["optimum"]["hit_rate_mean"]),
         f"ESG = {opt['mean']:.4f}× optimum (max {opt['max']:.2f}×), equal in {_pct(opt['equal'])}"],
    ]
    tight = s["hit_rate_by_tightness"]
    by_tightness = table(["SLO / fastest latency", "ESG", "ESG-90 %", "even split + greedy",
                          "even split's plan meets the SLO"],
                         [[f"{k}×", _pct(v["esg"]), _pct(v["esg_headroom10"]), _pct(v["even_greedy"]),
                           _pct(v["even_greedy_meets_slo"])] for k, v in tight.items()])
    timing = f["planning_time"]
    plan_rows = [[stages, f"{v['esg_mean_s'] * 1000:.1f} / {v['esg_max_s'] * 1000:.1f}",
                  f"{v['astar_mean_s'] * 1000:.1f} / {v['astar_max_s'] * 1000:.1f}" if "astar_mean_s" in v else "",
                  f"{v['exhaustive_mean_s'] * 1000:.0f}" if "exhaustive_mean_s" in v else ""]
                 for stages, v in timing.items()]
    return (provenance("pipelines") + "\n\n"
            + table(["Planner", "plan meets SLO (own model)", "SLO hit rate (simulated)", "cost per 1,000 vs ESG"],
                    rows)
            + "\n\nHit rate by SLO tightness:\n\n" + by_tightness
            + "\n\nPlanning time by chain length (ms, mean / max, wall clock):\n\n"
            + table(["stages", "ESG", "A\\* over the whole pipeline", "exhaustive"], plan_rows)
            + f"\n\nThe run took {f['wall_seconds']} s of wall time for {f['cpu_seconds']} s of its own CPU.")


@renderer("splits")
def _splits() -> str:
    f = load("splits")["figures"]
    s = f["summary"]
    h, e, o = s["heuristic"], s["equal_layers"], s["optimal"]

    def row(name: str, r: dict) -> list:
        return [name, _pct(r["found"]), r["latency_over_optimal_mean"],
                f"{r['objective_over_optimal_mean']} ({r['objective_over_optimal_max']})",
                f"{r['idle_gib_mean']} ({r['optimal_idle_gib_mean']})", _pct(r["equal_to_optimal"]),
                f"{r['seconds_mean'] * 1000:.1f} / {r['seconds_max'] * 1000:.0f} ms"]

    rows = [row("heuristic", h), row("equal layers", e),
            ["optimum (DP)", _pct(o["found"]), 1, 1, "", "",
             f"{o['seconds_mean'] * 1000:.0f} / {o['seconds_max'] * 1000:.0f} ms"]]
    multi = s["multi_gpu"]
    note = (f"Where the model must be split ({multi['cases']} cases, {_pct(multi['share_of_cases'])}, whose optimum "
            f"uses ≥ 2 GPUs): the heuristic finds a split in {_pct(multi['heuristic']['found'])} at "
            f"{multi['heuristic']['latency_over_optimal_mean']}× the optimum's latency (equal in "
            f"{_pct(multi['heuristic']['equal_to_optimal'])}); equal layers finds one in "
            f"{_pct(multi['equal_layers']['found'])} at {multi['equal_layers']['latency_over_optimal_mean']}×.")
    return (provenance("splits") + "\n\n"
            + table(["Method", "split found", "latency / optimum", "objective / optimum (max)",
                     "idle GiB (optimum's)", "= optimum", "planning mean / max"], rows) + "\n\n" + note)


@renderer("scheduler_cycle")
def _scheduler_cycle() -> str:
    core, db = load("scheduler_cycle")["figures"], load("scheduler_cycle_db")["figures"]
    rows = [
        ["core: snapshot → working state (`Scheduler(snapshot)`)", core["state_build_cpu_seconds"],
         core["state_build_wall_seconds"]],
        ["core: plan (`schedule`)", core["plan_cpu_seconds"], core["plan_wall_seconds"]],
        ["core: cycle", core["cycle_cpu_seconds"], core["cycle_wall_seconds"]],
        ["core: decisions per second", f"{core['decisions_per_cpu_second']:,} per CPU second",
         f"{core['decisions_per_second']:,} per wall second"],
        [f"`--db`: queue read ({db['queued']:,} leases, `core_request`)", db["queue_read_cpu_seconds"],
         db["queue_read_wall_seconds"]],
        ["`--db`: snapshot load, read whole (queue included)", db["snapshot_load_cpu_seconds"],
         db["snapshot_load_wall_seconds"]],
        ["`--db`: plan (`plan()`, working state included)", db["plan_cpu_seconds"], db["plan_wall_seconds"]],
        ["`--db`: read + plan (the cycle without its write)",
         f"{db['cycle_cpu_seconds']} (+ {db['postgres_cpu_seconds']} PostgreSQL)", db["cycle_wall_seconds"]],
        ["`--db`: kept snapshot brought up to date, nothing changed (queue included)",
         db["kept_snapshot_load_cpu_seconds"], db["kept_snapshot_load_wall_seconds"]],
        ["`--db`: read + plan on the kept snapshot",
         f"{db['kept_cycle_cpu_seconds']} (+ {db['kept_postgres_cpu_seconds']} PostgreSQL; "
         f"{db['kept_decisions_per_cpu_second']:,} decisions per CPU second)", db["kept_cycle_wall_seconds"]],
        ["`--db`: `schedule_cycle` on the kept snapshot, the write included",
         f"{db['cycle_with_write_cpu_seconds']} (+ {db['cycle_with_write_postgres_cpu_seconds']} PostgreSQL)",
         db["cycle_with_write_wall_seconds"]],
        [f"`--db`: the next kept load, that write's {db['kept_load_after_write_changes']:,} leases read again",
         db["kept_load_after_write_cpu_seconds"], db["kept_load_after_write_wall_seconds"]],
    ]
    return (provenance("scheduler_cycle", "scheduler_cycle_db") + "\n\n"
            + table([f"{core['gpus']:,} GPUs, {core['queued']:,} requests", "CPU s", "wall s"], rows) + "\n\n"
            + f"Decision digests: core {core['decisions_digest']}, `--db` {db['decisions_digest']}; "
              f"{core['node_classes']:,} node classes.")


@renderer("scaleout")
def _scaleout() -> str:
    f = load("scaleout")["figures"]
    one, three = f["one_worker"], f["three_workers"]
    rows = [
        [f"leases/s, request to ACTIVE ({one['leases']} leases per phase)", one["leases_per_second"],
         three["leases_per_second"]],
        ["**ratio 3 workers / 1 worker**", "", f"**{f['ratio_3_workers_to_1']}**"],
        ["CPU per lease, every part (ms)", one["cpu_ms_per_lease_total"], three["cpu_ms_per_lease_total"]],
        ["… of which Celery workers (ms)", one["cpu_ms_per_lease"]["Celery workers"],
         three["cpu_ms_per_lease"]["Celery workers"]],
        ["machine CPU seconds in the phase (this benchmark's)", f"{one['machine_cpu_seconds']} "
         f"({one['bench_cpu_seconds']})", f"{three['machine_cpu_seconds']} ({three['bench_cpu_seconds']})"],
    ]
    return (provenance("scaleout") + "\n\n" + table([f"{f['broker']} broker, {f['cores']} cores", "1 worker",
                                                      "3 workers"], rows)
            + f"\n\nSchedule cycles in the run: {f['cycles']}, {f['cycles_overlapping']} overlapping.")


@renderer("leasing")
def _leasing() -> str:
    from bench.leasing import table as leasing_table

    return provenance("leasing", "leasing_profile") + "\n\n" + leasing_table(["leasing", "leasing_profile"])


@renderer("leasing_scale")
def _leasing_scale() -> str:
    f = load("leasing_scale")["figures"]
    without, with_nodes = f["without"], f["with"]
    keys = [k for k in without if isinstance(without[k], (int, float))]
    rows = [[k, without[k], with_nodes.get(k, "–")] for k in keys]
    rows += [[f"CPU ms per lease: {group}", without["cpu_ms_per_lease"].get(group, "–"),
              with_nodes["cpu_ms_per_lease"].get(group, "–")]
             for group in dict.fromkeys([*without["cpu_ms_per_lease"], *with_nodes["cpu_ms_per_lease"]])]
    return (provenance("leasing_scale") + "\n\n"
            + table(["", f"{f['base_nodes']} nodes", f"+ {f['scale_nodes']:,} nodes heartbeating and scraped"], rows)
            + f"\n\nNodes heartbeating: {f['nodes_heartbeating']:,} / {f['scale_nodes']:,}; Prometheus targets up: "
              f"{f['prometheus_targets_up']}; **API p99 with / without the nodes: {f['api_p99_ratio']}**.")


@renderer("billing")
def _billing() -> str:
    f, hourly = load("billing")["figures"], load("billing_hourly")["figures"]
    m, inv, again, close, h = f["metering"], f["invoice_run"], f["rerun"], f["month_close"], hourly["hourly_metering"]
    rows = [
        [f"1. metering a month, {m['rows']:,} lease-hours", f"{m['wall_s']} s",
         f"{m['python_cpu_s']} s / {m['postgres_cpu_s']} s", f"{m['postgres_cpu_us_per_row']} µs"],
        [f"2. `invoice_run`, {inv['tenants']:,} tenants ({inv['finalized']:,} finalized, {inv['errors']} errors)",
         f"{inv['wall_s']} s", f"{inv['python_cpu_s']} s / {inv['postgres_cpu_s']} s ({inv['cpu_ms_per_tenant']} ms "
         "per tenant)", ""],
        [f"re-run of both ({again['rows_changed']} rows changed, {again['invoices_unchanged']:,} invoices unchanged)",
         f"{again['wall_s']} s", f"{again['python_cpu_s']} s / {again['postgres_cpu_s']} s", ""],
        ["**month close (1 + 2)**", f"**{close['wall_s']} s**", f"**{close['python_cpu_s']} s / "
         f"{close['postgres_cpu_s']} s**", ""],
        [f"hourly run at {hourly['history']['gpus']:,} GPUs, {h['rows']:,} lease-hours", f"**{h['wall_s']} s**",
         f"{h['python_cpu_s']} s / {h['postgres_cpu_s']} s", f"{h['postgres_cpu_us_per_row']} µs"],
    ]
    history = f["history"]
    return (provenance("billing", "billing_hourly") + "\n\n"
            + table(["", "wall", "CPU: Python / PostgreSQL", "PostgreSQL CPU per lease-hour"], rows) + "\n\n"
            + f"Month history: {history['tenants']:,} tenants, {history['gpus']:,} GPUs, {history['leases']:,} leases"
              + (f" ({history['labelled_leases']:,} with cost allocation labels)" if "labelled_leases" in history
                 else "")
              + f", {history['events']:,} events; load average {f['load_average_before']} before the month run and "
              f"{f['load_average_after']} after; {hourly['load_average_before']} before the hourly run.")


OPENB = ("default", "multigpu20", "multigpu30", "gpushare20", "gpushare40", "gpushare60", "gpushare80", "gpuspec10",
         "gpuspec20")


@renderer("openb")
def _openb() -> str:
    from bench.sim.fragmentation import results_table

    return provenance(*(f"openb_{trace}" for trace in OPENB)) + "\n\n" + results_table(RESULTS)


@renderer("tiering")
def _tiering() -> str:
    f = load("tiering")["figures"]
    names = {"biggest": "always the biggest GPU", "rules": "rules only",
             "roofline": "roofline prior with the rules' margins (shown, not a target)",
             "forest": f"**Random Forest**, threshold {f['threshold']['chosen']} (chosen on the training folds)"}
    rows = [[names.get(k, k), v["decisions"], f"{v['regret'] * 100:.1f} %", f"{v['misses'] * 100:.1f} %"]
            for k, v in f["policies"].items()]
    sweep = "; ".join(f"{t} → regret {v['regret'] * 100:.1f} %, misses {v['misses'] * 100:.1f} %"
                      for t, v in f["confidence_sweep"].items())
    w = f["workloads"]
    return (provenance("tiering") + "\n\n" + table(["policy", "decisions", "regret", "misses"], rows) + "\n\n"
            + f"{w['train']} training and {w['held_out']} held-out workloads, {w['slices']} slices; forest of "
              f"{f['forest']['trees']} trees, validation error {f['forest']['validation_error'] * 100:.1f} %; "
              f"{f['seconds']} s. The forest profiled first (exploring cheaper slices) in "
              f"{f['forest_profile_first'] * 100:.1f} % of its decisions; measurement noise estimated from the "
              f"profile database σ = {f['threshold'].get('measurement_noise', 0) * 100:.1f} %. "
              f"The threshold on the held-out set (sensitivity, not used to choose): {sweep}.")


def _error_cell(summary: dict) -> str:
    """A ``gpus.measured.summary``: "median abs. error % (lowest – highest measured ÷ predicted)", "–" for none."""
    if not summary.get("cases"):
        return "–"
    low, high = summary["measured_over_predicted"]
    return f"{summary['median_abs_error'] * 100:.0f} % ({low:.2f} – {high:.2f})"


@renderer("tiering_measured")
def _tiering_measured() -> str:
    """The model's error from ``tiering_error`` (the measured mode without the forest: seconds to re-record), the
    forest's regret and misses from ``tiering_measured`` (the same mode with it: most of an hour)."""
    f = load("tiering_error")["figures"]
    forest = load("tiering_measured")["figures"].get("forest")

    order = ["eager, all", "eager inference", "eager inference, batch >= 8", "eager inference, batch < 8",
             "eager decode", "graph decode", "graph inference", "own-eager decode"]
    cv, before = f["cross_validated"]["subsets"], f["before_regimes"]
    rows = [[name, cv[name]["throughput"]["cases"], _error_cell(cv[name]["throughput"]),
             _error_cell(cv[name]["memory"]), _error_cell(before[name]["throughput"]) if name in before else "–"]
            for name in order if name in cv]
    d = f["decisions"]
    text = (provenance("tiering_error") + "\n\n"
            + table(["subset (H100 rows)", "cases", "throughput: median abs. error (measured ÷ predicted)",
                     "peak memory", "before regimes (throughput)"], rows) + "\n\n"
            + f"Cross-validated by architecture (fit on four, score on the fifth); peak memory over every measured row "
              f"{_error_cell(f['cross_validated']['memory'])}"
            + (f", within 15 % on {f['cross_validated']['memory_rows']['within']} of "
               f"{f['cross_validated']['memory_rows']['rows']} rows"
               + "".join(f" (not: {o['case']}, {o['measured_mib']:,.0f} MiB measured, {o['predicted_mib']:,.0f} "
                         "predicted)" for o in f["cross_validated"]["memory_rows"]["outside"])
               if "memory_rows" in f["cross_validated"] else "")
            + "; predicted bound contradicting the measured one: "
            + f"{f['cross_validated']['contradictions']} row(s). Tier decisions ({d['decisions']}: each measured case "
              f"at 10, 30, 60 and 90 % of its best): {d['changed']} change when measured beats modelled; the model's "
              f"own choices miss {d['model_choice_misses']} of them under the measured truth.")
    if forest:
        names = {"biggest": "always the biggest GPU", "rules": "rules only", "roofline": "roofline prior",
                 "forest": "**Random Forest**"}
        rows = [[names.get(k, k), v["decisions"],
                 f"{v['regret'] * 100:.1f} %", f"{v['misses'] * 100:.1f} %",
                 f"{forest['model']['policies'][k]['regret'] * 100:.1f} %",
                 f"{forest['model']['policies'][k]['misses'] * 100:.1f} %"]
                for k, v in forest["measured"]["policies"].items()]
        text += ("\n\n" + provenance("tiering_measured") + "\n\n"
                 + table(["policy (measured workloads)", "decisions", "regret, measured truth",
                          "misses, measured truth", "regret, model as truth", "misses, model as truth"], rows))
    return text


@renderer("tiering_held_out")
def _tiering_held_out() -> str:
    """The constants as fitted (on gpus/data's fitted rows) scored on the check rows of architectures they never
    saw (``tiering_error``'s ``held_out``), and the fitted architectures' cases measured again there."""
    f = load("tiering_error")["figures"]
    unseen = f.get("held_out")
    if not unseen:
        return provenance("tiering_error") + "\n\n(no check rows in this results file)"

    order = ["eager, all", "eager inference, batch >= 8", "eager inference, batch < 8", "eager decode",
             "graph decode", "graph inference", "own-eager decode"]
    subsets = unseen["subsets"]
    rows = [[name, subsets[name]["throughput"]["cases"], _error_cell(subsets[name]["throughput"]),
             _error_cell(subsets[name]["memory"])] for name in order if name in subsets]
    memory = unseen["memory_rows"]
    again = "; ".join(f"{mode} {v['cases']} cases, median {v['median']:.2f} ({v['range'][0]:.2f} – {v['range'][1]:.2f})"
                      for mode, v in unseen["reproduced"].items())
    return (provenance("tiering_error") + "\n\n"
            + table([f"subset ({len(unseen['architectures'])} held-out architectures, {unseen['rows']} rows)", "cases",
                     "throughput: median abs. error (measured ÷ predicted)", "peak memory"], rows) + "\n\n"
            + f"Peak memory within 15 % on {memory['within']} of {memory['rows']} rows"
            + "".join(f" (not: {o['case']}, {o['measured_mib']:,.0f} MiB measured, {o['predicted_mib']:,.0f} "
                      "predicted)" for o in memory["outside"])
            + f"; predicted bound contradicting the measured one: {unseen['contradictions']} row(s)"
            + "".join(f" ({c['arch']} {c['task']} {c['precision']} b{c['batch']} {c['mode']}: model {c['bound']}, "
                      f"measured {c['measured_bound']})" for c in unseen["contradicting_cases"])
            + f". The fitted architectures' cases measured again on that machine (its ÷ the fitted rows): {again}."
            + _run_to_run() + _other_gpus(f.get("other_gpus") or {}))


def _other_gpus(others: dict) -> str:
    """The constants as fitted scored on another GPU model's check rows (``tiering_error``'s ``other_gpus``: an
    H200); nothing when the results file has none (recorded before it)."""
    order = ["eager, all", "eager inference, batch >= 8", "eager inference, batch < 8", "eager decode",
             "graph decode", "graph inference", "own-eager decode"]

    def ratios(figures: dict) -> str:
        return "; ".join(f"{name} {v['median']:.2f} ({v['range'][0]:.2f} – {v['range'][1]:.2f}, {v['cases']} cases)"
                         for name, v in figures.items())

    text = ""
    for key, other in others.items():
        subsets, ratio = other["subsets"], other["predicted_over_measured"]
        rows = [[name, subsets[name]["throughput"]["cases"], _error_cell(subsets[name]["throughput"]),
                 f"{ratio[name]['median']:.2f}" if name in ratio else "–", _error_cell(subsets[name]["memory"])]
                for name in order if name in subsets]
        memory = other["memory_rows"]
        text += ("\n\n" + table([f"subset ({key}, never fitted on: {other['rows']} rows, "
                                 f"{len(other['architectures'])} architectures)", "cases",
                                 "throughput: median abs. error (measured ÷ predicted)", "predicted ÷ measured, median",
                                 "peak memory"], rows) + "\n\n"
                 + f"Predicted ÷ measured throughput per mode: {ratios(other['predicted_over_measured_by_mode'])}; "
                   f"the fitted architectures alone: {ratios(other['fitted_architectures_by_mode'])}. The same cases "
                   f"on {', '.join(other['reference'])} (check rows), measured ratio ÷ the model's ratio between the "
                   f"two GPUs: {ratios(other['scaling_by_mode'])}. Peak memory within 15 % on {memory['within']} of "
                   f"{memory['rows']} rows"
                 + "".join(f" (not: {o['case']}, {o['measured_mib']:,.0f} MiB measured, {o['predicted_mib']:,.0f} "
                           "predicted)" for o in memory["outside"])
                 + f"; predicted bound contradicting the measured one: {other['contradictions']} row(s)"
                 + "".join(f" ({c['arch']} {c['task']} {c['precision']} b{c['batch']} {c['mode']}: model {c['bound']}, "
                           f"measured {c['measured_bound']})" for c in other["contradicting_cases"]) + ".")
    return text


def _run_to_run() -> str:
    """How far two runs at once on the same GPU differ, per mode (``device_perf`` and ``device_perf_repeat``)."""
    try:
        first, second = load("device_perf"), load("device_perf_repeat")
    except FileNotFoundError:
        return ""

    def key(row):
        return (row["slice"], row["arch"], row["task"], row["precision"], row["batch"], row["seq"], row["mode"])

    again = {key(r): r["throughput"] for r in second["figures"]["rows"]}
    by_mode: dict[str, list[float]] = {}
    for row in first["figures"]["rows"]:
        if key(row) in again:
            by_mode.setdefault(row["mode"], []).append(abs(row["throughput"] / again[key(row)] - 1))
    parts = "; ".join(f"{mode} {len(v)} cases, median {statistics.median(v) * 100:.1f} %, largest {max(v) * 100:.0f} %"
                      for mode, v in sorted(by_mode.items()))
    return (f"\n\nThe same cases measured twice at once on that GPU ({provenance('device_perf')}; then "
            f"{provenance('device_perf_repeat')}), throughput's absolute difference: {parts}.")


@renderer("tiering_headline")
def _tiering_headline() -> str:
    """README's sentence on auto-tiering: the measured mode's figures (bench/tiering.py --truth measured)."""
    cv, forest = load("tiering_error")["figures"]["cross_validated"], load("tiering_measured")["figures"]["forest"]
    eager, graph = cv["subsets"]["eager, all"]["throughput"], cv["subsets"]["graph decode"]["throughput"]
    measured, model = forest["measured"]["policies"]["forest"], forest["model"]["policies"]["forest"]
    memory = cv.get("memory_rows")
    return (f"Judged against a measured H100 (`bench/tiering.py --truth measured`, cross-validated by architecture), "
            f"the performance model's median error is {eager['median_abs_error'] * 100:.0f} % on eager throughput "
            f"and {graph['median_abs_error'] * 100:.0f} % on graph-replayed decode"
            + (f"; peak memory is within 15 % on {memory['within']} of {memory['rows']} rows" if memory else "")
            + f". The auto-tiering forest's cost regret on those measured workloads is "
              f"{measured['regret'] * 100:.1f} % with {measured['misses'] * 100:.1f} % target misses "
              f"({model['regret'] * 100:.1f} % and {model['misses'] * 100:.1f} % if the model itself were the truth).")


@renderer("headlines")
def _headlines() -> str:
    """docs/performance.md's headline table: each benchmark's figure against its target, every cell from a
    results file."""
    def fig(name: str) -> dict:
        return load(name)["figures"]

    def yes(met: bool) -> str:
        return "met" if met else "**missed**"

    lease, scale = fig("leasing"), fig("leasing_scale")

    def api_cpu(phase: dict) -> float:
        return phase["cpu_ms_per_lease"]["API (gunicorn)"]

    core, db = fig("scheduler_cycle"), fig("scheduler_cycle_db")
    bill, hourly = fig("billing"), fig("billing_hourly")
    close_cpu = round(bill["month_close"]["python_cpu_s"] + bill["month_close"]["postgres_cpu_s"], 1)
    openb = {trace: fig(f"openb_{trace}") for trace in OPENB}
    default_trace = openb["default"]["policies"]["default"]["alloc_at_130"]
    published = [t for t, f in openb.items() if f["published_fgd_alloc_at_130"] is not None]
    leading = [t for t in published if openb[t]["policies"]["default"]["alloc_at_130"]
               >= openb[t]["published_fgd_alloc_at_130"] + 0.5]
    static, ours = fig("philly_quota_static"), fig("philly_quota_ours")
    wait_ratio = static["queueing_delay_s"]["mean"] / max(ours["queueing_delay_s"]["mean"], 1e-9)
    static, off, default, auto = (fig(f"capacity_{s}") for s in ("static", "off", "default", "auto"))
    idle_change = (auto["idle_allocated_gpu_hours"] - off["idle_allocated_gpu_hours"]) / off["idle_allocated_gpu_hours"]
    useful_ratio = default["useful_share_pct"] / max(static["useful_share_pct"], 1e-9)
    live = fig("capacity_live")
    warm_p95 = live["time_to_gpu"]["warm_phase_all"]["p95_s"]
    pipes, splits, tier = fig("pipelines"), fig("splits"), fig("tiering")["policies"]["forest"]
    measured, forests = fig("tiering_error"), fig("tiering_measured")["forest"]
    measured_cv = measured["cross_validated"]["subsets"]
    measured_forest = forests["measured"]["policies"]["forest"]
    measured_model = forests["model"]["policies"]["forest"]
    scaleout = fig("scaleout")["ratio_3_workers_to_1"]
    ten = pipes["planning_time"]["10"]["esg_mean_s"]
    rows = [
        ["lease path (`leasing`)", f"{lease['cpu_ms_per_lease_total']} CPU ms per lease, "
         f"{lease['leases_per_second']} leases/s, p99 {lease['latency_p99_s']} s", "≤ 5 ms, p99 ≤ 1 s",
         yes(lease["cpu_ms_per_lease_total"] <= 5 and lease["latency_p99_s"] <= 1)],
        ["1,000 more nodes heartbeating (`leasing_scale`)", f"API p99 × {scale['api_p99_ratio']}; API CPU ms per lease "
         f"{api_cpu(scale['without'])} → {api_cpu(scale['with'])}",
         "unaffected", yes(scale["api_p99_ratio"] <= 1.2)],
        [f"schedule cycle, {core['gpus']:,} GPUs / {core['queued']:,} requests (`scheduler_cycle`, `_db`)",
         f"core {core['cycle_cpu_seconds']} CPU s ({core['decisions_per_cpu_second']:,} decisions per CPU s); "
         f"from PostgreSQL on the kept snapshot: read + plan {db['kept_cycle_wall_seconds']} s "
         f"({db['kept_cycle_cpu_seconds']} CPU s); with the write {db['cycle_with_write_wall_seconds']} s "
         f"({db['cycle_with_write_cpu_seconds']} CPU s + {db['cycle_with_write_postgres_cpu_seconds']} PostgreSQL)",
         "≤ 2 s, ≥ 10,000 decisions/s",
         yes(db["cycle_with_write_wall_seconds"] <= 2 and core["decisions_per_cpu_second"] >= 10000)],
        ["month close, 1,000 tenants / 10,000 GPUs (`billing`)",
         f"{bill['month_close']['wall_s']} s wall, {close_cpu} CPU s", "≤ 60 s",
         yes(bill["month_close"]["wall_s"] <= 60)],
        ["hourly metering at 100,000 GPUs (`billing_hourly`)", f"{hourly['hourly_metering']['wall_s']} s",
         "≤ 10 s", yes(hourly["hourly_metering"]["wall_s"] <= 10)],
        ["placement quality, openb default trace (`openb`)", f"{default_trace:.2f} % allocated at 130 %; "
         f"≥ published FGD + 0.5 on {len(leading)} of {len(published)} traces", "≥ 96.5 %, every trace",
         yes(default_trace >= 96.5 and len(leading) == len(published))],
        ["quota replay, Philly (`quota`)", f"mean wait {wait_ratio:.1f}× lower than static partitions, "
         f"{ours['guarantee_violations']} guarantee violations", "≥ 5×, 0",
         yes(wait_ratio >= 5 and ours["guarantee_violations"] == 0)],
        ["capacity replay, shipped default vs static partitions (`capacity`)",
         f"useful share × {useful_ratio:.2f}, in-quota p95 time to GPU {default['ttg_p95_s']['in_quota']} s, "
         f"{default['in_quota_violations']} in-quota violations", "≥ 1.5×, ≤ 60 s, 0",
         yes(useful_ratio >= 1.5 and default["ttg_p95_s"]["in_quota"] <= 60
             and default["in_quota_violations"] == 0)],
        ["capacity replay, auto vs off (`capacity`)", f"idle allocated GPU-h {idle_change * 100:+.1f} %, mean JCT "
         f"{off['jct_s']['mean']:,.0f} → {auto['jct_s']['mean']:,.0f} s, {auto['in_quota_violations']} in-quota "
         "violations", "halved, JCT not worse, 0",
         yes(idle_change <= -0.5 and auto["jct_s"]["mean"] <= off["jct_s"]["mean"]
             and auto["in_quota_violations"] == 0)],
        ["warm pools, live service (`capacity_live`)", f"p95 time to GPU {warm_p95} s warm, "
         f"{live['time_to_gpu']['cold_phase']['p95_s']} s cold", "< 1 s", yes(warm_p95 < 1)],
        ["scale-out (`scaleout`)", f"leases/s × {scaleout} with 3 workers against 1", "rising", yes(scaleout > 1)],
        ["ESG pipelines (`pipelines`)", f"even split costs {pipes['summary']['even_greedy_cost_over_esg']['mean']:.2f}×"
         f" ESG; a 10-stage pipeline plans in {ten * 1000:.1f} ms", "< 1 s", yes(ten < 1)],
        ["model splits (`splits`)", f"heuristic {splits['summary']['heuristic']['latency_over_optimal_mean']}× the "
         f"optimum's latency, equal layers {splits['summary']['equal_layers']['latency_over_optimal_mean']}×", "", ""],
        ["performance model against a measured H100, cross-validated by architecture (`tiering_error`)",
         f"eager throughput {measured_cv['eager, all']['throughput']['median_abs_error'] * 100:.0f} %, graph decode "
         f"{measured_cv['graph decode']['throughput']['median_abs_error'] * 100:.0f} %, peak memory "
         f"{measured['cross_validated']['memory']['median_abs_error'] * 100:.0f} % median abs. error"
         + (f" (within 15 % on {measured['cross_validated']['memory_rows']['within']} of "
            f"{measured['cross_validated']['memory_rows']['rows']} rows)"
            if "memory_rows" in measured["cross_validated"] else "")
         + f"; {measured['cross_validated']['contradictions']} bound contradicted",
         "≤ 25 %, ≤ 12 %, ≤ 15 %, 0",
         yes(measured_cv["eager, all"]["throughput"]["median_abs_error"] <= 0.25
             and measured_cv["graph decode"]["throughput"]["median_abs_error"] <= 0.12
             and measured["cross_validated"]["memory"]["median_abs_error"] <= 0.15
             and measured["cross_validated"]["contradictions"] == 0)],
        *([["the same model on 24 architectures it was never fitted on, measured on a second H100 (`tiering_error`)",
            f"eager throughput {unseen['subsets']['eager, all']['throughput']['median_abs_error'] * 100:.0f} %, "
            f"graph decode {unseen['subsets']['graph decode']['throughput']['median_abs_error'] * 100:.0f} %, "
            f"peak memory {unseen['subsets']['eager, all']['memory']['median_abs_error'] * 100:.0f} % median abs. "
            f"error (within 15 % on {unseen['memory_rows']['within']} of {unseen['memory_rows']['rows']} rows); "
            f"{unseen['contradictions']} bound contradicted",
            "≤ 25 %, ≤ 12 %, ≤ 15 %, 0",
            yes(unseen["subsets"]["eager, all"]["throughput"]["median_abs_error"] <= 0.25
                and unseen["subsets"]["graph decode"]["throughput"]["median_abs_error"] <= 0.12
                and unseen["subsets"]["eager, all"]["memory"]["median_abs_error"] <= 0.15
                and unseen["contradictions"] == 0)]] if (unseen := measured.get("held_out")) else []),
        ["auto-tiering, measured truth (`tiering_measured`; model as truth: `tiering`)",
         f"regret {measured_forest['regret'] * 100:.1f} %, misses {measured_forest['misses'] * 100:.1f} % "
         f"(model as truth on the same workloads: {measured_model['regret'] * 100:.1f} %, "
         f"{measured_model['misses'] * 100:.1f} %; on the generated held-out set: {tier['regret'] * 100:.1f} %, "
         f"{tier['misses'] * 100:.1f} %)",
         "≤ 5 %, ≤ 2 %", yes(measured_forest["regret"] <= 0.05 and measured_forest["misses"] <= 0.02)],
    ]
    return table(["benchmark (results file)", "figure", "target", "met?"], rows)


def render(name: str) -> str:
    return RENDERERS[name]().rstrip("\n") + "\n"


def blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group("name"), m.group("body")) for m in BLOCK.finditer(text)]


def without_marks(body: str) -> str:
    """A block without its staleness line: what the results files alone decide (the line depends on the code's
    history since, which moves with every commit; ``python -m bench docs`` writes it, the check ignores it)."""
    kept = "".join(line for line in body.splitlines(keepends=True) if not line.startswith(STALE_MARK))
    return kept.rstrip("\n") + "\n" if kept.strip() else kept


def stale_mark(names: list[str]) -> str:
    """The line a block gets when some of the results files behind it are stale or untraceable (empty if none):
    which files, and the command that records them again."""
    from bench.__main__ import BENCHMARKS
    from bench.staleness import FRESH, UNKNOWN, results_freshness

    owner = {result: bench for bench in BENCHMARKS for result in bench.results}
    old, rerun = [], []
    for name in dict.fromkeys(names):
        bench = owner.get(name)
        if bench is None:
            continue
        state = results_freshness(name, root=ROOT, results=RESULTS, sources=bench.sources())
        if state.state in (FRESH, UNKNOWN):
            continue
        old.append(f"`{name}.json`" + (" (commit not in history)" if state.state != "stale" else ""))
        rerun.append(bench.name)
    if not old:
        return ""
    which = ", ".join(old) if len(old) <= 4 else f"{len(old)} of its results files"
    return (f"{STALE_MARK} the code these figures measure changed after they were recorded ({which}; "
            f"`python -m bench stale` says what changed); re-run `python -m bench run "
            f"{' '.join(dict.fromkeys(rerun))}` on a quiet machine.\n")


def update(check: bool = False) -> list[str]:
    """Rewrite (or, with ``check``, compare) every block; return ``path: name`` of those that differ. Rewriting
    also marks the blocks whose results files are stale (``stale_mark``); comparing ignores that line."""
    differs = []
    for path in documents():
        text = path.read_text()

        def replace(match: re.Match, path: Path = path) -> str:
            name = match.group("name")
            if name not in RENDERERS:
                raise KeyError(f"{path.relative_to(ROOT)}: no renderer named {name!r} (bench/docs.py)")
            _LOADED.clear()
            try:
                body = render(name)
            except (OSError, KeyError, TypeError, ValueError) as error:  # a missing or older-format results file
                differs.append(f"{path.relative_to(ROOT)}: {name} (cannot render: {type(error).__name__} {error})")
                return match.group(0)
            if check:
                if body != without_marks(match.group("body")):
                    differs.append(f"{path.relative_to(ROOT)}: {name}")
                return match.group(0)
            mark = stale_mark(list(_LOADED))
            body += ("\n" + mark) if mark else ""
            if body != match.group("body"):
                differs.append(f"{path.relative_to(ROOT)}: {name}")
            return f"<!-- bench:{name} -->\n{body}<!-- /bench:{name} -->"

        new = BLOCK.sub(replace, text)
        if new != text and not check:
            path.write_text(new)
    return differs
