"""Node identity (issue 13, items 1 and 13a): a GPU belongs to the node that enrolled it until staff release
it; an enrolled node re-enrolls only with its own secret or staff approval; a refused enrollment writes
nothing and spends no token use; a forged token is 401."""

import json

import pytest
from django.core.management import call_command
from django.db import transaction

from agent.protocol import sign
from broker import services
from broker.models import EnrollmentToken, Gpu, Node
from tenants.models import AuditEvent

ENROLL = "/api/v1/agents/enroll"


def _gpu(uuid: str, index: int = 0) -> dict:
    return {"index": index, "uuid": uuid, "model": "H100-80GB", "mode": "whole", "memory_mib": 81559}


def _body(node_id: str, token: str, *gpus: dict, address: str = "") -> dict:
    return {"node_id": node_id, "token": token, "address": address or f"http://127.0.0.1:9/n/{node_id}",
            "inventory": {"gpus": list(gpus), "instances": []}}


def _headers(signed: dict) -> dict:
    return {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in signed.items()}


@pytest.fixture
def victim(world):
    token = services.enrollment_token_create()
    return services.node_enroll(node_id="victim", token=token, address="http://10.0.0.5:9400",
                                inventory={"gpus": [_gpu("GPU-victim-0"), _gpu("GPU-victim-1", 1)]})


def _uses_left(token: str) -> int:
    return EnrollmentToken.objects.get(prefix=token.split("_")[2]).uses_left


def test_node_enrollment_refuses_another_nodes_gpu_and_spends_nothing(world, victim):
    client = world.client("outsider")
    token = services.enrollment_token_create()
    response = client.post(ENROLL, _body("intruder", token, _gpu("GPU-new", 0), _gpu("GPU-victim-1", 1)),
                           format="json")
    assert response.status_code == 409, response.content
    assert response["Content-Type"].startswith("application/problem+json")
    assert response.json()["field"] == "inventory.gpus[1]" and "victim" in response.json()["detail"]
    # nothing written, the token's use not spent
    assert not Node.objects.filter(node_id="intruder").exists()
    assert not Gpu.objects.filter(uuid="GPU-new").exists()
    assert Gpu.objects.get(uuid="GPU-victim-1").node.node_id == "victim"
    assert _uses_left(token) == 1
    # the same token still enrolls the node with GPUs of its own
    ok = client.post(ENROLL, _body("intruder", token, _gpu("GPU-new")), format="json")
    assert ok.status_code == 201 and _uses_left(token) == 0


def test_node_enrollment_of_an_enrolled_node_needs_its_secret_or_staff_approval(world, victim):
    client = world.client("outsider")
    token = services.enrollment_token_create()
    before = Node.objects.get(node_id="victim")
    takeover = client.post(ENROLL, _body("victim", token, _gpu("GPU-victim-0"), address="http://10.6.6.6:9400"),
                           format="json")
    assert takeover.status_code == 409 and takeover.json()["field"] == "node_id"
    after = Node.objects.get(node_id="victim")
    assert (after.secret, after.address) == (before.secret, before.address)
    assert _uses_left(token) == 1
    # staff approve once (audited): the next token enrollment goes through, then the approval is spent
    call_command("node_reenroll_approve", "victim", reason="disk replaced")
    assert AuditEvent.objects.filter(action="node.reenroll_approve", target="victim").exists()
    again = client.post(ENROLL, _body("victim", token, _gpu("GPU-victim-0"), _gpu("GPU-victim-1", 1),
                                      address="http://10.0.0.6:9400"), format="json")
    assert again.status_code == 201
    node = Node.objects.get(node_id="victim")
    assert node.secret == again.json()["secret"] != before.secret and node.address == "http://10.0.0.6:9400"
    assert node.reenroll_approved_at is None
    assert AuditEvent.objects.get(action="node.reenroll", target="victim").data["how"] == "approved"
    later = services.enrollment_token_create()
    assert client.post(ENROLL, _body("victim", later, _gpu("GPU-victim-0")), format="json").status_code == 409


