"""An agent's workload events as lease events' reasons (``broker.services.workloads.describe``): a run restarted
by the agent after an elastic growth (a container restarted with the devices its lease grew onto) is not told as
a failure, a restart after a failure still is, and an event kind the broker has no words for keeps its detail."""

from broker.services.workloads import describe


def test_a_restart_after_a_failure_and_one_after_a_growth_are_told_apart():
    failed = {"kind": "restarted", "run": 2, "pid": 41, "restart_count": 1}
    grown = {**failed, "regrown": True}
    assert describe(failed) == "workload restarted after a failure (run 2, pid 41, RESTART_COUNT=1)"
    assert describe(grown) == "workload restarted with the devices its lease grew onto (run 2, pid 41, RESTART_COUNT=1)"
    assert describe({"kind": "started", "run": 1, "pid": 40, "restart_count": 0}) == (
        "workload started (run 1, pid 40, RESTART_COUNT=0)")


def test_the_agents_regrow_events_keep_their_detail():
    assert describe({"kind": "regrow", "run": 1, "detail": "the container restarts with its 2 device(s) in 10 s"}) == (
        "workload regrow: the container restarts with its 2 device(s) in 10 s")
    assert describe({"kind": "regrown", "run": 1, "detail": "ended for a new run with the devices grown onto"}) == (
        "workload regrown: ended for a new run with the devices grown onto")
