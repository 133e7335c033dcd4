"""The lease request body is parsed without a serializer when every value is plainly valid
(``broker.api.serializers.lease_create_parse``): it must give exactly what ``LeaseCreateInput`` gives — the
same validated data, or the same errors naming the same fields — for every body, valid or not."""

import pytest
from django.test import override_settings
from rest_framework import serializers

from broker.api.serializers import LeaseCreateInput, lease_create_parse

MIG = {"kind": "mig", "profile": "1g.10gb"}
BODIES = [
    {"project": "load", "gpu": MIG},
    {"project": "load", "gpu": MIG, "duration_seconds": 3600},
    {"project": "load", "gpu": {"kind": "whole", "count": 2}, "workload_class": "inference", "priority": -100,
     "duration_seconds": 60},
    {"project": "load", "gpu": MIG, "workload_class": "training", "priority": 100, "workload": None},
    {"project": "load", "gpu": MIG, "workload": {"command": ["python", "train.py"]}},
    {"project": "p" * 63, "gpu": MIG},
    # refused, or unusual enough to go to the serializer
    {}, [], "load", None, {"gpu": MIG}, {"project": "load"}, {"project": "load", "gpu": None},
    {"project": "", "gpu": MIG}, {"project": " load ", "gpu": MIG}, {"project": "p" * 64, "gpu": MIG},
    {"project": 5, "gpu": MIG}, {"project": None, "gpu": MIG}, {"project": "lö", "gpu": MIG},
    {"project": "l\ud800", "gpu": MIG}, {"project": "l\x00", "gpu": MIG},
    {"project": "load", "gpu": "mig"}, {"project": "load", "gpu": [MIG]}, {"project": "load", "gpu": 1},
    {"project": "load", "gpu": MIG, "workload_class": "nope"}, {"project": "load", "gpu": MIG, "workload_class": 1},
    {"project": "load", "gpu": MIG, "workload_class": ""}, {"project": "load", "gpu": MIG, "workload_class": None},
    {"project": "load", "gpu": MIG, "priority": 101}, {"project": "load", "gpu": MIG, "priority": -101},
    {"project": "load", "gpu": MIG, "priority": True}, {"project": "load", "gpu": MIG, "priority": 1.5},
    {"project": "load", "gpu": MIG, "priority": "5"}, {"project": "load", "gpu": MIG, "priority": None},
    {"project": "load", "gpu": MIG, "duration_seconds": 0}, {"project": "load", "gpu": MIG, "duration_seconds": 10**9},
    {"project": "load", "gpu": MIG, "duration_seconds": 3600.0},
    {"project": "load", "gpu": MIG, "duration_seconds": None},
    {"project": "load", "gpu": MIG, "workload": "run"}, {"project": "load", "gpu": MIG, "workload": ["a"]},
    {"project": "load", "gpu": MIG, "extra": 1}, {"project": "load", "gpu": MIG, "group": "g"},
]


def _serializer(data):
    serializer = LeaseCreateInput(data=data)
    try:
        serializer.is_valid(raise_exception=True)
    except serializers.ValidationError as error:
        return "error", error.detail
    return "ok", dict(serializer.validated_data)


def _fast(data):
    try:
        return "ok", dict(lease_create_parse(data))
    except serializers.ValidationError as error:
        return "error", error.detail


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_lease_body_parse_equals_the_serializer(body):
    fast, generic = _fast(body), _serializer(body)
    assert fast == generic
    if fast[0] == "ok":  # the same types too (the request's hash is taken over them)
        assert [type(v) for v in fast[1].values()] == [type(generic[1][k]) for k in fast[1]]


@override_settings(LEASE_MIN_DURATION_SECONDS=120, LEASE_MAX_DURATION_SECONDS=600)
@pytest.mark.parametrize("duration", [60, 120, 600, 601])
def test_lease_body_parse_follows_the_duration_settings(duration):
    body = {"project": "load", "gpu": MIG, "duration_seconds": duration}
    assert _fast(body) == _serializer(body)


@pytest.mark.parametrize("body", BODIES[:6], ids=range(6))
def test_a_plainly_valid_body_builds_no_serializer(body, monkeypatch):
    import broker.api.serializers as module

    expected = _serializer(body)
    monkeypatch.setattr(module, "LeaseCreateInput", None)  # calling it would fail
    assert _fast(body) == expected