def test_node_enrollment_signed_with_the_nodes_secret_rotates_it_once(world, victim):
    client = world.client("outsider")
    body = json.dumps(_body("victim", "", _gpu("GPU-victim-0"), _gpu("GPU-victim-1", 1),
                            address="http://10.0.0.7:9400")).encode()
    headers = _headers(sign(victim.secret, "victim", "POST", ENROLL, body))
    rotated = client.generic("POST", ENROLL, body, content_type="application/json", **headers)
    assert rotated.status_code == 201, rotated.content
    node = Node.objects.get(node_id="victim")
    assert node.secret == rotated.json()["secret"] != victim.secret and node.address == "http://10.0.0.7:9400"
    # the captured request cannot be replayed, and the old secret signs nothing any more
    replay = client.generic("POST", ENROLL, body, content_type="application/json", **headers)
    assert replay.status_code == 401
    stale = client.generic("POST", ENROLL, body, content_type="application/json",
                           **_headers(sign(victim.secret, "victim", "POST", ENROLL, body)))
    assert stale.status_code == 401 and Node.objects.get(node_id="victim").secret == node.secret


def test_node_reconcile_inventory_cannot_claim_another_nodes_gpu(world, victim):
    from django.utils import timezone

    token = services.enrollment_token_create()
    other = services.node_enroll(node_id="other", token=token, address="http://10.0.0.8:9400",
                                 inventory={"gpus": [_gpu("GPU-other-0")]})
    # what node_reconcile does with the agent's inventory: the foreign GPU is left out, not moved
    with transaction.atomic():
        refused = services.node_inventory_sync(node=other, inventory={"gpus": [_gpu("GPU-other-0"),
                                                                               _gpu("GPU-victim-0", 1)]},
                                               now=timezone.now())
    assert refused == [1]
    gpu = Gpu.objects.get(uuid="GPU-victim-0")
    assert gpu.node.node_id == "victim" and gpu.lost_at is None


def test_node_gpu_released_by_staff_may_be_claimed(world, victim):
    client = world.client("outsider")
    call_command("gpu_release", "GPU-victim-1", reason="moved to rack 9")
    audit = AuditEvent.objects.get(action="gpu.release", target="GPU-victim-1")
    assert audit.data["node"] == "victim"
    assert Gpu.objects.get(uuid="GPU-victim-1").lost_at is not None  # out of scheduling meanwhile
    token = services.enrollment_token_create()
    response = client.post(ENROLL, _body("rack9", token, _gpu("GPU-victim-1")), format="json")
    assert response.status_code == 201
    gpu = Gpu.objects.get(uuid="GPU-victim-1")
    assert gpu.node.node_id == "rack9" and gpu.released_at is None and gpu.lost_at is None


def test_node_enrollment_with_a_forged_token_is_401(world):
    response = world.client("outsider").post(ENROLL, _body("n9", "gpub_enroll_00000000_forged"), format="json")
    assert response.status_code == 401
    assert response["Content-Type"].startswith("application/problem+json") and response.json()["field"] == "token"
    assert not Node.objects.filter(node_id="n9").exists()


def test_node_admin_actions_are_audited(world, victim, admin_client):
    response = admin_client.post("/admin/broker/node/", {"action": "approve_reenrollment",
                                                         "_selected_action": [victim.pk]})
    assert response.status_code == 302
    assert Node.objects.get(pk=victim.pk).reenroll_approved_at is not None
    gpu = Gpu.objects.get(uuid="GPU-victim-0")
    admin_client.post("/admin/broker/gpu/", {"action": "release", "_selected_action": [gpu.pk]})
    assert AuditEvent.objects.filter(action="gpu.release", target="GPU-victim-0", actor__isnull=False).exists()


def test_node_enrollment_token_revoked_by_staff_enrolls_nothing(world, admin_client):
    token, other = services.enrollment_token_create(uses=5), services.enrollment_token_create(uses=2)
    prefix = token.split("_")[2]
    assert AuditEvent.objects.filter(action="node.enrollment_token_create", target=prefix).exists()
    call_command("agent_token_revoke", prefix, "--reason", "leaked in a ticket")
    response = world.client("outsider").post(ENROLL, _body("late", token, _gpu("GPU-late")), format="json")
    assert response.status_code == 401 and not Node.objects.filter(node_id="late").exists()
    assert AuditEvent.objects.get(action="node.enrollment_token_revoke", target=prefix).data == {
        "uses_taken": 5, "reason": "leaked in a ticket"}
    # the admin action does the same, audited with the staff member
    record = EnrollmentToken.objects.get(prefix=other.split("_")[2])
    admin_client.post("/admin/broker/enrollmenttoken/", {"action": "revoke", "_selected_action": [record.pk]})
    assert _uses_left(other) == 0
    assert AuditEvent.objects.filter(action="node.enrollment_token_revoke", target=record.prefix,
                                     actor__isnull=False).exists()


