"""``manage.py tiering_seed`` (docs/tiering.md, "A fresh deployment: seed and train"), which ``make run`` runs: the
reference profiles and one trained model, so ``kind: auto`` answers from the first request instead of 409
``profile_first`` until the 6-hourly retrain (issue 29). Idempotent: a second run keeps the model."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tiering.models import Profile, TierModelRecord, Workload

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("tiering_seed", *args, stdout=out)
    return out.getvalue()


def test_tiering_seed_seeds_the_reference_set_and_trains_once_then_keeps_the_model():
    first = run("--count", "40", "--seed", "1")
    references = Workload.objects.filter(tenant=None).count()
    assert references > 0 and f"reference set: {references} workload(s) created" in first
    assert Profile.objects.filter(workload__tenant=None).exists()
    [model] = TierModelRecord.objects.all()
    assert f"model {model.pk} trained on {model.rows} rows" in first

    again = run("--count", "40", "--seed", "1")  # make run at every start: nothing new, nothing retrained
    assert "reference set: 0 workload(s) created" in again and f"model {model.pk} kept" in again
    assert TierModelRecord.objects.count() == 1 and Workload.objects.filter(tenant=None).count() == references

    retrained = run("--count", "40", "--seed", "1", "--retrain")
    assert TierModelRecord.objects.count() == 2 and "trained on" in retrained


def test_tiering_seed_refuses_a_count_out_of_bounds_writing_nothing():
    with pytest.raises(CommandError, match="--count"):
        run("--count", "0")
    assert not Workload.objects.exists() and not TierModelRecord.objects.exists()


def test_tiering_seed_in_the_background_queues_the_training_for_a_worker(monkeypatch):
    from tiering import tasks

    queued = []
    monkeypatch.setattr(tasks.model_retrain, "delay", lambda: queued.append("tiering.model_retrain"))
    out = run("--count", "40", "--seed", "1", "--background")
    assert "training queued (Celery tiering.model_retrain)" in out and queued == ["tiering.model_retrain"]
    assert Workload.objects.filter(tenant=None).exists() and not TierModelRecord.objects.exists()
    tasks.model_retrain.apply()  # what the worker runs: the model is trained
    assert TierModelRecord.objects.count() == 1
