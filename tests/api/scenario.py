"""What the contract tests need besides make_world(), and a scripted session over HTTP that produces, with the contract
test's hand-written cases, every documented status without the fuzzer's help: the 2xx of detail routes, renew,
release, invoice documents, enrollment and a signed heartbeat; 402 from a refusing spend cap; each documented 409; a
quote's 200/403/404; the capacity loop's adjustments (decided twice: 409), a project's idle reclaim opt-in (a
member's 403) and the loop's platform-staff API, and the money API (spend caps; price books and billing terms, staff
only), with a staff member's token (the fuzzer acts as an owner, whom every staff endpoint refuses).

Only three writes bypass the services, each standing in for a part these tests do not run: the invoice
(``invoice_run`` needs a metered month), a lease's placement (the scheduler and a node agent) and the
capacity loop's advice (the planner needs metered series).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.db.backends.postgresql.psycopg_any import NumericRange
from django.utils import timezone

from agent.protocol import sign
from billing import services as billing
from billing.choices import InvoiceStatus, LineKind
from billing.models import Invoice, InvoiceLine
from broker import services as broker
from broker.models import Allocation, Gpu, Lease
from tenants.choices import Role
from tenants.models import Membership
from tests.factories import World, make_member, make_project, make_quota, make_token

INVENTORY = {"gpus": [{"index": 0, "uuid": "GPU-contract-0", "model": "H100-80GB", "mode": "whole",
                       "memory_mib": 81559}]}


def call(url: str, method: str, path: str, *, token: str | None = None, body: object = None,
         raw: bytes | None = None, content_type: str = "application/json",
         headers: dict | None = None) -> tuple[int, dict, bytes]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url + path, data=data, method=method.upper(), headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", content_type)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


@dataclass
class Contract:
    world: World
    enrollment_token: str
    invoice_id: int
    leaver_id: int  # a member the session removes (204)
    capped: str = "capped"  # a project whose refusing spend cap is already spent (402)
    produced: set = field(default_factory=set)


def seed(world: World) -> Contract:
    """Prices, a project under a spent spend cap, a member to remove, a finalized invoice, an enrollment
    token. Committed (``transactional_db``) so the live server sees them."""
    billing.price_book_create(name="list", currency="USD", effective_from=datetime(2025, 1, 1, tzinfo=UTC),
                              rates=[{"tier": "H100-80GB", "per_hour": "4.00"}])
    capped = make_project(world.acme, "capped")
    make_quota(capped)
    billing.spend_cap_create(tenant=world.acme, project=capped, monthly_minor=1)  # refuse: any lease costs more
    leaver = make_member(world.acme, "lea", Role.MEMBER)
    now = timezone.now()
    invoice = Invoice.objects.create(tenant=world.acme, period=date(2026, 1, 1), currency="USD",
                                     subtotal_minor=400, total_minor=400, computed_at=now)
    InvoiceLine.objects.create(invoice=invoice, position=1, kind=LineKind.USAGE, description="H100-80GB vision",
                               unit="GPU-hour", quantity=Decimal(1), unit_price=Decimal(4), amount_minor=400,
                               project=world.project, tier="H100-80GB", gpu_hours=Decimal(1))
    Invoice.objects.filter(pk=invoice.pk).update(status=InvoiceStatus.FINALIZED, finalized_at=now,
                                                 number=f"GPUB-202601-{invoice.pk:06d}")
    return Contract(world=world, enrollment_token=broker.enrollment_token_create(uses=2),
                    invoice_id=invoice.pk, leaver_id=Membership.objects.get(user=leaver).pk)


def place(lease_id: int) -> None:
    """Stand-in for the scheduler and the agent: the lease is ACTIVE on the enrolled node's GPU."""
    now = timezone.now()
    lease = Lease.objects.get(pk=lease_id)
    Lease.objects.filter(pk=lease_id).update(state="active", active_at=now, ends_at=now + timedelta(hours=1),
                                             tier="H100-80GB", reason="running")
    Allocation.objects.create(lease=lease, gpu=Gpu.objects.get(uuid="GPU-contract-0"), tier="H100-80GB",
                              kind="whole", slots=NumericRange(0, 8), milli=1000, memory_mib=81559, state="ready",
                              device_uuid="GPU-contract-0", ready_at=now)


