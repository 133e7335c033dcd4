"""The quota replay (``bench.sim.quota``) on tiny synthetic traces: 2 projects, 16 GPUs (two nodes)."""

import json
import random

import pytest

from bench.sim import quota
from bench.sim.philly import DEFAULT_TRACE, Job, Trace

PARTS = {"a": 8, "b": 8}


def trace_of(*jobs: tuple[str, float, float, int]) -> Trace:
    """jobs: (project, arrival, duration, gpus), in any order."""
    ordered = sorted(jobs, key=lambda j: j[1])
    return Trace([Job(i, p, float(t), float(d), g) for i, (p, t, d, g) in enumerate(ordered)], None, {})


def run(trace: Trace, policy: str, gpus: int = 16, parts: dict | None = None, **kwargs) -> quota.Replay:
    replay = quota.Replay(trace, policy=policy, gpus=gpus, parts=parts or PARTS, **kwargs)
    replay.run()
    return replay


# project a borrows the whole cluster with long jobs; b (deserved 8) arrives later
BORROW_THEN_RECLAIM = trace_of(
    *[("a", 0, 7200, 1) for _ in range(16)],
    *[("b", 1000, 600, 1) for _ in range(6)],
    ("b", 1500, 900, 2),
)


def test_ours_reclaims_for_in_quota_work_with_zero_violations():
    replay = run(BORROW_THEN_RECLAIM, "ours", notice=30, checkpoint=600)
    result = replay.result
    assert result.reclaim_decisions == 7
    assert result.preemptions == 8  # one victim per GPU b needs
    assert result.guarantee_violations == 0
    # b is in quota: it gets GPUs after the notice, not after a's jobs end
    b_waits = [s.first_start - s.job.arrival for s in replay.states if s.job.project == "b"]
    assert b_waits == [30.0] * 7
    assert result.in_quota_ttg_s["max"] <= 30.0
    # victims lose the work since their last checkpoint (every 600 s): six ran 1030 s and saved 600,
    # two ran 1530 s and saved 1200
    assert replay.lost == 6 * 430 + 2 * 330
    assert result.preemptions_within_deserved == 0  # a held 16 of its 8 deserved


def test_preempted_jobs_restart_and_complete():
    replay = run(BORROW_THEN_RECLAIM, "ours", notice=30, checkpoint=600)
    result = replay.result
    assert result.stuck == 0
    assert result.completed == len(BORROW_THEN_RECLAIM.jobs)
    preempted = [s for s in replay.states if s.preemptions]
    assert preempted
    for state in preempted:
        assert state.completed_at is not None
        # it ran its whole duration, plus the work it lost, plus its time back in the queue
        assert state.completed_at - state.job.arrival > state.job.duration
    # every GPU-second ran: useful work plus what the preemptions threw away
    useful = sum(j.gpu_seconds for j in BORROW_THEN_RECLAIM.jobs)
    assert replay.busy_total == pytest.approx(useful + replay.lost)


def test_static_never_lends_gpus_across_projects():
    class Checked(quota.Replay):
        def _observe(self, now):
            cluster = self.scheduler.cluster
            for project, partition in self.parts.items():
                used_in, used_over = cluster.project_usage.get((project, quota.MODEL), [0, 0])
                assert used_over == 0, f"{project} borrows at {now}"
                assert used_in <= partition * 1000, f"{project} above its partition at {now}"
            assert not any(a.preemptible for a in cluster.allocations.values())
            super()._observe(now)

    replay = Checked(BORROW_THEN_RECLAIM, policy="static", gpus=16, parts=PARTS)
    result = replay.run()
    assert result.preemptions == 0
    assert result.guarantee_violations == 0
    assert result.completed == len(BORROW_THEN_RECLAIM.jobs)
    # a's second eight jobs waited for its first eight, although b left GPUs idle at first
    a_waits = sorted(s.first_start - s.job.arrival for s in replay.states if s.job.project == "a")
    assert a_waits[:8] == [0.0] * 8 and min(a_waits[8:]) >= 7200


def test_fifo_has_no_quotas_and_blocks_the_late_project():
    replay = run(BORROW_THEN_RECLAIM, "fifo")
    result = replay.result
    assert result.preemptions == 0
    b_waits = [s.first_start - s.job.arrival for s in replay.states if s.job.project == "b"]
    assert min(b_waits) >= 7200 - 1500
    # measured against the same partitions as a reference, that breaks b's guarantee
    assert result.guarantee_violations == 7


def random_trace(seed: int, jobs: int = 160) -> Trace:
    rng = random.Random(seed)
    out = []
    t = 0.0
    for _ in range(jobs):
        t += rng.expovariate(1 / 400)
        gpus = rng.choice([1, 1, 1, 1, 2, 4, 8, 16])
        out.append((rng.choice("ab"), round(t), rng.choice([60, 600, 3600, 7200]) * rng.uniform(0.5, 2), gpus))
    return trace_of(*out)


