"""Generation stages (issue 29: an LLM stage was modelled as one forward pass): a stage with ``task: generation``
takes its prompt's prefill (the time to first token) and then one decode step per output token, by the performance
model tiering uses; the plan shows each generation stage's time to first token and tokens/s, in the API and on the
portal page. Bad values name the field."""

import pytest
from django.test import Client

from broker import extensions
from gpus.performance import Workload, estimate, whole
from pipelines.planner.profiles import generation_profile_for, profile_for
from tests.factories import make_world


def test_a_generation_candidate_is_prefill_then_a_decode_step_per_token():
    [candidate] = [c for c in generation_profile_for("gpt2", ("H100-80GB",), (4,), prompt_tokens=256,
                                                     output_tokens=100) if c.slice.key == "H100-80GB"]
    prefill = estimate(Workload("gpt2", "inference", "fp16", 4, 256, 224), whole("H100-80GB"))
    decode = estimate(Workload("gpt2", "generation", "fp16", 4, 306, 224), whole("H100-80GB"))
    assert candidate.ttft_ms == pytest.approx(prefill.step_ms, rel=1e-3)
    assert candidate.exec_ms == pytest.approx(prefill.step_ms + 100 * decode.step_ms, rel=1e-3)
    assert candidate.tokens_per_s == pytest.approx(1000 / decode.step_ms, rel=1e-3)
    [one_pass] = [c for c in profile_for("gpt2", ("H100-80GB",), (4,)) if c.slice.key == "H100-80GB"]
    assert candidate.exec_ms > 10 * one_pass.exec_ms  # an answer is many steps, not one forward pass


def test_generation_needs_a_decoder():
    with pytest.raises(ValueError, match="decoder"):
        generation_profile_for("bert-base", ("H100-80GB",))


@pytest.fixture
def world(db):
    unregister = extensions.list_prices_register(lambda now: {"H100-80GB": 400, "A100-80GB": 250, "L4": 80})
    yield make_world()
    unregister()


ANSWER = {"project": "vision", "name": "chat", "slo_ms": 5000.0, "rate_rps": 2.0, "tiers": ["H100-80GB"],
          "stages": [{"name": "answer", "architecture": "gpt2", "task": "generation", "prompt_tokens": 256,
                      "output_tokens": 64}], "edges": []}


def test_a_plan_shows_a_generation_stages_time_to_first_token_and_tokens_per_second(world):
    client = world.client("member")
    pipeline = client.post("/api/v1/pipelines", ANSWER, format="json").json()
    answer = client.post(f"/api/v1/pipelines/{pipeline['id']}/plans", {}, format="json")
    assert answer.status_code == 201, answer.json()
    [stage] = answer.json()["result"]["stages"]
    assert stage["ttft_ms"] > 0 and stage["tokens_per_s"] > 0
    assert stage["exec_ms"] == pytest.approx(stage["ttft_ms"] + 64 * 1000 / stage["tokens_per_s"], rel=1e-2)
    assert stage["latency_ms"] >= stage["exec_ms"]
    portal = Client()
    assert portal.login(username="max", password="pw-max")
    page = portal.get(f"/pipelines/{pipeline['id']}").content.decode()
    assert f"first token {stage['ttft_ms']} ms, then {stage['tokens_per_s']} tokens/s" in page


@pytest.mark.parametrize(("stage", "status", "field"), [
    ({"architecture": "bert-base", "task": "generation"}, 422, "stages[0].task"),
    ({"architecture": "gpt2", "task": "generation", "output_tokens": 0}, 400, "stages[0].output_tokens"),
    ({"architecture": "gpt2", "task": "generation", "prompt_tokens": "many"}, 400, "stages[0].prompt_tokens"),
    ({"architecture": "gpt2", "task": "training"}, 400, "stages[0].task"),
])
def test_bad_generation_stages_name_the_field(world, stage, status, field):
    body = ANSWER | {"stages": [{"name": "answer"} | stage]}
    answer = world.client("member").post("/api/v1/pipelines", body, format="json")
    assert answer.status_code == status and answer.json()["field"] == field, answer.json()