def scripted_session(url: str, contract: Contract) -> set[tuple[str, str, int]]:
    """Each step asserts the status it is there to produce; returns (path template, method, status)."""
    world, owner = contract.world, contract.world.tokens["owner"]
    produced: set[tuple[str, str, int]] = set()

    def step(template: str, method: str, expected: int, path: str | None = None, **kwargs) -> dict:
        status, _, content = call(url, method, path or template, **kwargs)
        assert status == expected, (method, path or template, status, content[:400])
        produced.add((template, method, status))
        return json.loads(content) if content and content[:1] in (b"{", b"[") else {}

    v1 = "/api/v1"
    for read in ("tenant", "projects", "leases", "members", "tokens", "invoices", "slo-contracts", "quotas",
                 "offers", "usage", "credit-notes", "credits", "ssh-keys", "webhooks", "workloads", "pipelines",
                 "tenant/exports", "tenant/sign-in"):  # every read answers 200 without relying on the fuzzer's draws
        step(f"{v1}/{read}", "get", 200, token=owner)
    step(f"{v1}/tenant", "patch", 200, token=owner, body={"name": "Acme"})
    step(f"{v1}/projects", "post", 201, token=owner, body={"slug": "scratch", "name": "Scratch"})
    step(f"{v1}/projects", "post", 409, token=owner, body={"slug": "scratch", "name": "Again"})  # slug taken
    step(f"{v1}/projects/{{slug}}", "get", 200, f"{v1}/projects/scratch", token=owner)
    step(f"{v1}/projects/{{slug}}", "patch", 200, f"{v1}/projects/scratch", token=owner, body={"description": "x"})
    step(f"{v1}/projects/{{slug}}", "delete", 204, f"{v1}/projects/scratch", token=owner)
    step(f"{v1}/projects/{{slug}}", "get", 404, f"{v1}/projects/scratch", token=owner)  # gone

    request = {"project": world.project.slug, "gpu": {"kind": "whole", "model": "H100-80GB"}}
    keyed = {"Idempotency-Key": "contract-1"}
    running = step(f"{v1}/leases", "post", 201, token=owner, body=request, headers=keyed)
    step(f"{v1}/leases", "post", 200, token=owner, body=request, headers=keyed)  # the same lease again
    step(f"{v1}/leases", "post", 409, token=owner, headers=keyed,  # the key with another body
         body={**request, "duration_seconds": 7200})
    queued = step(f"{v1}/leases", "post", 201, token=owner, body={"project": world.project.slug,
                                                                   "gpu": {"kind": "mig", "profile": "1g.10gb"}})
    step(f"{v1}/leases", "post", 402, token=owner, body={**request, "project": contract.capped})
    step(f"{v1}/leases", "post", 404, token=owner, body={**request, "project": "no-such-project"})
    # a quote writes nothing: a read-only token may ask; a spent cap is an answer (refuse), not a 402
    step(f"{v1}/quotes", "post", 200, token=owner, body=request)
    assert step(f"{v1}/quotes", "post", 200, token=world.tokens["viewer"],
                body={**request, "project": contract.capped})["budget"]["outcome"] == "refuse"
    step(f"{v1}/quotes", "post", 403, token=world.tokens["viewer"], body={**request, "priority": 50})
    step(f"{v1}/quotes", "post", 404, token=owner, body={**request, "project": "no-such-project"})
    step(f"{v1}/quotes", "post", 409, token=owner, body={**request, "gpu": {"kind": "whole", "model": "L4"}})
    renew = f"{v1}/leases/{{id}}/renew"
    step(renew, "post", 409, f"{v1}/leases/{queued['id']}/renew", token=owner, body={"duration_seconds": 600})
    step(renew, "post", 404, f"{v1}/leases/999999999/renew", token=owner, body={"duration_seconds": 600})

    enroll = {"node_id": "contract-node", "token": contract.enrollment_token, "address": "http://127.0.0.1:9/",
              "inventory": INVENTORY}
    step(f"{v1}/agents/enroll", "post", 401, body={**enroll, "token": "gpub_enroll_00000000_forged"})
    # an address outside NODE_ADDRESS_NETWORKS (the cloud metadata service): refused before the token is spent
    step(f"{v1}/agents/enroll", "post", 422, body={**enroll, "address": "http://169.254.169.254/latest"})
    node = step(f"{v1}/agents/enroll", "post", 201, body=enroll)
    step(f"{v1}/agents/enroll", "post", 409, body=enroll)  # the node id is enrolled; only its secret re-enrolls
    beat_path = f"{v1}/agents/contract-node/heartbeat"
    body = json.dumps({"inventory": INVENTORY}).encode()
    step(f"{v1}/agents/{{node_id}}/heartbeat", "post", 200, beat_path, raw=body,
         headers=sign(node["secret"], "contract-node", "POST", beat_path, body))

    place(running["id"])
    step(f"{v1}/leases/{{id}}", "get", 200, f"{v1}/leases/{running['id']}", token=owner)
    step(renew, "post", 200, f"{v1}/leases/{running['id']}/renew", token=owner, body={"duration_seconds": 600})
    # a refusing cap on its project, already spent: renewing for longer would pass it (402), nothing changes
    cap = billing.spend_cap_create(tenant=world.acme, project=world.project, monthly_minor=1)
    step(renew, "post", 402, f"{v1}/leases/{running['id']}/renew", token=owner, body={"duration_seconds": 86400})
    billing.spend_cap_delete(cap=cap)
    step(f"{v1}/leases/{{id}}", "delete", 202, f"{v1}/leases/{queued['id']}", token=owner)
    step(f"{v1}/leases/{{id}}", "delete", 202, f"{v1}/leases/{queued['id']}", token=owner)  # idempotent
    step(f"{v1}/projects/{{slug}}", "delete", 409, f"{v1}/projects/{world.project.slug}", token=owner)

    mine = Membership.objects.get(user=world.owner, tenant=world.acme).pk
    members = f"{v1}/members/{{id}}"
    step(members, "get", 200, f"{v1}/members/{mine}", token=owner)
    step(members, "patch", 409, f"{v1}/members/{mine}", token=owner, body={"role": "admin"})  # the last owner
    step(members, "delete", 409, f"{v1}/members/{mine}", token=owner)  # the last owner cannot leave
    step(members, "patch", 200, f"{v1}/members/{contract.leaver_id}", token=owner, body={"role": "viewer"})
    step(members, "delete", 204, f"{v1}/members/{contract.leaver_id}", token=owner)
    step(members, "get", 404, f"{v1}/members/{contract.leaver_id}", token=owner)  # gone

    token = step(f"{v1}/tokens", "post", 201, token=owner, body={"name": "ci", "scopes": ["read"]})
    step(f"{v1}/tokens/{{id}}", "get", 200, f"{v1}/tokens/{token['id']}", token=owner)
    step(f"{v1}/tokens/{{id}}", "delete", 200, f"{v1}/tokens/{token['id']}", token=owner)

    import asyncssh  # a fresh key: the session may run twice against one database

    public = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    key = step(f"{v1}/ssh-keys", "post", 201, token=owner, body={"name": "laptop", "public_key": public})
    step(f"{v1}/ssh-keys", "post", 409, token=world.tokens["member"], body={"name": "same", "public_key": public})
    step(f"{v1}/ssh-keys/{{id}}", "get", 200, f"{v1}/ssh-keys/{key['id']}", token=owner)
    step(f"{v1}/ssh-keys/{{id}}", "delete", 204, f"{v1}/ssh-keys/{key['id']}", token=owner)

    invoice = f"{v1}/invoices/{contract.invoice_id}"
    step(f"{v1}/invoices/{{id}}", "get", 200, invoice, token=owner)
    for fmt in ("pdf", "csv"):
        step(f"{v1}/invoices/{{id}}.{{fmt}}", "get", 200, f"{invoice}.{fmt}", token=owner)
    step(f"{v1}/quotas", "get", 404, f"{v1}/quotas?project=no-such-project", token=owner)

    # webhooks (the server runs with WEBHOOK_ALLOW_LOOPBACK: http to 127.0.0.1 is allowed, private ranges not)
    hooks, hook = f"{v1}/webhooks", f"{v1}/webhooks/{{id}}"
    created = step(hooks, "post", 201, token=owner, body={"url": "http://127.0.0.1:9/hook",
                                                           "event_types": ["lease.released"]})
    step(hooks, "post", 422, token=owner, body={"url": "https://10.0.0.1/hook", "event_types": ["advice"]})
    at = f"{hooks}/{created['id']}"
    step(hook, "get", 200, at, token=owner)
    step(hook, "patch", 200, at, token=owner, body={"description": "contract"})
    step(hook, "patch", 422, at, token=owner, body={"url": "https://192.168.0.1/hook"})  # SSRF refused
    step(f"{hook}/rotate", "post", 200, f"{at}/rotate", token=owner)
    step(f"{hook}/deliveries", "get", 200, f"{at}/deliveries", token=owner)
    step(hook, "delete", 204, at, token=owner)
    step(hook, "get", 404, at, token=owner)  # gone
    capacity_steps(step, world)
    invitation_steps(step, world)
    money_steps(step, world)
    allocation_steps(step, world, contract.invoice_id)
    workload_steps(step, world, node["secret"])
    pipeline_steps(step, world, contract.capped)
    tiering_steps(step, world, running["id"], contract.capped)
    staff = staff_tenant_steps(step, world)
    staff_sign_in_steps(step, world, staff)
    staff_billing_steps(step, world, staff, contract.invoice_id)
    offboarding_steps(step, world)
    # no active lease is left for the fuzzer (it cannot place one; renewing this one is produced above)
    step(f"{v1}/leases/{{id}}", "delete", 202, f"{v1}/leases/{running['id']}", token=owner)
    return produced


