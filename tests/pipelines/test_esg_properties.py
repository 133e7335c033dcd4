"""Property tests (hypothesis) of the ESG planner on generated pipelines (random DAGs, slices, batch latencies):

- a plan never exceeds the SLO by its own latency model (recomputed here, independently of the planner);
- A* with dual-blade pruning returns the cost exhaustive search finds, on every pipeline small enough;
- ESG (dominator-based SLO distribution) finds a plan whenever one exists, and never a cheaper one than the
  optimum; the baseline never beats the optimum either;
- the dominator segments are sequential: every source-to-sink path passes every cut stage.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpus.performance import mig, share, whole
from pipelines.planner.esg import (
    Pipeline,
    PipelineError,
    Stage,
    _order,
    dominator_segments,
    option_for,
    plan_astar,
    plan_esg,
    plan_even_greedy,
    plan_exhaustive,
)
from pipelines.planner.profiles import Candidate

PRICES = {"H100-80GB": 400, "A100-80GB": 250, "L4": 80}
SLICES = (mig("H100-80GB", "1g.10gb"), mig("H100-80GB", "3g.40gb"), whole("H100-80GB"),
          mig("A100-80GB", "2g.20gb"), whole("A100-80GB"), share("L4", 250), share("L4", 500), whole("L4"))


@st.composite
def pipelines(draw, max_stages: int = 4, max_candidates: int = 4, dag: bool = True):
    count = draw(st.integers(1, max_stages))
    names = [f"s{i}" for i in range(count)]
    stages = []
    for name in names:
        candidates = draw(st.lists(st.tuples(st.sampled_from(SLICES), st.sampled_from((1, 2, 4, 8)),
                                             st.floats(0.5, 40.0, allow_nan=False)),
                                   min_size=1, max_size=max_candidates))
        stages.append(Stage(name, tuple(Candidate(s, b, round(ms, 3)) for s, b, ms in candidates)))
    edges = []
    for j in range(1, count):
        parents = draw(st.sets(st.integers(0, j - 1), max_size=2)) if dag else {j - 1}
        edges.extend((names[i], names[j]) for i in sorted(parents))
    rate = draw(st.sampled_from((5.0, 50.0, 400.0)))
    slo = draw(st.floats(2.0, 150.0, allow_nan=False))
    return Pipeline(tuple(stages), tuple(edges), round(slo, 3), rate)


def _own_latency(pipeline: Pipeline, plan) -> float:
    """The plan's end-to-end latency recomputed from its choices: the DAG's longest path."""
    latency = {c.stage: c.option.latency_ms for c in plan.choices}
    preds = {s.name: [a for a, b in pipeline.edges if b == s.name] for s in pipeline.stages}
    finish: dict[str, float] = {}
    pending = [s.name for s in pipeline.stages]
    while pending:
        for name in list(pending):
            if all(p in finish for p in preds[name]):
                finish[name] = max((finish[p] for p in preds[name]), default=0.0) + latency[name]
                pending.remove(name)
    return max(finish.values())


COMMON = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@COMMON
@given(pipelines())
def test_esg_plan_never_exceeds_the_slo_by_its_own_model(pipeline):
    for planner in (plan_esg, plan_astar):
        plan = planner(pipeline, PRICES)
        if plan.feasible:
            assert _own_latency(pipeline, plan) <= pipeline.slo_ms + 1e-6
            assert plan.latency_ms == pytest.approx(_own_latency(pipeline, plan))
            assert {c.stage for c in plan.choices} == {s.name for s in pipeline.stages}
            # each stage's instances carry the arrival rate at the utilisation cap
            for c in plan.choices:
                assert c.option.instances * c.option.batch / c.option.candidate.exec_ms * 1000 * 0.8 >= (
                    pipeline.rate_rps - 1e-6)


@COMMON
@given(pipelines())
def test_astar_with_dual_blade_pruning_equals_exhaustive_search(pipeline):
    exact = plan_exhaustive(pipeline, PRICES)
    astar = plan_astar(pipeline, PRICES)
    assert astar.feasible == exact.feasible
    if exact.feasible:
        assert astar.cost == exact.cost


@COMMON
@given(pipelines(max_stages=7, max_candidates=3))
def test_esg_with_slo_distribution_is_complete_and_never_below_the_optimum(pipeline):
    optimum = plan_astar(pipeline, PRICES)
    for group in (1, 2, 3):
        plan = plan_esg(pipeline, PRICES, group_stages=group)
        assert plan.feasible == optimum.feasible
        if plan.feasible:
            assert plan.cost >= optimum.cost
            assert _own_latency(pipeline, plan) <= pipeline.slo_ms + 1e-6
    baseline = plan_even_greedy(pipeline, PRICES)
    if baseline.feasible and optimum.feasible:
        assert baseline.cost >= optimum.cost


def _paths(order, preds):
    succs = {n: [m for m in order if n in preds[m]] for n in order}
    sources = [n for n in order if not preds[n]]

    def walk(node):
        if not succs[node]:
            yield [node]
        for nxt in succs[node]:
            for rest in walk(nxt):
                yield [node, *rest]

    for source in sources:
        yield from walk(source)


@COMMON
@given(pipelines(max_stages=8, max_candidates=1))
def test_dominator_segments_run_one_after_another(pipeline):
    order, preds = _order(pipeline)
    segments = dominator_segments(order, preds)
    assert sorted(itertools.chain.from_iterable(segments)) == sorted(order)
    index = {n: i for i, seg in enumerate(segments) for n in seg}
    for path in _paths(order, preds):
        # along any path the segment index never decreases, and it visits every segment from its first
        seen = [index[n] for n in path]
        assert seen == sorted(seen)
        assert set(seen) == set(range(len(segments)))
    for a, b in pipeline.edges:  # an edge between segments enters the next segment's first (cut) stage
        if index[a] != index[b]:
            assert index[b] == index[a] + 1 and segments[index[b]][0] == b


def test_dominators_of_a_diamond_chain():
    stages = tuple(Stage(n, (Candidate(SLICES[0], 1, 1.0),)) for n in "abcdefg")
    edges = (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e"), ("e", "f"), ("e", "g"))
    order, preds = _order(Pipeline(stages, edges, 10.0, 1.0))
    assert dominator_segments(order, preds) == [["a", "b", "c"], ["d"], ["e", "f", "g"]]


def test_configuration_model_batches_wait_and_instances_carry_the_rate():
    option = option_for(Candidate(whole("L4"), 8, 20.0), 100.0, PRICES)
    # a batch of 8 at 100 req/s fills in 70 ms; one instance does 8 / 20 ms = 400 req/s: 100 / (400 * 0.8) -> 1;
    # at load 0.25 a batch queues 0.25 / 1.5 x 20 ms (M/D/1)
    assert option.latency_ms == pytest.approx(70.0 + 20.0 + 20.0 / 6)
    assert option.instances == 1
    assert option.cost == 1000 * 80
    heavy = option_for(Candidate(mig("H100-80GB", "1g.10gb"), 1, 10.0), 1000.0, PRICES)
    assert heavy.instances == math.ceil(1000 * 0.010 / 0.8)  # 13 instances of 142 milli at 400 per GPU-hour
    assert heavy.cost == 13 * 142 * 400


def test_esg_on_a_long_chain_plans_fast_and_reports_its_split():
    stages = tuple(Stage(f"s{i}", tuple(Candidate(s, b, (1 + i % 3) * ms) for s in SLICES
                                        for b, ms in ((1, 3.0 / s.compute_fraction), (4, 6.0 / s.compute_fraction))))
                   for i in range(12))
    edges = tuple((f"s{i}", f"s{i + 1}") for i in range(11))
    pipeline = Pipeline(stages, edges, 300.0, 200.0)
    plan = plan_esg(pipeline, PRICES)
    assert plan.feasible and plan.latency_ms <= 300.0
    assert len(plan.split) == 3 and sum(len(g["stages"]) for g in plan.split) == 12
    assert plan.seconds < 1.0


@pytest.mark.parametrize(("edges", "field"), [
    ((("a", "zz"),), "edges[0]"),
    ((("a", "b"), ("b", "a")), "edges"),
    ((("a", "a"),), "edges[0]"),
])
def test_bad_pipelines_name_the_field(edges, field):
    stages = (Stage("a", (Candidate(SLICES[0], 1, 1.0),)), Stage("b", (Candidate(SLICES[0], 1, 1.0),)))
    with pytest.raises(PipelineError) as caught:
        plan_esg(Pipeline(stages, edges, 10.0, 1.0), PRICES)
    assert caught.value.field == field


def test_an_unreachable_slo_is_reported_not_planned():
    stages = (Stage("a", (Candidate(SLICES[0], 1, 50.0),)),)
    plan = plan_esg(Pipeline(stages, (), 10.0, 1.0), PRICES)
    assert not plan.feasible and "fastest" in plan.reason
