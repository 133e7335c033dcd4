"""The capacity replay (``bench.sim.capacity``) on the sparse start of the Philly trace (fast)."""

from decimal import Decimal

import pytest

from bench.sim.capacity import (
    BURST_S,
    PRICE_MINOR,
    SETTINGS,
    Replay,
    classify,
    main_capacity,
    results_name,
)
from bench.sim.philly import Job
from broker.scheduler.types import WorkloadClass

SETTINGS_KW = dict(days=20, load_factor=0.8, tick=300, cold_mig=30, cold_whole=10, warm_bind=0.5, price_minor=420,
                   history_hours=6, queue_cap=64)


def run(setting: str, **overrides) -> dict:
    return Replay(loop=setting, **{**SETTINGS_KW, **overrides}).run()


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    return {setting: run(setting) for setting in SETTINGS}


def test_every_setting_replays_the_same_arrivals_on_the_same_fleet(results):
    assert {r["jobs"] for r in results.values()} == {results["off"]["jobs"]}
    assert {r["gpus"] for r in results.values()} == {results["off"]["gpus"]}
    assert {str(r["classes"]) for r in results.values()} == {str(results["off"]["classes"])}
    for r in results.values():
        assert r["useful_share_pct"] <= r["fleet_allocation_pct"]
        assert r["fleet_gpu_hours"] == r["gpus"] * 20 * 24
        assert len(r["timeline"]["hour"]) == 20 * 24


def test_baselines_run_no_planner_and_the_default_applies_only_what_touches_no_tenant(results):
    for setting in ("static", "fifo", "off"):
        assert not results[setting]["proposed"] and not results[setting]["applied"]
    default = results["default"]
    assert default["applied"] and "idle_reclaim" not in default["applied"]
    assert default["released_idle"] == default["suspended_idle"] == default["preempted_idle"] == 0
    assert set(default["applied"]) <= {"mode_switch", "mig_layout", "warm_pool"}
    for r in results.values():
        assert r["in_quota_violations"] == 0


def test_static_never_borrows_and_fifo_never_preempts(results):
    assert results["static"]["ttg_n"]["over_quota"] == 0 or results["static"]["preempted_by_scheduler"] == 0
    assert results["static"]["preempted_by_scheduler"] == 0
    assert results["fifo"]["preemptions"] == 0


def test_auto_suspends_idle_training_and_releases_idle_sessions(results):
    auto, off = results["auto"], results["off"]
    assert auto["applied"].get("idle_reclaim")
    assert auto["suspended_idle"] + auto["released_idle"] + auto["preempted_idle"] > 0
    assert auto["preemptions"] > off["preemptions"]  # suspensions are preemptions, counted with their lost work


def test_advise_applies_nothing_until_a_person_has_had_the_human_delay():
    never = run("advise", human_delay=10**9)
    off = run("off")
    figures = ("fleet_allocation_pct", "idle_allocated_gpu_hours", "ttg_p95_s", "queue_wait_s", "started")
    assert {k: off[k] for k in figures} == {k: never[k] for k in figures}
    assert never["proposed"] and not never["applied"]


def test_quotas_are_sized_from_the_days_before_the_window_unless_there_are_none():
    """An operator sets quotas ahead of the month they serve (issue 30's believable cluster): from the GPU-time of
    the days before the window; at the trace's start, with nothing before, from the window itself (the oracle)."""
    kw = {**SETTINGS_KW, "days": 0.25}
    before = Replay(loop="static", start_day=20, **kw)
    oracle = Replay(loop="static", start_day=20, quotas="window", **kw)
    assert before.quotas_from == "before" and oracle.quotas_from == "window"
    assert sum(before.partitions.values()) == sum(oracle.partitions.values()) == before.gpus
    assert before.partitions != oracle.partitions
    assert Replay(loop="static", **kw).quotas_from == "window"  # day 0: no history
    with pytest.raises(ValueError, match="quota sizing"):
        Replay(loop="static", quotas="guess", **kw)


def test_classes_come_from_duration_gpu_count_and_bursts():
    jobs = [Job(0, "a", 0.0, 600.0, 1),  # alone, short: interactive
            Job(1, "b", 1000.0, 600.0, 1), Job(2, "b", 1000.0 + BURST_S, 600.0, 1),  # a burst: training
            Job(3, "a", 5000.0, 86400.0, 1),  # a day on one GPU: inference
            Job(4, "a", 9000.0, 600.0, 4),  # a gang: training
            Job(5, "c", 9000.0, 7200.0, 1)]  # two hours on one GPU: training
    assert classify(jobs) == [WorkloadClass.INTERACTIVE, WorkloadClass.TRAINING, WorkloadClass.TRAINING,
                              WorkloadClass.INFERENCE, WorkloadClass.TRAINING, WorkloadClass.TRAINING]