def _bodies_refused(step, staff: str, calls) -> None:
    """413 and 415 on each (template, method, path) that takes a body, as every body route answers them."""
    for template, method, path in calls:
        step(template, method, 415, path, token=staff, raw=b"x=1", content_type="text/plain")
        step(template, method, 413, path, token=staff, raw=b'{"a": "' + b"x" * 3_000_000 + b'"}')


def staff_sign_in_steps(step, world: World, staff: str) -> None:
    """A tenant's sign-in settings as staff (issue 34): read and changed, an e-mail domain another tenant's single
    sign-on already claims refused (409) from staff and from the tenant's own owner, 404 for no such tenant."""
    v1, sign_in = "/api/v1", "/api/v1/tenants/{slug}/sign-in"
    globex, acme = sign_in.format(slug=world.globex.slug), sign_in.format(slug=world.acme.slug)
    step(sign_in, "get", 200, globex, token=staff)
    step(sign_in, "patch", 200, globex, token=staff, body={"allowed_email_domains": ["globex.example"]})
    step(sign_in, "patch", 409, acme, token=staff, body={"allowed_email_domains": ["globex.example"]})
    step(f"{v1}/tenant/sign-in", "patch", 409, token=world.tokens["owner"],
         body={"allowed_email_domains": ["globex.example"]})
    step(f"{v1}/tenant/sign-in", "patch", 200, token=world.tokens["owner"], body={})  # nothing changes
    step(sign_in, "get", 404, sign_in.format(slug="nobody"), token=staff)
    step(sign_in, "patch", 404, sign_in.format(slug="nobody"), token=staff, body={})
    _bodies_refused(step, staff, [(sign_in, "patch", globex)])


def staff_billing_steps(step, world: World, staff: str, invoice_id: int) -> None:
    """Corrections, prepaid credit and taxes as staff (issue 33): a credit note, a payment and its refund, the
    tenant's copy of the note, a void (then another void or credit note is 409; a payment waits for a finalized
    invoice: 409 on a draft), credit grants, a tax
    profile and rates (a second active rate of one name is 409), 404 for what does not exist, 413/415 on bodies."""
    v1, owner = "/api/v1", world.tokens["owner"]
    balance, notes = f"{v1}/billing/invoices/{{id}}", f"{v1}/billing/invoices/{{id}}/credit-notes"
    void, payments = f"{v1}/billing/invoices/{{id}}/void", f"{v1}/billing/invoices/{{id}}/payments"
    refunds = f"{v1}/billing/payments/{{id}}/refunds"
    here = {"id": invoice_id}
    step(balance, "get", 200, balance.format(**here), token=staff)
    step(balance, "get", 404, balance.format(id=999999999), token=staff)
    step(notes, "post", 404, notes.format(id=999999999), token=staff,
         body={"reason": "duplicate", "memo": "x", "amount_minor": 1})
    note = step(notes, "post", 201, notes.format(**here), token=staff,
                body={"reason": "duplicate", "memo": "contract", "amount_minor": 1})
    step(f"{v1}/credit-notes/{{id}}", "get", 200, f"{v1}/credit-notes/{note['id']}", token=owner)
    for fmt in ("pdf", "csv"):
        step(f"{v1}/credit-notes/{{id}}.{{fmt}}", "get", 200, f"{v1}/credit-notes/{note['id']}.{fmt}", token=owner)
    payment = step(payments, "post", 201, payments.format(**here), token=staff, body={"amount_minor": 2})
    step(refunds, "post", 201, refunds.format(id=payment["id"]), token=staff,
         body={"amount_minor": 1, "reason": "contract"})
    step(refunds, "post", 404, refunds.format(id=999999999), token=staff, body={"amount_minor": 1, "reason": "x"})
    _bodies_refused(step, staff, [(notes, "post", notes.format(**here)), (payments, "post", payments.format(**here)),
                                  (void, "post", void.format(**here)), (refunds, "post",
                                                                         refunds.format(id=payment["id"]))])
    step(void, "post", 200, void.format(**here), token=staff, body={"memo": "contract"})
    step(void, "post", 409, void.format(**here), token=staff, body={"memo": "again"})
    step(notes, "post", 409, notes.format(**here), token=staff,
         body={"reason": "duplicate", "memo": "void", "amount_minor": 1})
    draft = Invoice.objects.create(tenant=world.acme, period=date(2026, 2, 1), currency="USD", subtotal_minor=0,
                                   total_minor=0, computed_at=timezone.now())  # payments wait for finalisation
    step(payments, "post", 409, payments.format(id=draft.pk), token=staff, body={"amount_minor": 1})
    step(payments, "post", 404, payments.format(id=999999999), token=staff, body={"amount_minor": 1})
    step(void, "post", 404, void.format(id=999999999), token=staff, body={"memo": "x"})

    grants, tax, rate = (f"{v1}/tenants/{{slug}}/credit-grants", f"{v1}/tenants/{{slug}}/tax",
                         f"{v1}/tenants/{{slug}}/tax/rates/{{id}}")
    acme, nobody = {"slug": world.acme.slug}, {"slug": "nobody"}
    step(grants, "post", 201, grants.format(**acme), token=staff, body={"amount_minor": 500, "reason": "contract"})
    step(grants, "get", 200, grants.format(**acme), token=staff)
    step(grants, "get", 404, grants.format(**nobody), token=staff)
    step(grants, "post", 404, grants.format(**nobody), token=staff, body={"amount_minor": 1, "reason": "x"})
    step(tax, "put", 200, tax.format(**acme), token=staff, body={"tax_id": "DE123456789"})
    vat = {"jurisdiction": "DE", "name": "VAT", "percentage": "19"}
    made = step(tax, "post", 201, tax.format(**acme), token=staff, body=vat)
    step(tax, "post", 409, tax.format(**acme), token=staff, body=vat)  # one active rate of a name
    step(tax, "get", 200, tax.format(**acme), token=staff)
    step(tax, "get", 404, tax.format(**nobody), token=staff)
    step(tax, "put", 404, tax.format(**nobody), token=staff, body={})
    step(tax, "post", 404, tax.format(**nobody), token=staff, body=vat)  # the fuzzer, an owner, gets 403 only
    _bodies_refused(step, staff, [(grants, "post", grants.format(**acme)), (tax, "post", tax.format(**acme)),
                                  (tax, "put", tax.format(**acme))])
    rate_id = made["rates"][0]["id"]
    step(rate, "delete", 204, rate.format(id=rate_id, **acme), token=staff)
    step(rate, "delete", 404, rate.format(id=999999999, **acme), token=staff)


