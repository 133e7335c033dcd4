import threading

import pytest
from django.db import connection

from core.errors import QuotaExceeded, ValidationFailed
from tenants import services
from tenants.models import Quota
from tests.factories import make_project, make_tenant


@pytest.fixture
def acme(db):
    tenant = make_tenant("acme")
    services.tenant_quota_set(tenant=tenant, tier="H100-80GB", deserved_gpu_milli=4000, limit_gpu_milli=8000)
    return tenant


def test_quota_set_within_bound_and_update(acme):
    vision = make_project(acme, "vision")
    services.quota_set(project=vision, tier="h100-80gb", deserved_gpu_milli=3000, limit_gpu_milli=8000)
    quota = services.quota_set(project=vision, tier="H100-80GB", deserved_gpu_milli=4000, limit_gpu_milli=8000,
                               over_quota_weight=3)
    assert (quota.tier, quota.deserved_gpu_milli, quota.over_quota_weight) == ("H100-80GB", 4000, 3)
    assert Quota.objects.count() == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "field"),
    [
        ({"tier": "B300"}, ValidationFailed, "tier"),
        ({"tier": "L4"}, QuotaExceeded, "tier"),
        ({"deserved_gpu_milli": -1}, ValidationFailed, "deserved_gpu_milli"),
        ({"deserved_gpu_milli": 2000, "limit_gpu_milli": 1000}, ValidationFailed, "limit_gpu_milli"),
        ({"deserved_gpu_milli": 4001, "limit_gpu_milli": 8000}, QuotaExceeded, "deserved_gpu_milli"),
        ({"limit_gpu_milli": 9000}, QuotaExceeded, "limit_gpu_milli"),
        ({"over_quota_weight": -2}, ValidationFailed, "over_quota_weight"),
    ],
)
def test_quota_set_refuses_naming_field(acme, kwargs, error, field):
    vision = make_project(acme, "vision")
    args = {"tier": "H100-80GB", "deserved_gpu_milli": 1000, "limit_gpu_milli": 2000, **kwargs}
    with pytest.raises(error) as info:
        services.quota_set(project=vision, **args)
    assert info.value.field == field
    assert not Quota.objects.exists()


def test_tenant_quota_cannot_drop_below_projects(acme):
    vision = make_project(acme, "vision")
    services.quota_set(project=vision, tier="H100-80GB", deserved_gpu_milli=3000, limit_gpu_milli=6000)
    with pytest.raises(QuotaExceeded) as info:
        services.tenant_quota_set(tenant=acme, tier="H100-80GB", deserved_gpu_milli=2000, limit_gpu_milli=8000)
    assert info.value.field == "deserved_gpu_milli"
    with pytest.raises(QuotaExceeded) as info:
        services.tenant_quota_set(tenant=acme, tier="H100-80GB", deserved_gpu_milli=4000, limit_gpu_milli=5000)
    assert info.value.field == "limit_gpu_milli"


@pytest.mark.django_db(transaction=True)
def test_quota_set_racing_writers_cannot_oversell_tenant_quota():
    """Eight threads each try to take 1000 of a 4000 tenant quota for their own project at once."""
    tenant = make_tenant("acme")
    services.tenant_quota_set(tenant=tenant, tier="H100-80GB", deserved_gpu_milli=4000, limit_gpu_milli=8000)
    projects = [make_project(tenant, f"p{i}") for i in range(8)]
    barrier = threading.Barrier(len(projects))
    outcomes: list[str] = []

    def claim(project):
        try:
            barrier.wait()
            services.quota_set(project=project, tier="H100-80GB", deserved_gpu_milli=1000, limit_gpu_milli=1000)
            outcomes.append("ok")
        except QuotaExceeded:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=claim, args=(p,)) for p in projects]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["ok"] * 4 + ["refused"] * 4
    assert sum(Quota.objects.values_list("deserved_gpu_milli", flat=True)) == 4000