@pytest.mark.parametrize("key,value", [("index", 40_000), ("index", -1), ("memory_mib", 1 << 40), ("memory_mib", 0)])
def test_node_enrollment_with_out_of_range_inventory_numbers_is_400(world, key, value):
    """A GPU index or memory past what its column holds was a 500 (smallint/integer out of range)."""
    token = services.enrollment_token_create()
    gpu = {**_gpu("GPU-odd"), key: value}
    response = world.client("outsider").post(ENROLL, _body("odd", token, gpu), format="json")
    assert response.status_code == 400, response.content
    assert response.json()["field"] in ("inventory.gpus[0]", f"inventory.gpus[0].{key}")
    assert not Node.objects.filter(node_id="odd").exists() and _uses_left(token) == 1


@pytest.mark.django_db(transaction=True)
def test_node_enrollment_racing_enrollments_never_overspend_a_token():
    """The token's use is taken last, by a conditional UPDATE (its row is not locked while the node is written):
    twelve nodes enrolling at once with a token good for five leave exactly five nodes, each with its GPUs, and
    the others refused with nothing written."""
    import threading

    from django.db import connection

    from broker.services.nodes import AgentUnauthenticated

    token = services.enrollment_token_create(uses=5)
    barrier = threading.Barrier(12)
    outcomes: list[str] = []

    def enroll(number: int) -> None:
        try:
            barrier.wait()
            services.node_enroll(node_id=f"rack-{number}", token=token, address=f"http://10.0.1.{number}:9400",
                                 inventory={"gpus": [_gpu(f"GPU-rack-{number}-{i}", i) for i in range(4)]})
            outcomes.append("enrolled")
        except AgentUnauthenticated:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=enroll, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["enrolled"] * 5 + ["refused"] * 7
    assert _uses_left(token) == 0
    enrolled = set(Node.objects.filter(node_id__startswith="rack-").values_list("pk", flat=True))
    assert len(enrolled) == 5
    assert Gpu.objects.filter(uuid__startswith="GPU-rack-").count() == 20
    assert set(Gpu.objects.filter(uuid__startswith="GPU-rack-").values_list("node_id", flat=True)) == enrolled


def test_node_enrollment_answer_lost_is_given_again_until_the_secret_is_used(world, settings):
    """An agent whose 201 was lost retries with the same token and enrollment id: it gets the same secret
    (no token use spent, audited). Once the node signed a request with that secret, or with another id, or
    after the replay window, the node id is enrolled as before (409)."""
    client = world.client("outsider")
    token = services.enrollment_token_create(uses=2)
    body = {**_body("racked", token, _gpu("GPU-racked-0")), "enrollment_id": "a" * 32}
    first = client.post(ENROLL, body, format="json")
    assert first.status_code == 201, first.content
    assert _uses_left(token) == 1
    again = client.post(ENROLL, body, format="json")
    assert again.status_code == 201 and again.json()["secret"] == first.json()["secret"]
    assert _uses_left(token) == 1
    assert AuditEvent.objects.filter(action="node.enroll.repeated", target="racked").count() == 1
    # another id (someone else holding the token) gets nothing
    other = client.post(ENROLL, {**body, "enrollment_id": "b" * 32}, format="json")
    assert other.status_code == 409 and other.json()["field"] == "node_id"
    # without an id, as before
    assert client.post(ENROLL, _body("racked", token, _gpu("GPU-racked-0")), format="json").status_code == 409
    # the agent's first signed request (its heartbeat) spends the replay
    beat = json.dumps({"time": 0}).encode()
    path = "/api/v1/agents/racked/heartbeat"
    assert client.generic("POST", path, beat, content_type="application/json",
                          **_headers(sign(first.json()["secret"], "racked", "POST", path, beat))).status_code == 200
    assert Node.objects.get(node_id="racked").secret_used_at is not None
    late = client.post(ENROLL, body, format="json")
    assert late.status_code == 409 and late.json()["field"] == "node_id"
    assert Node.objects.get(node_id="racked").secret == first.json()["secret"] and _uses_left(token) == 1


def test_node_enrollment_answer_is_not_repeated_after_the_window(world, settings):
    settings.ENROLLMENT_REPLAY_SECONDS = 0
    client = world.client("outsider")
    token = services.enrollment_token_create(uses=2)
    body = {**_body("slow", token, _gpu("GPU-slow-0")), "enrollment_id": "c" * 32}
    assert client.post(ENROLL, body, format="json").status_code == 201
    late = client.post(ENROLL, body, format="json")
    assert late.status_code == 409 and late.json()["field"] == "node_id" and _uses_left(token) == 1