def offboarding_steps(step, world: World) -> None:
    """The audit trail, an export and a closure (issue 34): acme, whose lease still runs, cannot close; its export,
    built here as the worker would, downloads; a tenant of its own closes, and an export it asks for afterwards (a
    token made in the database: closing revoked its tokens) is refused."""
    from tenants.offboarding import tenant_export_build
    from tests.factories import make_tenant

    v1, owner = "/api/v1", world.tokens["owner"]
    step(f"{v1}/audit-events", "get", 200, token=owner)
    step(f"{v1}/tenant/close", "post", 409, token=owner, body={"confirm": world.acme.slug})  # a lease runs
    made = step(f"{v1}/tenant/exports", "post", 202, token=owner)
    step(f"{v1}/tenant/exports/{{id}}", "get", 200, f"{v1}/tenant/exports/{made['id']}", token=owner)
    step(f"{v1}/tenant/exports/{{id}}/archive", "get", 409, f"{v1}/tenant/exports/{made['id']}/archive",
         token=owner)  # not built yet
    tenant_export_build(export_id=made["id"])
    step(f"{v1}/tenant/exports/{{id}}/archive", "get", 200, f"{v1}/tenant/exports/{made['id']}/archive",
         token=owner)
    leaving = make_tenant("leaving")
    person = make_member(leaving, "leaving-owner", Role.OWNER)
    _, secret = make_token(leaving, person)
    step(f"{v1}/tenant/close", "post", 200, token=secret, body={"confirm": "leaving"})
    type(person).objects.filter(pk=person.pk).update(is_active=True)  # back, in the database only
    Membership.objects.create(user=person, tenant=leaving, role=Role.OWNER)
    _, again = make_token(leaving, person)
    step(f"{v1}/tenant/exports", "post", 409, token=again)


def invitation_steps(step, world: World) -> None:
    """Acme's admin invites globex's owner and a name nobody has (the same answer), invites again (409), revokes
    one (again: 409); bob lists his invitations, accepts one (again: 409) and declines another (again: 409)."""
    v1, admin, bob = "/api/v1", world.tokens["admin"], world.tokens["outsider"]
    listing, one = f"{v1}/tenant/invitations", f"{v1}/tenant/invitations/{{id}}"
    step(listing, "get", 200, token=admin)
    mine = step(listing, "post", 201, token=admin, body={"username": "bob", "role": "viewer"})
    step(listing, "post", 409, token=admin, body={"username": "bob", "role": "member"})  # one pending per name
    ghost = step(listing, "post", 201, token=admin, body={"username": "contract-ghost", "role": "viewer"})
    step(one, "delete", 204, f"{v1}/tenant/invitations/{ghost['id']}", token=admin)
    step(one, "delete", 409, f"{v1}/tenant/invitations/{ghost['id']}", token=admin)  # revoked already
    step(f"{v1}/invitations", "get", 200, token=bob)
    accept, decline = f"{v1}/invitations/{{id}}/accept", f"{v1}/invitations/{{id}}/decline"
    step(accept, "post", 200, f"{v1}/invitations/{mine['id']}/accept", token=bob)
    step(accept, "post", 409, f"{v1}/invitations/{mine['id']}/accept", token=bob)
    # globex invites acme's member; he declines, then cannot decline again
    other = step(listing, "post", 201, token=bob, body={"username": "max", "role": "viewer"})
    step(decline, "post", 200, f"{v1}/invitations/{other['id']}/decline", token=world.tokens["member"])
    step(decline, "post", 409, f"{v1}/invitations/{other['id']}/decline", token=world.tokens["member"])