@pytest.mark.parametrize("policy", quota.POLICIES)
def test_pruning_the_queue_changes_no_decision(policy):
    trace = random_trace(7)  # offered load about 1 on 32 GPUs, with gangs and 16-GPU spread jobs
    parts = {"a": 16, "b": 16}
    pruned = run(trace, policy, gpus=32, parts=parts)
    full = run(trace, policy, gpus=32, parts=parts, prune=False)
    assert [s.first_start for s in pruned.states] == [s.first_start for s in full.states]
    assert [s.completed_at for s in pruned.states] == [s.completed_at for s in full.states]
    assert pruned.result.requests_passed < full.result.requests_passed
    assert pruned.result.stuck == full.result.stuck == 0
    if policy == "ours":
        # reclaim works for gangs and for requests spread over nodes alike: no guarantee violations
        assert pruned.result.guarantee_violations == 0


def test_partitions_are_proportional_whole_and_hold_the_largest_job():
    trace = trace_of(("a", 0, 1000, 1), ("a", 10, 8000, 1), ("b", 20, 1000, 1), ("c", 30, 100, 8))
    parts = quota.partitions(trace, 32)
    assert sum(parts.values()) == 32
    assert parts["c"] == 8  # floor: its 8-GPU job
    assert parts["a"] > parts["b"] >= 1
    assert quota.partitions(trace, 32, floor=False)["c"] < 8


def test_partitions_sized_from_an_earlier_history_as_an_operator_sets_them():
    """Shares from the history's GPU-time, floors from the window's jobs: a project new in the window gets its
    largest job; one only in the history keeps its share (a quota set for a team that went quiet)."""
    window = trace_of(("a", 0, 1000, 1), ("b", 10, 8000, 1), ("c", 30, 100, 4))
    history = trace_of(("a", 0, 9000, 1), ("b", 10, 1000, 1), ("quiet", 20, 2000, 1)).jobs
    parts = quota.partitions(window, 32, sized_from=history)
    assert sum(parts.values()) == 32
    assert parts["c"] == 4  # nothing in the history: its floor, its 4-GPU job
    assert parts["a"] > parts["quiet"] > parts["b"] >= 1  # the history's order, not the window's
    assert quota.partitions(window, 32)["b"] > quota.partitions(window, 32)["a"]  # the window's own (an oracle)


def test_command_line_on_the_philly_trace(tmp_path, capsys):
    code = quota.main_quota(["--jobs", str(DEFAULT_TRACE), "--limit", "400", "--policy", "all", "--json-dir",
                             str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    for policy in quota.POLICIES:
        assert policy in printed
    # one results file per policy, in bench/record.py's format
    payloads = [json.loads((tmp_path / f"philly_quota_{policy}.json").read_text()) for policy in quota.POLICIES]
    assert all(p["command"].startswith("python -m bench.sim quota --jobs") for p in payloads)
    results = [p["figures"] for p in payloads]
    assert [r["policy"] for r in results] == list(quota.POLICIES)
    assert all(r["completed"] == r["jobs"] == 400 for r in results)
    assert next(r for r in results if r["policy"] == "ours")["guarantee_violations"] == 0


def test_reservations_replay_completes_and_reports_gang_waits(tmp_path, capsys):
    # the same random trace with and without reservations: every job completes, no guarantee violation, and the
    # in-quota gang waits are reported; on the command line, --reservations both writes both results files
    trace = random_trace(7)
    parts = {"a": 16, "b": 16}
    off = run(trace, "ours", gpus=32, parts=parts).result
    on = run(trace, "ours", gpus=32, parts=parts, reservations=True, reserve_after=0).result
    for result in (off, on):
        assert result.completed == result.jobs and result.stuck == 0 and result.guarantee_violations == 0
        assert result.in_quota_gang_ttg_s["n"] > 0
    assert on.reservations and not off.reservations and off.reserved_jobs == 0 and off.reservation_cycles == 0
    code = quota.main_quota(["--jobs", str(DEFAULT_TRACE), "--limit", "300", "--policy", "ours", "--reservations",
                             "both", "--json-dir", str(tmp_path)])
    assert code == 0
    assert "ours +resv" in capsys.readouterr().out
    with_them = json.loads((tmp_path / "philly_quota_ours_reserve.json").read_text())["figures"]
    without = json.loads((tmp_path / "philly_quota_ours.json").read_text())["figures"]
    assert with_them["reservations"] and not without["reservations"]
    assert {"in_quota_gang_ttg_s", "reservation_cycles", "reserved_jobs"} <= set(with_them)


def test_a_later_window_of_the_trace_starts_at_zero_from_its_first_job():
    """``--from-day D``: the jobs submitted D days or more after the trace's first, counted from the first of
    them (arrival 0), ``--days`` and ``--limit`` applied within the window."""
    from bench.sim.philly import load

    whole = load(DEFAULT_TRACE)
    later = load(DEFAULT_TRACE, from_day=24, days=2, limit=5000)
    assert later.jobs and later.jobs[0].arrival == 0.0
    assert all(job.arrival < 2 * 86400 for job in later.jobs) and len(later.jobs) <= 5000
    offset = (later.start - whole.start).total_seconds()
    assert offset >= 24 * 86400
    assert not [job for job in whole.jobs if 24 * 86400 <= job.arrival < offset]  # nothing skipped in between
    assert load(DEFAULT_TRACE, from_day=10_000).jobs == []
