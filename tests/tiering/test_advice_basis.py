"""Advice says what it rests on (issue 31): a measurement of the workload on the suggested slice, another slice's
measurement scaled by the performance model, or a prediction, with the model's typical error for the workload's
regime. In the API (``basis``, ``expected_error``) and on the portal's pages, for the tenant only."""

import pytest
from django.db import IntegrityError, transaction
from django.test import Client
from django.utils import timezone

from broker.models import Lease
from gpus.measured import CROSS_VALIDATED_ERROR, expected_error
from tests.factories import make_world
from tiering.advice import _advice_save, figure_basis
from tiering.models import AdviceBasis, AdviceKind, TierAdvice, Workload

pytestmark = pytest.mark.django_db

EAGER_DECODE = {"name": "llama-chat", "architecture": "llama-2-7b", "task": "generation", "precision": "bf16",
                "batch_size": 16, "seq_len": 512, "target_throughput": 400.0, "regime": "eager"}


def test_figure_basis_measured_scaled_or_predicted_with_the_regimes_error():
    measured = figure_basis(slice_key="H100-80GB", how="measured", measured_keys={"H100-80GB"}, regime="eager",
                            task="generation")
    assert measured.basis == AdviceBasis.MEASURED and measured.expected_error is None
    assert "when measured" in measured.phrase(630.0)
    scaled = figure_basis(slice_key="H200-141GB", how="scaled from H100-80GB measurement",
                          measured_keys={"H100-80GB"}, regime="eager", task="generation")
    assert scaled.basis == AdviceBasis.SCALED and scaled.expected_error == CROSS_VALIDATED_ERROR["eager decode"]
    assert "scaled from H100-80GB" in scaled.phrase(630.0) and "±23%" in scaled.phrase(630.0)
    predicted = figure_basis(slice_key="L4", how="predicted", measured_keys=set(), regime="engine",
                             task="generation")
    assert predicted.basis == AdviceBasis.PREDICTED
    assert predicted.expected_error == CROSS_VALIDATED_ERROR["graph decode"] == expected_error("engine", "generation")
    assert "a prediction: typically within ±8%" in predicted.phrase(1500.0)


@pytest.fixture
def advised():
    """acme's eager decode workload on an H100 lease, with quantization advice (a prediction) and too-big advice
    (measured on the suggested slice), written by the advice scan's own service."""
    world = make_world()
    workload = Workload.objects.create(tenant=world.acme, **EAGER_DECODE)
    lease = Lease.objects.create(tenant=world.acme, project=world.project, kind="whole", duration_seconds=3600,
                                 state="active", tier="H100-80GB", requested_at=timezone.now())
    error = expected_error("eager", "generation")
    found = {
        AdviceKind.QUANTIZE: {"suggested": "A100-80GB", "saving": 1.2, "speedup": None, "reason": "quantized …",
                              "basis": AdviceBasis.PREDICTED, "expected_error": error},
        AdviceKind.TOO_BIG: {"suggested": "H100-80GB/mig/3g.40gb", "saving": 1.71, "speedup": None,
                             "reason": "too big …", "basis": AdviceBasis.MEASURED, "expected_error": None},
    }
    _advice_save(lease=lease, workload=workload, key="H100-80GB", found=found, evidence={"regime": "eager"},
                 now=timezone.now())
    return world, workload, lease


def test_the_api_says_what_each_advice_rests_on_and_the_outsider_sees_nothing(advised):
    world, workload, _lease = advised
    answer = world.client("member").get(f"/api/v1/workloads/{workload.name}/advice")
    assert answer.status_code == 200
    by_kind = {row["kind"]: row for row in answer.json()["results"]}
    assert by_kind["quantize"]["basis"] == "predicted"
    assert by_kind["quantize"]["expected_error"] == pytest.approx(CROSS_VALIDATED_ERROR["eager decode"])
    assert by_kind["too_big"]["basis"] == "measured" and by_kind["too_big"]["expected_error"] is None
    assert world.client("outsider").get(f"/api/v1/workloads/{workload.name}/advice").status_code == 404


def test_the_portal_shows_whether_the_figure_is_a_measurement_or_a_prediction(advised):
    world, workload, _lease = advised
    browser = Client()
    browser.force_login(world.member)
    page = browser.get("/advice").content.decode()
    assert 'data-advice-basis="predicted"' in page and "a prediction of the performance model, typically within ±23%" \
        in page
    assert 'data-advice-basis="measured"' in page and "a measurement on that slice" in page
    detail = browser.get(f"/workloads/{workload.name}").content.decode()
    assert "rests on a prediction of the performance model, typically within ±23%" in detail
    outsider = Client()
    outsider.force_login(world.outsider)
    assert "typically within" not in outsider.get("/advice").content.decode()


def test_the_database_refuses_a_prediction_without_its_error_or_a_measurement_with_one(advised):
    _world, _workload, lease = advised
    row = TierAdvice.objects.get(lease=lease, kind=AdviceKind.QUANTIZE)
    with pytest.raises(IntegrityError), transaction.atomic():
        TierAdvice.objects.filter(pk=row.pk).update(expected_error=None)
    with pytest.raises(IntegrityError), transaction.atomic():
        TierAdvice.objects.filter(pk=row.pk).update(basis=AdviceBasis.MEASURED)
    with pytest.raises(IntegrityError), transaction.atomic():
        TierAdvice.objects.filter(pk=row.pk).update(basis="guessed")