def capacity_steps(step, world: World) -> None:
    """Acme's right-sizing advice accepted and rejected by its owner (again: 409); the platform-staff API
    (policies, the fleet, a planner run) with a staff member's token, each refused body kind included."""
    from django.contrib.auth import get_user_model

    from capacity.models import Adjustment

    owner, v1 = world.tokens["owner"], "/api/v1"
    advice = [Adjustment.objects.create(
        kind="right_size", target=f"project:{world.project.pk}/contract-{index}", fingerprint=f"contract-{index}",
        mode="advise", reason="contract", tenant=world.acme, tenant_ids=[world.acme.pk], project=world.project,
        gain_gpu_seconds=3600, gain_money_minor=100, currency="USD").pk for index in (1, 2)]
    step(f"{v1}/adjustments", "get", 200, token=owner)
    step(f"{v1}/adjustments/{{id}}", "get", 200, f"{v1}/adjustments/{advice[0]}", token=owner)
    accept, reject = f"{v1}/adjustments/{{id}}/accept", f"{v1}/adjustments/{{id}}/reject"
    step(accept, "post", 200, f"{v1}/adjustments/{advice[0]}/accept", token=owner)
    step(accept, "post", 409, f"{v1}/adjustments/{advice[0]}/accept", token=owner)
    step(reject, "post", 200, f"{v1}/adjustments/{advice[1]}/reject", token=owner, body={"reason": "contract"})
    step(reject, "post", 409, f"{v1}/adjustments/{advice[1]}/reject", token=owner, body={})
    # a project's opt-in to idle reclaim: read by anyone, set by an owner or admin, refused to a member
    opt_in, at_project = f"{v1}/projects/{{slug}}/idle-reclaim", f"{v1}/projects/{world.project.slug}/idle-reclaim"
    step(opt_in, "get", 200, at_project, token=world.tokens["member"])
    step(opt_in, "put", 200, at_project, token=owner, body={"opt_in": True})
    step(opt_in, "put", 403, at_project, token=world.tokens["member"], body={"opt_in": False})
    step(opt_in, "put", 400, at_project, token=owner, body={"opt_in": "yes"})
    step(opt_in, "put", 404, f"{v1}/projects/{world.other_project.slug}/idle-reclaim", token=owner,
         body={"opt_in": True})
    step(opt_in, "put", 200, at_project, token=owner, body={"opt_in": False})
    # and its opt-out of the suspension of its idle resumable training, on the same route
    step(opt_in, "put", 200, at_project, token=owner, body={"suspend_opt_out": True})
    step(opt_in, "put", 400, at_project, token=owner, body={"suspend_opt_out": "yes"})
    step(opt_in, "put", 403, at_project, token=world.tokens["member"], body={"suspend_opt_out": False})
    step(opt_in, "put", 200, at_project, token=owner, body={"opt_in": False, "suspend_opt_out": False})

    user = make_member(world.acme, "ops", Role.ADMIN)
    get_user_model().objects.filter(pk=user.pk).update(is_staff=True)
    ops = make_token(world.acme, user)[1]
    policies, policy = f"{v1}/capacity/policies", f"{v1}/capacity/policies/{{id}}"
    created = step(policies, "post", 201, token=ops, body={"scope": "pool:H100-80GB", "modes": {"warm_pool": "off"}})
    step(policies, "post", 200, token=ops, body={"scope": "pool:H100-80GB", "modes": {"warm_pool": "advise"}})
    step(policies, "get", 200, token=ops)
    at = f"{policies}/{created['id']}"
    step(policy, "get", 200, at, token=ops)
    step(policy, "patch", 200, at, token=ops, body={"warm_min_arrivals": 2})
    for template, path, method in ((policies, policies, "post"), (policy, at, "patch")):
        step(template, method, 415, path, token=ops, raw=b"x=1", content_type="text/plain")
        step(template, method, 413, path, token=ops, raw=b'{"a": "' + b"x" * 3_000_000 + b'"}')
    step(policy, "delete", 204, at, token=ops)
    step(policy, "get", 404, at, token=ops)
    step(policy, "patch", 404, at, token=ops, body={})
    step(policy, "delete", 404, at, token=ops)
    step(f"{v1}/capacity/fleet", "get", 200, token=ops)
    step(f"{v1}/capacity/run", "post", 200, token=ops)


def allocation_steps(step, world: World, invoice_id: int) -> None:
    """Cost allocation, spend alerts and exports (issue 33): the label keys, the breakdowns (JSON and CSV), the
    invoice's FOCUS export and the staff's, an alert rule set, read and removed (an unknown project: 404)."""
    from django.contrib.auth import get_user_model

    owner, v1 = world.tokens["owner"], "/api/v1"
    step(f"{v1}/label-keys", "get", 200, token=owner)
    step(f"{v1}/label-keys", "put", 200, token=owner, body={"keys": ["team", "cost-center"]})
    step(f"{v1}/usage/breakdown", "get", 200, f"{v1}/usage/breakdown?by=label:team", token=owner)
    step(f"{v1}/usage/breakdown.{{fmt}}", "get", 200, f"{v1}/usage/breakdown.csv?by=user", token=owner)
    invoice = f"{v1}/invoices/{invoice_id}"
    step(f"{v1}/invoices/{{id}}/breakdown", "get", 200, f"{invoice}/breakdown?by=user", token=owner)
    step(f"{v1}/invoices/{{id}}/breakdown.{{fmt}}", "get", 200, f"{invoice}/breakdown.csv", token=owner)
    step(f"{v1}/invoices/{{id}}/focus.{{fmt}}", "get", 200, f"{invoice}/focus.parquet", token=owner)
    user = make_member(world.acme, "finops", Role.ADMIN)
    get_user_model().objects.filter(pk=user.pk).update(is_staff=True)
    finops = make_token(world.acme, user)[1]
    step(f"{v1}/billing/focus.{{fmt}}", "get", 200, f"{v1}/billing/focus.csv?period=2026-01", token=finops)
    step(f"{v1}/billing/focus.{{fmt}}", "get", 404, f"{v1}/billing/focus.pdf?period=2026-01", token=finops)
    rules, rule = f"{v1}/spend-alert-rules", f"{v1}/spend-alert-rules/{{id}}"
    step(rules, "get", 200, token=owner)
    made = step(rules, "put", 200, token=owner, body={"budget_minor": 100_000, "thresholds_pct": [50, 90]})
    step(rules, "put", 404, token=owner, body={"project": "no-such-project", "budget_minor": 1})
    step(rule, "get", 200, f"{rules}/{made['id']}", token=owner)
    step(rule, "delete", 204, f"{rules}/{made['id']}", token=owner)
    step(f"{v1}/spend-alerts", "get", 200, token=owner)


