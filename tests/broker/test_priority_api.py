"""Priority through the API (issue 13, item 3): a member may send at most MEMBER_MAX_PRIORITY (403 naming
``priority`` beyond it, nothing written); and even an admin's priority 100 does not take an equal-weight
project's share of the idle GPUs."""

from collections import Counter

import pytest

from broker import services
from broker.choices import LeaseState
from broker.models import Lease
from tests.factories import make_project, make_quota, make_world


@pytest.fixture
def world(db):
    world = make_world()
    token = services.enrollment_token_create()
    services.node_enroll(node_id="n1", token=token, address="http://127.0.0.1:9/n/n1", inventory={"gpus": [
        {"index": i, "uuid": f"GPU-h100-{i}", "model": "H100-80GB", "mode": "whole", "memory_mib": 81559}
        for i in range(4)]})
    return world


@pytest.mark.parametrize(("who", "priority", "status"), [
    ("member", services.MEMBER_MAX_PRIORITY, 201),
    ("member", services.MEMBER_MAX_PRIORITY + 1, 403),
    ("member", 100, 403),
    ("member", -100, 201),
    ("admin", 100, 201),
    ("owner", 50, 201),
])
def test_priority_api_members_are_bounded(world, who, priority, status):
    response = world.client(who).post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "whole"},
                                                         "priority": priority}, format="json")
    assert response.status_code == status, response.json()
    if status == 403:
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["field"] == "priority"
        assert str(services.MEMBER_MAX_PRIORITY) in response.json()["detail"]
        assert not Lease.objects.exists()
    else:
        assert Lease.objects.get().priority == priority


def test_priority_api_outsider_gets_404_for_the_project(world):
    response = world.client("outsider").post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "whole"}},
                                             format="json")
    assert response.status_code == 404
    assert not Lease.objects.exists()


def test_priority_api_does_not_take_an_equal_weight_projects_share(world):
    # vision and nlp deserve nothing and borrow with equal weights; vision asks first with priority 0,
    # then an admin sends nlp's four requests with priority 100: the four GPUs are split 2 / 2
    for project in (world.project, make_project(world.acme, "nlp")):
        make_quota(project, deserved=0, limit=8000, tenant_deserved=4000, tenant_limit=32000)
    for _n in range(4):
        response = world.client("member").post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "whole"}},
                                               format="json")
        assert response.status_code == 201, response.json()
    for _n in range(4):
        response = world.client("admin").post("/api/v1/leases", {"project": "nlp", "gpu": {"kind": "whole"},
                                                                 "priority": 100}, format="json")
        assert response.status_code == 201, response.json()
    services.schedule_cycle()
    placed = Counter(Lease.objects.exclude(state=LeaseState.QUEUED).values_list("project__slug", flat=True))
    assert placed == {"vision": 2, "nlp": 2}



@pytest.mark.parametrize(("who", "priority", "refused"), [("member", 100, True), ("member", 10, False),
                                                          ("admin", 100, False)])
def test_priority_preview_applies_the_members_bound(world, who, priority, refused):
    """The preview (portal) says what the request would: a member's priority above the bound is refused,
    naming the field; an admin's is not."""
    from broker import selectors
    from core.errors import PermissionDenied
    from tenants.access import Actor

    user = {"member": world.member, "admin": world.admin}[who]
    actor = Actor(user=user, tenant=world.acme, role="member" if who == "member" else "admin")
    if refused:
        with pytest.raises(PermissionDenied) as error:
            selectors.lease_preview(actor=actor, project="vision", gpu={"kind": "whole"}, priority=priority)
        assert error.value.field == "priority"
    else:
        assert selectors.lease_preview(actor=actor, project="vision", gpu={"kind": "whole"},
                                       priority=priority).gpu