def test_the_price_is_the_seeded_list_price_of_an_h100_hour():
    from billing.management.commands.seed_prices import LIST

    rate = next(r for r in LIST if r["tier"] == "H100-80GB" and "kind" not in r)
    assert int(Decimal(rate["per_hour"]) * 100) == PRICE_MINOR


def test_results_files_are_named_by_setting_and_load():
    assert results_name("default", 0.8) == "capacity_default"
    assert results_name("off", 0.6) == "capacity_load60_off"
    assert results_name("static", 0.95) == "capacity_load95_static"


def test_capacity_replay_rejects_an_unknown_setting_or_load(capsys):
    assert main_capacity(["--setting", "sometimes"]) == 2
    assert "unknown setting" in capsys.readouterr().err
    assert main_capacity(["--load", "lots"]) == 2
    assert "--load" in capsys.readouterr().err


def test_capacity_replay_writes_results_and_a_plot(tmp_path, capsys):
    assert main_capacity(["--days", "2", "--setting", "off,default", "--json-dir", str(tmp_path),
                          "--plot", str(tmp_path / "plot.png")]) == 0
    assert (tmp_path / "capacity_off.json").is_file() and (tmp_path / "capacity_default.json").is_file()
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"
    assert "useful %" in capsys.readouterr().out


def test_the_class_shares_docs_capacity_md_quotes_for_days_20_to_50():
    from collections import Counter

    from bench.sim.philly import DEFAULT_TRACE, load

    jobs = [job for job in load(DEFAULT_TRACE, days=50).jobs if job.arrival >= 20 * 86400]
    shares = Counter(classify(jobs))
    assert len(jobs) == 46205
    assert shares[WorkloadClass.INTERACTIVE] == 5010 and shares[WorkloadClass.INFERENCE] == 436


BUSY_KW = {**SETTINGS_KW, "days": 2, "start_day": 30}  # a congested window: in-quota work reclaims borrowed GPUs


def _figures(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in ("wall_seconds", "cpu_seconds")}


def test_the_replay_scheduler_remembers_without_changing_a_decision(monkeypatch):
    """``ReplayScheduler`` keeps failed reclaims and no-fit reasons while the working state is unchanged (issue 30:
    the month's CPU): every figure equals a replay through the plain scheduling core."""
    from bench.sim import capacity

    remembered = Replay(loop="off", reservations=False, **BUSY_KW)
    fast = remembered.run()
    assert remembered.scheduler.memo_hits > 0  # the window exercises the memo
    with_reservations = Replay(loop="off", reservations=True, **BUSY_KW).run()  # as the broker ships
    # the shipped default reclaims across modes too (its failed tries are remembered like failed reclaims)
    switching = Replay(loop="default", reservations=False, **BUSY_KW).run()
    assert switching["switches_for_in_quota"] > 0

    def plain_core(snapshot, *, reservations=False, ends=None):
        return capacity.Scheduler(snapshot, reservations=reservations, ends=ends,
                                  reserve_after_seconds=capacity.RESERVE_AFTER_S if reservations else 0.0)

    monkeypatch.setattr(capacity, "ReplayScheduler", plain_core)
    assert _figures(fast) == _figures(Replay(loop="off", reservations=False, **BUSY_KW).run())
    assert _figures(with_reservations) == _figures(Replay(loop="off", reservations=True, **BUSY_KW).run())
    assert _figures(switching) == _figures(Replay(loop="default", reservations=False, **BUSY_KW).run())
    assert with_reservations["reservations"] and with_reservations["reserved_jobs"] > 0


def test_the_planner_runs_on_a_wait_only_where_the_pool_kinds_apply_on_their_own():
    """The shipped default (mode switch and MIG layout ``auto``) runs the planner when a request waits for a mode an
    idle GPU could be switched to, at most once per ``plan_on_wait`` s; ``advise`` and the baselines never do, and
    ``plan_on_wait=0`` leaves the planner to its timer (the replay before issue 30's change)."""
    default = Replay(loop="default", **BUSY_KW).run()
    runs = default["planner_runs"]
    assert runs["on_wait"] > 0 and runs["timer"] > 0
    assert runs["on_wait"] + runs["timer"] <= 2 * 86400 // 10  # the debounce counts every run
    for setting in ("advise", "off"):
        assert Replay(loop=setting, **BUSY_KW).run()["planner_runs"]["on_wait"] == 0
    timer_only = Replay(loop="default", **{**BUSY_KW, "plan_on_wait": 0}).run()
    assert timer_only["planner_runs"]["on_wait"] == 0
    assert default["mode_switches"] >= timer_only["mode_switches"]