def money_steps(step, world: World) -> None:
    """Spend caps with the owner's token (one per scope: 409; an unknown project: 404); price books and billing
    terms with a staff member's token: an upcoming book changed and deleted, the seeded book (in force since
    2025) refused (409), a tenant that does not exist (404), and 413/415 on each body."""
    from django.contrib.auth import get_user_model

    from billing.models import PriceBook

    owner, v1 = world.tokens["owner"], "/api/v1"
    caps, cap = f"{v1}/spend-caps", f"{v1}/spend-caps/{{id}}"
    step(caps, "get", 200, token=owner)
    created = step(caps, "post", 201, token=owner, body={"monthly_minor": 10**12, "action": "warn"})
    step(caps, "post", 409, token=owner, body={"monthly_minor": 1})  # the tenant has its cap
    step(caps, "post", 404, token=owner, body={"project": "no-such-project", "monthly_minor": 1})
    at = f"{caps}/{created['id']}"
    step(cap, "get", 200, at, token=owner)
    step(cap, "patch", 200, at, token=owner, body={"monthly_minor": 10**12 + 1})
    for template, path, method in ((caps, caps, "post"), (cap, at, "patch")):
        step(template, method, 415, path, token=owner, raw=b"x=1", content_type="text/plain")
        step(template, method, 413, path, token=owner, raw=b'{"a": "' + b"x" * 3_000_000 + b'"}')
    step(cap, "delete", 204, at, token=owner)
    step(cap, "get", 404, at, token=owner)

    user = make_member(world.acme, "treasurer", Role.ADMIN)
    get_user_model().objects.filter(pk=user.pk).update(is_staff=True)
    staff = make_token(world.acme, user)[1]
    books, book = f"{v1}/price-books", f"{v1}/price-books/{{id}}"
    step(books, "get", 200, token=staff)
    start = (timezone.now() + timedelta(days=30)).replace(microsecond=0)
    upcoming = step(books, "post", 201, token=staff, body={
        "name": "next list", "currency": "USD", "effective_from": start.isoformat(),
        "rates": [{"tier": "H100-80GB", "per_hour": "4.50"}]})
    at = f"{books}/{upcoming['id']}"
    step(book, "get", 200, at, token=staff)
    step(book, "patch", 200, at, token=staff, body={"rates": [{"tier": "H100-80GB", "per_hour": "4.40"}]})
    for template, path, method in ((books, books, "post"), (book, at, "patch")):
        step(template, method, 415, path, token=staff, raw=b"x=1", content_type="text/plain")
        step(template, method, 413, path, token=staff, raw=b'{"a": "' + b"x" * 3_000_000 + b'"}')
    in_force = f"{books}/{PriceBook.objects.get(name='list').pk}"
    step(book, "patch", 409, in_force, token=staff, body={"name": "renamed"})
    step(book, "delete", 409, in_force, token=staff)
    step(book, "delete", 204, at, token=staff)
    for method, body in (("get", None), ("patch", {}), ("delete", None)):
        step(book, method, 404, at, token=staff, body=body)

    terms = f"{v1}/tenants/{{slug}}/billing-terms"
    at, nobody = f"{v1}/tenants/{world.acme.slug}/billing-terms", f"{v1}/tenants/nobody/billing-terms"
    body = {"discount_pct": "0", "monthly_commit_minor": 0}
    step(terms, "get", 200, at, token=staff)
    step(terms, "put", 200, at, token=staff, body=body)
    step(terms, "put", 415, at, token=staff, raw=b"x=1", content_type="text/plain")
    step(terms, "put", 413, at, token=staff, raw=b'{"a": "' + b"x" * 3_000_000 + b'"}')
    step(terms, "get", 404, nobody, token=staff)
    step(terms, "put", 404, nobody, token=staff, body=body)


def workload_steps(step, world: World, secret: str) -> None:
    """A lease with a workload (its log answers while it waits: empty), and the agents' signed workload report:
    an empty report is acknowledged (200), a signed body that is not JSON is a 415."""
    v1, owner = "/api/v1", world.tokens["owner"]
    lease = step(f"{v1}/leases", "post", 201, token=owner,
                 body={"project": world.project.slug, "gpu": {"kind": "whole", "model": "H100-80GB"},
                       "workload": {"command": ["python", "train.py"]}})
    logs = step(f"{v1}/leases/{{id}}/logs", "get", 200, f"{v1}/leases/{lease['id']}/logs?tail=100", token=owner)
    assert logs["data"] == "" and logs["node"] is None
    wrong = step(f"{v1}/leases/{{id}}/logs", "get", 400, f"{v1}/leases/{lease['id']}/logs?placement=2", token=owner)
    assert wrong["field"] == "placement"  # it has had no placement yet: only 1 names one
    # a sample of a lease that is not running (it waits) is refused
    step(f"{v1}/leases/{{id}}/samples", "post", 409, f"{v1}/leases/{lease['id']}/samples", token=owner,
         body={"throughput": 1.0})
    step(f"{v1}/leases/{{id}}", "delete", 202, f"{v1}/leases/{lease['id']}", token=owner)
    report = f"{v1}/agents/contract-node/workloads"
    body = json.dumps({"workloads": []}).encode()
    step(f"{v1}/agents/{{node_id}}/workloads", "post", 200, report, raw=body,
         headers=sign(secret, "contract-node", "POST", report, body))
    text = b"workloads=none"
    step(f"{v1}/agents/{{node_id}}/workloads", "post", 415, report, raw=text, content_type="text/plain",
         headers=sign(secret, "contract-node", "POST", report, text))


