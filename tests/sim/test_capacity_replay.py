"""The capacity replay (``bench.sim.capacity``) on the sparse start of the Philly trace (fast)."""

from bench.sim.capacity import Replay, main_capacity

SETTINGS = dict(days=20, load_factor=0.8, tick=300, cold_mig=30, cold_whole=10, warm_bind=0.5, price_minor=300,
                history_hours=6, queue_cap=64)


def run(loop: str) -> dict:
    replay = Replay(loop=loop, **SETTINGS)
    replay._last_warm_milli = {}
    return replay.run()


def test_capacity_replay_advise_changes_nothing_and_auto_keeps_guarantees():
    off, advise, auto = run("off"), run("advise"), run("auto")
    figures = ("fleet_allocation_pct", "idle_allocated_gpu_hours", "ttg_p95_s", "queue_wait_s", "started")
    assert {k: off[k] for k in figures} == {k: advise[k] for k in figures}
    assert advise["proposed"] and not advise["applied"]
    assert auto["applied"] and auto["in_quota_violations"] == 0 and off["in_quota_violations"] == 0
    assert auto["idle_allocated_gpu_hours"] < off["idle_allocated_gpu_hours"]


def test_capacity_replay_rejects_an_unknown_loop(capsys):
    assert main_capacity(["--loop", "sometimes"]) == 2
    assert "unknown loop" in capsys.readouterr().err
