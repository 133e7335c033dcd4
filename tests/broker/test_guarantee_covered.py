"""The schedule cycle records once per lease whether its project's guarantee covered it, counting the project's own
requests ahead of it (``Lease.guarantee_covered``; billing samples time to GPU by it: docs/billing.md)."""

import pytest

from broker import services
from broker.choices import LeaseState
from broker.models import Lease
from tests.factories import make_quota, make_world
from tests.portal.test_pages import fleet_node


@pytest.fixture
def world(db):
    world = make_world()
    fleet_node("n1", mode="whole", gpus=4)  # four H100s on a node whose agent answers nothing
    make_quota(world.project, deserved=2000, limit=2000)  # two GPUs guaranteed, no borrowing beyond them
    return world


def ask(world, who="member", priority=0):
    response = world.client(who).post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "whole"},
                                                         "priority": priority}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def test_the_cycle_records_coverage_once_counting_the_projects_own_queue(world):
    first = [ask(world) for _ in range(3)]
    assert set(Lease.objects.values_list("guarantee_covered", flat=True)) == {None}  # not known before a cycle
    services.schedule_cycle()
    rows = dict(Lease.objects.values_list("pk", "guarantee_covered"))
    assert [rows[pk] for pk in first] == [True, True, False]
    states = dict(Lease.objects.values_list("pk", "state"))
    assert states[first[2]] == LeaseState.QUEUED  # the third waits behind its own project's two
    # an admin's urgent request comes ahead of the waiting one in the project's order, but the guarantee is held
    urgent = ask(world, "admin", priority=50)
    services.schedule_cycle()
    rows = dict(Lease.objects.values_list("pk", "guarantee_covered"))
    assert rows[urgent] is False and rows[first[2]] is False  # written once: the later cycle leaves it


def test_the_api_and_the_portal_say_whether_the_lease_is_covered(world, client):
    from tests.portal.test_pages import login, text

    leases = [ask(world) for _ in range(3)]
    answer = world.client("member").get(f"/api/v1/leases/{leases[0]}").json()
    assert answer["guarantee_covered"] is None
    services.schedule_cycle()
    assert world.client("member").get(f"/api/v1/leases/{leases[0]}").json()["guarantee_covered"] is True
    assert world.client("member").get(f"/api/v1/leases/{leases[2]}").json()["guarantee_covered"] is False
    page = text(login(client, world.member.username).get(f"/leases/{leases[2]}"))
    assert "not covered when requested" in page and "its wait is not an SLO sample" in page


def test_the_quote_says_whether_the_guarantee_would_cover_it(world, client):
    def quote():
        response = world.client("member").post("/api/v1/quotes", {"project": "vision", "gpu": {"kind": "whole"}},
                                               format="json")
        assert response.status_code == 200, response.json()
        return response.json()

    assert quote()["guarantee_covered"] is True
    ask(world)
    assert quote()["guarantee_covered"] is True  # one queued ahead: two of two guaranteed GPUs
    ask(world)
    answer = quote()  # two queued ahead take the whole guarantee
    assert answer["guarantee_covered"] is False
    # the portal's preview says so beside "within the guaranteed quota" (the two ahead are only queued: by the quota
    # alone this one is within it)
    from tests.portal.test_pages import login, text

    login(client, world.member.username)
    page = text(client.get("/leases/preview", {"project": "vision", "gpu.kind": "whole", "gpu.model": "H100-80GB",
                                               "duration_seconds": "3600"}))
    assert ("Within the guaranteed quota : never preempted. The project's own requests queued ahead of it take its "
            "guarantee: its wait would not count toward the time-to-GPU SLO.") in page