def pipeline_steps(step, world: World, capped: str) -> None:
    """A pipeline planned, applied (its stages leased through the leasing path), released, applied again
    (409: released), released again (409); one in a project whose spend cap is spent (402); a model split, leased
    as a gang the same way; a pipeline and a split whose parts do not fit together (422); a pipeline whose tiers
    have no list price today, which cannot be planned (409); splits over chosen candidates (a tier: 201; the GPUs
    free now, none: 409; an unknown project: 404)."""
    v1, owner = "/api/v1", world.tokens["owner"]
    body = {"project": world.project.slug, "name": "contract", "slo_ms": 200.0, "rate_rps": 5.0,
            "tiers": ["H100-80GB"], "edges": [["detect", "embed"]],
            "stages": [{"name": "detect", "architecture": "resnet-50"}, {"name": "embed", "architecture": "bert-base"}]}
    poor = step(f"{v1}/pipelines", "post", 201, token=owner, body={**body, "project": capped})
    poor_plan = step(f"{v1}/pipelines/{{id}}/plans", "post", 201, f"{v1}/pipelines/{poor['id']}/plans", token=owner,
                     body={})
    step(f"{v1}/pipelines/{{id}}/plans/{{plan_id}}/apply", "post", 402,
         f"{v1}/pipelines/{poor['id']}/plans/{poor_plan['id']}/apply", token=owner, body={})
    created = step(f"{v1}/pipelines", "post", 201, token=owner, body=body)
    pipeline = f"{v1}/pipelines/{created['id']}"
    step(f"{v1}/pipelines/{{id}}", "get", 200, pipeline, token=owner)
    plan = step(f"{v1}/pipelines/{{id}}/plans", "post", 201, f"{pipeline}/plans", token=owner, body={})
    at = f"{pipeline}/plans/{plan['id']}"
    step(f"{v1}/pipelines/{{id}}/plans/{{plan_id}}", "get", 200, at, token=owner)
    step(f"{v1}/pipelines/{{id}}/plans/{{plan_id}}/apply", "post", 200, f"{at}/apply", token=owner, body={})
    step(f"{v1}/pipelines/{{id}}/plans/{{plan_id}}/release", "post", 200, f"{at}/release", token=owner)
    step(f"{v1}/pipelines/{{id}}/plans/{{plan_id}}/apply", "post", 409, f"{at}/apply", token=owner, body={})
    step(f"{v1}/pipelines/{{id}}/plans/{{plan_id}}/release", "post", 409, f"{at}/release", token=owner)
    step(f"{v1}/pipelines", "post", 422, token=owner, body={**body, "edges": [["detect", "nowhere"]]})
    step(f"{v1}/pipelines", "post", 404, token=owner, body={**body, "project": "nowhere"})
    unpriced = step(f"{v1}/pipelines", "post", 201, token=owner, body={**body, "name": "unpriced", "tiers": ["L4"]})
    step(f"{v1}/pipelines/{{id}}/plans", "post", 409, f"{v1}/pipelines/{unpriced['id']}/plans", token=owner,
         body={})  # the price list holds nothing for its tiers today
    split = step(f"{v1}/model-splits", "post", 201, token=owner, body={
        "architecture": "bert-base", "batch": 8,
        "gpus": [{"model": "H100-80GB", "node": "n1"}, {"model": "H100-80GB", "node": "n1"}]})
    step(f"{v1}/model-splits", "post", 422, token=owner, body={
        "architecture": "bert-base", "gpus": [{"model": "L4", "free_mib": 80000}]})
    # the candidates chosen for the tenant: a tier (hypothetical GPUs, 201); the GPUs free now, of a model the fleet
    # has none of (409 naming candidates); free within a project the tenant does not have (404)
    step(f"{v1}/model-splits", "post", 201, token=owner, body={
        "architecture": "bert-base", "candidates": {"tier": "H100-80GB", "count": 2}})
    step(f"{v1}/model-splits", "post", 409, token=owner, body={
        "architecture": "bert-base", "candidates": {"free": True, "models": ["L4"]}})
    step(f"{v1}/model-splits", "post", 404, token=owner, body={
        "architecture": "bert-base", "candidates": {"free": True, "project": "nowhere"}})
    at = f"{v1}/model-splits/{split['id']}"
    step(f"{v1}/model-splits/{{id}}", "get", 200, at, token=owner)
    # the split's GPUs leased as one gang: refused by the spent cap (402), applied, released, then 409 twice
    step(f"{v1}/model-splits/{{id}}/apply", "post", 402, f"{at}/apply", token=owner, body={"project": capped})
    step(f"{v1}/model-splits/{{id}}/apply", "post", 200, f"{at}/apply", token=owner,
         body={"project": world.project.slug})
    step(f"{v1}/model-splits/{{id}}/release", "post", 200, f"{at}/release", token=owner)
    step(f"{v1}/model-splits/{{id}}/apply", "post", 409, f"{at}/apply", token=owner,
         body={"project": world.project.slug})
    step(f"{v1}/model-splits/{{id}}/release", "post", 409, f"{at}/release", token=owner)


def tiering_steps(step, world: World, running_id: int, capped: str) -> None:
    """A workload registered and read, with its profiles and a prediction (none measured yet: profile first);
    a throughput sample of the running lease."""
    v1, owner = "/api/v1", world.tokens["owner"]
    step(f"{v1}/leases/{{id}}/samples", "post", 201, f"{v1}/leases/{running_id}/samples", token=owner,
         body={"throughput": 250.0, "step_ms": 32.0})
    step(f"{v1}/workloads", "post", 201, token=owner, body={
        "name": "contract-bert", "architecture": "bert-base", "task": "inference", "precision": "int8",
        "batch_size": 8, "seq_len": 128, "target_throughput": 400.0})
    step(f"{v1}/workloads/{{name}}", "get", 200, f"{v1}/workloads/contract-bert", token=owner)
    step(f"{v1}/workloads/{{name}}", "patch", 200, f"{v1}/workloads/contract-bert", token=owner,
         body={"regime": "engine"})
    step(f"{v1}/workloads/{{name}}/profiles", "get", 200, f"{v1}/workloads/contract-bert/profiles", token=owner)
    step(f"{v1}/workloads/{{name}}/prediction", "post", 200, f"{v1}/workloads/contract-bert/prediction",
         token=owner)
    step(f"{v1}/workloads/{{name}}/prediction", "post", 404, f"{v1}/workloads/no-such-workload/prediction",
         token=owner)
    runs = f"{v1}/workloads/{{name}}/profiling-runs"
    body = {"project": world.project.slug, "slices": ["H100-80GB"], "window_seconds": 10}
    step(runs, "post", 201, f"{v1}/workloads/contract-bert/profiling-runs", token=owner, body=body)
    step(runs, "post", 409, f"{v1}/workloads/contract-bert/profiling-runs", token=owner, body=body)  # one at a time
    step(runs, "post", 404, f"{v1}/workloads/no-such-workload/profiling-runs", token=owner, body=body)
    # every candidate's lease refused by the spent cap of its project: the run fails with that refusal (402)
    step(f"{v1}/workloads", "post", 201, token=owner, body={
        "name": "contract-capped", "architecture": "bert-base", "task": "inference", "precision": "int8",
        "batch_size": 8, "seq_len": 128, "target_throughput": 400.0})
    step(runs, "post", 402, f"{v1}/workloads/contract-capped/profiling-runs", token=owner,
         body={**body, "project": capped})
    step(runs, "get", 200, f"{v1}/workloads/contract-bert/profiling-runs", token=owner)
    step(f"{v1}/workloads/{{name}}/advice", "get", 200, f"{v1}/workloads/contract-bert/advice", token=owner)