@pytest.mark.parametrize("value", ["short", "x" * 129, "spaces are not allowed here!"])
def test_node_enrollment_id_out_of_shape_is_400(world, value):
    token = services.enrollment_token_create()
    response = world.client("outsider").post(ENROLL, {**_body("shape", token, _gpu("GPU-shape-0")),
                                                      "enrollment_id": value}, format="json")
    assert response.status_code == 400 and response.json()["field"] == "enrollment_id"
    assert _uses_left(token) == 1


# -- node addresses within NODE_ADDRESS_NETWORKS (issue 27, item 10) ---------------------------------------------
AGENT_NETWORKS = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"]  # the agents' private networks
OUTSIDE = ["http://127.0.0.1:9400", "http://127.1:9400", "http://[::1]:9400", "http://169.254.169.254/latest",
           "http://0.0.0.0:9400", "http://8.8.8.8:9400", "http://[fe80::1]:9400", "http://[::ffff:127.0.0.1]:9400",
           "http://[::ffff:10.0.0.5]:9400", "http://localhost:9400", "http://metadata.google.internal/",
           "http://10.0.0.5.nip.io:9400", "http://2130706433:9400", "http://0x7f000001:9400"]
NOT_URLS = {"http://127.1:9400", "http://2130706433:9400", "http://0x7f000001:9400"}


@pytest.mark.parametrize("address", OUTSIDE)
def test_node_enrollment_refuses_an_address_outside_the_agents_networks(world, settings, address):
    settings.NODE_ADDRESS_NETWORKS = AGENT_NETWORKS
    token = services.enrollment_token_create()
    response = world.client("outsider").post(ENROLL, _body("stray", token, _gpu("GPU-stray"), address=address),
                                             format="json")
    # short and numeric IPv4 spellings are not URLs to the serializer already (400); the rest is the network rule's
    assert response.status_code == (400 if address in NOT_URLS else 422), (address, response.content)
    assert response["Content-Type"].startswith("application/problem+json") and response.json()["field"] == "address"
    assert "NODE_ADDRESS_NETWORKS" in response.json()["detail"] or address in NOT_URLS
    assert not Node.objects.filter(node_id="stray").exists() and _uses_left(token) == 1


@pytest.mark.parametrize("address", ["http://10.0.0.5:9400", "http://172.16.3.4:9400/n/x", "https://192.168.1.2:9400",
                                     "http://[fd00::5]:9400"])
def test_node_enrollment_accepts_an_address_inside_the_agents_networks(world, settings, address):
    settings.NODE_ADDRESS_NETWORKS = AGENT_NETWORKS
    token = services.enrollment_token_create()
    response = world.client("outsider").post(ENROLL, _body("placed", token, address=address), format="json")
    assert response.status_code == 201, response.content
    assert Node.objects.get(node_id="placed").address == address


def test_node_reenrollment_cannot_move_a_node_outside_the_agents_networks(world, victim, settings):
    settings.NODE_ADDRESS_NETWORKS = AGENT_NETWORKS
    body = json.dumps(_body("victim", "", _gpu("GPU-victim-0"), _gpu("GPU-victim-1", 1),
                            address="http://169.254.169.254:80/latest")).encode()
    moved = world.client("outsider").generic("POST", ENROLL, body, content_type="application/json",
                                              **_headers(sign(victim.secret, "victim", "POST", ENROLL, body)))
    assert moved.status_code == 422 and moved.json()["field"] == "address"
    node = Node.objects.get(node_id="victim")
    assert node.address == "http://10.0.0.5:9400" and node.secret == victim.secret


def test_node_address_networks_default_leaves_out_loopback_link_local_and_public(settings):
    import ipaddress

    networks = [ipaddress.ip_network(n) for n in settings.DEFAULT_NODE_ADDRESS_NETWORKS]
    for outside in ("127.0.0.1", "::1", "169.254.169.254", "fe80::1", "8.8.8.8", "0.0.0.0", "::"):
        assert not any(ipaddress.ip_address(outside) in n for n in networks)
    for inside in ("10.0.0.5", "192.168.1.2", "172.16.0.1", "fd00::5"):
        assert any(ipaddress.ip_address(inside) in n for n in networks)


def test_node_enrollment_on_loopback_when_configured_as_in_the_demo(world, settings):
    settings.NODE_ADDRESS_NETWORKS = [*AGENT_NETWORKS, "127.0.0.0/8", "::1/128"]
    token = services.enrollment_token_create()
    response = world.client("outsider").post(ENROLL, _body("demo", token), format="json")  # http://127.0.0.1:9/…
    assert response.status_code == 201, response.content