def staff_tenant_steps(step, world: World) -> str:
    """The staff API for tenants (tenants/api/platform.py) with a staff member's token: a tenant onboarded (its
    quota, a project, its quota, an SLO contract replaced), each 409 (a taken slug, a bound below what projects
    hold, a project over the bound, an overlapping contract), a suspended tenant's 403 on changes, 404 for a tenant,
    project or contract that does not exist, and 413/415 on each body."""
    from django.contrib.auth import get_user_model

    user = make_member(world.acme, "platform-ops", Role.ADMIN)
    get_user_model().objects.filter(pk=user.pk).update(is_staff=True)
    staff = make_token(world.acme, user)[1]
    v1, slug = "/api/v1", "onboard"
    tenants, tenant = f"{v1}/tenants", f"{v1}/tenants/{{slug}}"
    status_, quotas, quota = f"{tenant}/status", f"{tenant}/quotas", f"{tenant}/quotas/{{tier}}"
    projects, project = f"{tenant}/projects", f"{tenant}/projects/{{project}}"
    project_status, project_quota = f"{project}/status", f"{project}/quotas/{{tier}}"
    contracts, contract = f"{tenant}/slo-contracts", f"{tenant}/slo-contracts/{{id}}"
    here = {"slug": slug, "project": "web", "tier": "H100-80GB"}

    def at(template: str, **values) -> str:
        return template.format(**{**here, **values})

    step(tenants, "get", 200, token=staff)
    onboard = {"slug": slug, "name": "Onboard", "billing_email": "ap@onboard.example"}
    step(tenants, "post", 201, token=staff, body=onboard)
    step(tenants, "post", 409, token=staff, body={**onboard, "name": "Again"})
    step(tenant, "get", 200, at(tenant), token=staff)
    step(tenant, "patch", 200, at(tenant), token=staff, body={"name": "Onboard Inc"})
    # cohorts (issue 32 item 7): one created (a taken name 409), the tenant put in it (an unknown one 404), limits
    cohorts = f"{v1}/cohorts"
    step(cohorts, "post", 201, token=staff, body={"name": "research"})
    step(cohorts, "post", 409, token=staff, body={"name": "research"})
    step(cohorts, "get", 200, token=staff)
    step(tenant, "patch", 200, at(tenant), token=staff, body={"cohort": "research"})
    step(tenant, "patch", 404, at(tenant), token=staff, body={"cohort": "nobody"})
    step(quota, "put", 200, at(quota), token=staff, body={"deserved_gpu_milli": 2000, "limit_gpu_milli": 4000,
                                                           "lending_limit_gpu_milli": 1000})
    step(quotas, "get", 200, at(quotas), token=staff)
    step(projects, "post", 201, at(projects), token=staff, body={"slug": "web", "name": "Web"})
    step(projects, "post", 409, at(projects), token=staff, body={"slug": "web", "name": "Again"})
    step(projects, "get", 200, at(projects), token=staff)
    step(project, "get", 200, at(project), token=staff)
    step(project, "patch", 200, at(project), token=staff, body={"description": "the web team"})
    step(project_quota, "put", 200, at(project_quota), token=staff,
         body={"deserved_gpu_milli": 1000, "limit_gpu_milli": 2000})
    step(project_quota, "put", 409, at(project_quota), token=staff,
         body={"deserved_gpu_milli": 3000, "limit_gpu_milli": 3000})  # over the tenant's bound
    step(quota, "put", 409, at(quota), token=staff,
         body={"deserved_gpu_milli": 500, "limit_gpu_milli": 4000})  # below what the project holds
    step(project_status, "put", 200, at(project_status), token=staff, body={"status": "suspended"})
    step(project_status, "put", 200, at(project_status), token=staff, body={"status": "active"})
    gold = {"name": "gold", "effective_from": "2026-01-01T00:00:00Z", "effective_to": "2027-01-01T00:00:00Z",
            "time_to_gpu_p95_seconds": 300, "min_runtime_seconds": 900,
            "availability_target_pct": "99.5", "preemption_notice_seconds": 600,
            "credit_steps": [{"metric": "availability", "threshold": "99", "credit_pct": "10"}]}
    made = step(contracts, "post", 201, at(contracts), token=staff, body=gold)
    step(contracts, "post", 409, at(contracts), token=staff, body={**gold, "name": "twice"})
    step(contracts, "get", 200, at(contracts), token=staff)
    step(contract, "get", 200, at(contract, id=made["id"]), token=staff)
    step(contract, "put", 200, at(contract, id=made["id"]), token=staff, body={**gold, "name": "gold-2"})
    later = step(contracts, "post", 201, at(contracts), token=staff,
                 body={**gold, "name": "later", "effective_from": "2030-01-01T00:00:00Z", "effective_to": None})
    step(contract, "put", 409, at(contract, id=later["id"]), token=staff,
         body={**gold, "effective_from": "2025-01-01T00:00:00Z"})  # would overlap gold
    for template, method, path in ((tenants, "post", tenants), (tenant, "patch", at(tenant)),
                                   (status_, "put", at(status_)), (quota, "put", at(quota)),
                                   (projects, "post", at(projects)), (project, "patch", at(project)),
                                   (project_status, "put", at(project_status)),
                                   (project_quota, "put", at(project_quota)), (contracts, "post", at(contracts)),
                                   (contract, "put", at(contract, id=made["id"])), (cohorts, "post", cohorts)):
        step(template, method, 415, path, token=staff, raw=b"x=1", content_type="text/plain")
        step(template, method, 413, path, token=staff, raw=b'{"a": "' + b"x" * 3_000_000 + b'"}')
    step(status_, "put", 200, at(status_), token=staff, body={"status": "suspended", "reason": "contract"})
    step(tenant, "patch", 403, at(tenant), token=staff, body={"name": "Suspended"})
    step(projects, "post", 403, at(projects), token=staff, body={"slug": "late", "name": "Late"})
    step(project, "patch", 403, at(project), token=staff, body={"name": "Late"})
    step(status_, "put", 200, at(status_), token=staff, body={"status": "active"})
    nobody = {"slug": "nobody"}
    for template, method, body in ((tenant, "get", None), (tenant, "patch", {}), (status_, "put", {}),
                                   (quotas, "get", None), (quota, "put", {}), (projects, "get", None),
                                   (projects, "post", {}), (project, "get", None), (project, "patch", {}),
                                   (project_status, "put", {}), (project_quota, "put", {}),
                                   (contracts, "get", None), (contracts, "post", {}), (contract, "get", None),
                                   (contract, "put", {})):
        step(template, method, 404, at(template, id=999999999, **nobody), token=staff, body=body)
    return staff
