"""Nodes: enrollment tokens, enrollment and re-enrollment, signed agent requests, inventory, heartbeats, the
reconcile of what the agents hold against what the database says, cordons and GPU release."""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from broker.choices import (
    FINAL_STATES,
    AllocationState,
    GpuMode,
    LeaseState,
    NodeStatus,
    ShareEnforcement,
)
from broker.models import Allocation, Gpu, Lease, Node
from broker.services.groups import allocations_free
from broker.services.provisioning import agent_client, release_instances_quietly
from broker.services.triggers import enqueue, task
from broker.validation import MAX_GPU_INDEX, MAX_GPU_MEMORY_MIB
from core.errors import (
    ApplicationError,
    NotFound,
    ValidationFailed,
)
from gpus.catalogue import UnknownModel, model_get
from tenants.audit import audit_record

# -- nodes: enrollment and heartbeats --------------------------------------------------------------------
ENROLL_PREFIX = "gpub_enroll_"

logger = logging.getLogger(__name__)


class AgentUnauthenticated(ApplicationError):
    """An agent request without valid credentials: a bad enrollment token or a bad signature (401)."""

    status = 401
    code = "unauthenticated"
    title = "Not authenticated"


class NodeAddressRefused(ApplicationError):
    """A node address outside ``NODE_ADDRESS_NETWORKS`` (422 naming ``address``; nothing written): a well-formed
    URL that this deployment does not send signed calls to, as a webhook's ``unsafe_url``."""

    status = 422
    code = "node_address_refused"
    title = "Node address refused"


class EnrollmentConflict(ApplicationError):
    """An enrollment that would take over another node's identity or GPUs (409; nothing written)."""

    status = 409
    code = "enrollment_conflict"
    title = "Enrollment refused"


def enrollment_token_create(*, uses: int = 1, pool: str = "default", ttl_seconds: int = 3600, by_user=None,
                            now: datetime | None = None) -> str:
    """A token good for ``uses`` enrollments (one by default) within ``ttl_seconds``; only its hash is
    stored. A token enrolls new node ids only: an enrolled node re-enrolls with its own secret or with
    staff approval (``node_reenroll_approve``)."""
    import secrets

    from broker.models import EnrollmentToken

    if isinstance(uses, bool) or not isinstance(uses, int) or not 1 <= uses <= 100_000:
        raise ValidationFailed("uses must be a whole number from 1 to 100000.", field="uses")
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or not 1 <= ttl_seconds <= 7 * 86400:
        raise ValidationFailed("ttl_seconds must be a whole number from 1 to 604800.", field="ttl_seconds")
    now = now or timezone.now()
    prefix = secrets.token_hex(4)
    secret = secrets.token_urlsafe(24)
    token = f"{ENROLL_PREFIX}{prefix}_{secret}"
    with transaction.atomic():
        EnrollmentToken.objects.create(prefix=prefix, secret_hash=hashlib.sha256(token.encode()).hexdigest(),
                                       pool=pool, uses_left=uses, expires_at=now + timedelta(seconds=ttl_seconds),
                                       created_at=now)
        audit_record(tenant=None, by=by_user, action="node.enrollment_token_create", target=prefix,
                     data={"pool": pool, "uses": uses, "ttl_seconds": ttl_seconds})
    return token


def enrollment_token_revoke(*, prefix: str, by_user=None, reason: str = "") -> int:
    """Spend what is left of an enrollment token at once (a token that leaked, or one no longer needed).
    Idempotent; audited with the uses it took away. Returns that number (0: already spent or unknown)."""
    from broker.models import EnrollmentToken

    with transaction.atomic():
        record = EnrollmentToken.objects.select_for_update().filter(prefix=prefix).first()
        if record is None:
            raise NotFound(f"No enrollment token with prefix {prefix!r}.", field="prefix")
        taken = record.uses_left
        if taken:
            EnrollmentToken.objects.filter(pk=record.pk).update(uses_left=0)
            audit_record(tenant=None, by=by_user, action="node.enrollment_token_revoke", target=prefix,
                         data={"uses_taken": taken, **({"reason": reason} if reason else {})})
    return taken


def _enrollment_key(token_digest: str, enrollment_id: str) -> str:
    return hashlib.sha256(f"{token_digest}\n{enrollment_id}".encode()).hexdigest() if enrollment_id else ""


def node_address_check(address: str) -> None:
    """Refuse (``NodeAddressRefused``, 422 on ``address``) a node address the broker must not send signed calls
    to: its host must be an IP address inside one of ``NODE_ADDRESS_NETWORKS`` (the agents' networks; loopback,
    link-local and public addresses only where configured). Names are refused: what a name resolves to can change
    after this check."""
    networks = [ipaddress.ip_network(network) for network in settings.NODE_ADDRESS_NETWORKS]
    refused = NodeAddressRefused(
        "address must be http(s)://IP:PORT/... with the IP inside the agents' networks (NODE_ADDRESS_NETWORKS: "
        f"{', '.join(map(str, networks))}); the broker sends its signed calls there.", field="address")
    try:
        parts = urlsplit(address)
        parts.port  # noqa: B018 - a port out of range raises here
        host = ipaddress.ip_address(parts.hostname or "")
    except ValueError:
        raise refused from None
    if parts.scheme not in ("http", "https") or not any(host in network for network in networks):
        raise refused


def node_enroll(*, node_id: str, token: str, address: str, inventory: object, hostname: str = "",
                agent_version: str = "", signed_by_node: bool = False, enrollment_id: str = "",
                now: datetime | None = None) -> Node:
    """Give a node a (new) secret and record its GPUs, in one transaction that writes nothing when refused.

    - A new node id: an enrollment token (one use spent; 401 when invalid, expired or spent).
    - An enrolled node id: the request signed with the node's current secret (``signed_by_node``, checked
      by the caller with ``node_request_verify``), or a token after staff approved it once
      (``node_reenroll_approve``); otherwise 409 on ``node_id`` and no token use is spent.
    - The address must name an IP inside ``NODE_ADDRESS_NETWORKS`` (``node_address_check``), on every
      enrollment and re-enrollment: 422 on ``address``, nothing written, no token use spent.
    - Every GPU reported must be new, this node's already, or released by staff (``gpu_release``); another
      node's GPU is refused with 409 naming ``inventory.gpus[i]``.
    - Idempotent for an agent that lost the answer: a token enrollment that sends an ``enrollment_id`` (random,
      kept by the agent until it is answered), repeated with the same token and id while the node has not yet
      signed a request with its secret and within ``ENROLLMENT_REPLAY_SECONDS``, gets the same node and secret
      back; nothing is written but the audit, no token use is spent. Once the secret was used, the node id is
      enrolled as before (409 without staff approval).
    """
    import secrets

    from broker.models import EnrollmentToken

    node_address_check(address)
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        existing = Node.objects.select_for_update().filter(node_id=node_id).first()
        how = "signed" if existing is not None and signed_by_node else "token"
        record = None
        if how == "token":
            digest = hashlib.sha256(token.encode()).hexdigest()
            key = _enrollment_key(digest, enrollment_id) if token else ""
            if (existing is not None and key and existing.enrollment_key == key and existing.secret_used_at is None
                    and existing.reenroll_approved_at is None
                    and (now - existing.enrolled_at).total_seconds() <= settings.ENROLLMENT_REPLAY_SECONDS):
                audit_record(tenant=None, by=None, action="node.enroll.repeated", target=node_id,
                             data={"address": address})
                return existing
            # read without a lock: the use is taken last, by a conditional UPDATE just before the commit, so
            # concurrent enrollments (a rack powering on) hold the token's row only for that statement
            record = EnrollmentToken.objects.filter(secret_hash=digest).first() if token else None
            if record is None or record.uses_left < 1 or (record.expires_at and record.expires_at <= now):
                raise AgentUnauthenticated("Invalid, expired or spent enrollment token.", field="token")
            if existing is not None:
                if existing.reenroll_approved_at is None:
                    raise EnrollmentConflict(
                        f"Node {node_id} is already enrolled. It re-enrolls with a request signed with its "
                        "current secret; an agent that lost its secret needs a staff member to approve its "
                        f"re-enrollment (manage.py node_reenroll_approve {node_id}).", field="node_id")
                how = "approved"
        fields = {"address": address, "hostname": hostname, "agent_version": agent_version,
                  "secret": secrets.token_urlsafe(32), "status": NodeStatus.READY, "silent_since": None,
                  "reenroll_approved_at": None, "enrolled_at": now, "last_heartbeat_at": now,
                  "enrollment_key": _enrollment_key(digest, enrollment_id) if record is not None else "",
                  "secret_used_at": None}
        if existing is None:
            node = Node.objects.create(node_id=node_id, pool=record.pool, **fields)
        else:
            Node.objects.filter(pk=existing.pk).update(**fields)
            node = Node.objects.get(pk=existing.pk)
        node_inventory_sync(node=node, inventory=inventory, now=now, strict=True)
        if record is not None and not EnrollmentToken.objects.filter(
                pk=record.pk, uses_left__gte=1).update(uses_left=F("uses_left") - 1):
            # racing enrollments spent its last use since it was read: nothing of this one is kept
            raise AgentUnauthenticated("Invalid, expired or spent enrollment token.", field="token")
        audit_record(tenant=None, by=None, action="node.enroll" if existing is None else "node.reenroll",
                     target=node_id,
                     data={"how": how, "address": address, **({"token": record.prefix} if record else {})})
    return node


def node_inventory_sync(*, node: Node, inventory: object, now: datetime, strict: bool = False) -> list[int]:
    """The node's GPUs as its agent reports them; GPUs no longer reported are marked lost. A GPU that
    another node enrolled (and staff did not release) is never moved: ``strict`` (enrollment) refuses the
    whole inventory with 409 on ``inventory.gpus[i]``; otherwise (reconcile) it is left out and logged.
    Returns the indexes (in ``inventory.gpus``) that were left out."""
    gpus = inventory.get("gpus") if isinstance(inventory, dict) else None
    if not isinstance(gpus, list):
        raise ValidationFailed("inventory.gpus must be a list.", field="inventory.gpus")
    parsed = []
    for index, item in enumerate(gpus):
        try:
            uuid, model, mode = str(item["uuid"]), model_get(item["model"]).code, item["mode"]
            if mode not in GpuMode.values or not uuid or len(uuid) > 80:
                raise ValueError(mode)
            gpu_index, memory_mib = int(item["index"]), int(item["memory_mib"])
            if not 0 <= gpu_index <= MAX_GPU_INDEX or not 1 <= memory_mib <= MAX_GPU_MEMORY_MIB:
                raise ValueError(f"index 0-{MAX_GPU_INDEX}, memory_mib 1-{MAX_GPU_MEMORY_MIB}")
            parsed.append((index, uuid, {"index": gpu_index, "model": model, "mode": mode, "memory_mib": memory_mib,
                                         "nvlink_domain": _nvlink_domain(item, index),
                                         **_share_enforcement(item, index)}))
        except (KeyError, TypeError, ValueError, UnknownModel) as error:
            raise ValidationFailed(f"inventory.gpus[{index}] is not a GPU the broker knows: {error}",
                                   field=f"inventory.gpus[{index}]") from None
    runtime, isolation = node_isolation_parse(inventory)
    if (node.workload_runtime, node.isolation) != (runtime, isolation):
        Node.objects.filter(pk=node.pk).update(workload_runtime=runtime, isolation=isolation)
        if isolation != node.isolation:
            audit_record(tenant=None, by=None, action="node.isolation", target=node.node_id,
                         data={"from": node.isolation, "to": isolation, "workload_runtime": runtime})
        node.workload_runtime, node.isolation = runtime, isolation
    host = node_host_parse(inventory)
    if (node.host_cpu_milli, node.host_memory_mib) != host:
        Node.objects.filter(pk=node.pk).update(host_cpu_milli=host[0], host_memory_mib=host[1])
        node.host_cpu_milli, node.host_memory_mib = host
    roots = _workload_roots(inventory)
    if roots != node.workload_roots:
        Node.objects.filter(pk=node.pk).update(workload_roots=roots)
        node.workload_roots = roots
    # Every GPU row this sync may write (those reported, and this node's live ones it may mark lost), locked
    # in one statement in primary-key order before any is written: two syncs, the GPU writers of capacity and
    # staff (which lock one GPU) then always wait in the same order, never in a circle (issue 27 item 12: a
    # DeadlockDetected here during a kill test). FOR NO KEY UPDATE, as an UPDATE of non-key columns takes: a
    # GPU's key never changes, so the KEY SHARE lock that inserting an allocation takes on its GPU (the
    # cycle's placement write, provisioning, the warm pool) never waits for a sync, nor a sync for it.
    uuids = [uuid for _, uuid, _ in parsed]
    locked = list(Gpu.objects.select_for_update(no_key=True)
                  .filter(Q(uuid__in=uuids) | Q(node=node, lost_at__isnull=True)).order_by("pk")
                  .values_list("pk", "uuid", "node_id", "released_at"))
    reported = set(uuids)
    owner_pks = {node_pk for _, uuid, node_pk, released_at in locked
                 if uuid in reported and released_at is None and node_pk != node.pk}
    node_ids = dict(Node.objects.filter(pk__in=owner_pks).values_list("pk", "node_id"))
    owners = {uuid: node_ids[node_pk] for _, uuid, node_pk, released_at in locked
              if node_pk in node_ids and released_at is None}
    refused = [index for index, uuid, _ in parsed if uuid in owners]
    if refused and strict:
        index = refused[0]
        uuid = parsed[index][1]
        raise EnrollmentConflict(f"GPU {uuid} belongs to node {owners[uuid]}; a staff member must release it "
                                 f"(manage.py gpu_release {uuid}) before another node can claim it.",
                                 field=f"inventory.gpus[{index}]")
    # the rows these GPUs already have, read once (an enrollment used to cost a SELECT and a write per GPU)
    known = {gpu.uuid: gpu for gpu in Gpu.objects.filter(
        uuid__in=[uuid for _, uuid, _ in parsed if uuid not in owners])}  # locked above
    seen, new = [], []
    for _index, uuid, values in parsed:
        if uuid in owners:
            logger.warning("node %s reports GPU %s, which belongs to node %s: ignored (staff must release it)",
                           node.node_id, uuid, owners[uuid])
            continue
        seen.append(uuid)
        row = known.get(uuid)
        if row is None:
            new.append(Gpu(uuid=uuid, node=node, **values, lost_at=None, released_at=None))
        elif (row.node_id != node.pk or row.lost_at is not None or row.released_at is not None
              or any(getattr(row, name) != value for name, value in values.items())):
            Gpu.objects.filter(pk=row.pk).update(node=node, **values, lost_at=None, released_at=None)
    if new:
        try:
            with transaction.atomic():
                Gpu.objects.bulk_create(new)
        except IntegrityError:  # a GPU of this list was inserted by a racing enrollment: one at a time, as before
            for gpu in new:
                values = {name: getattr(gpu, name) for name in ("index", "model", "mode", "memory_mib", "nvlink_domain",
                                                                "share_enforcement", "share_enforcement_reason")}
                Gpu.objects.update_or_create(uuid=gpu.uuid, defaults={"node": node, **values, "lost_at": None,
                                                                      "released_at": None})
    # only rows locked above (a GPU inserted since by a racing enrollment of this node is reported by it)
    Gpu.objects.filter(pk__in=[pk for pk, _, node_pk, _ in locked if node_pk == node.pk], lost_at__isnull=True
                       ).exclude(uuid__in=seen).update(lost_at=now)
    return refused


def _nvlink_domain(item: dict, index: int) -> str:
    """A GPU's NVLink domain as its agent reports it (GPUs of one node in one domain talk over NVLink or an
    NVSwitch; the scheduler keeps a multi-GPU lease inside one when it can); "" when it has none or its agent
    does not report it (one from before topology was reported)."""
    domain = item.get("nvlink_domain", "")
    if domain is None:
        return ""
    if not isinstance(domain, str) or len(domain) > MAX_NVLINK_DOMAIN:
        raise ValidationFailed(f"inventory.gpus[{index}].nvlink_domain must be a string of at most "
                               f"{MAX_NVLINK_DOMAIN} characters.", field=f"inventory.gpus[{index}].nvlink_domain")
    return domain


def node_host_parse(inventory: dict) -> tuple[int, int]:
    """(host CPU in milli-cores, host memory in MiB) of an inventory (``host_cpu_milli``, ``host_memory_mib``); 0
    for one its agent does not report (not tracked: the scheduler places no host CPU or memory there)."""
    out = []
    for name in ("host_cpu_milli", "host_memory_mib"):
        value = inventory.get(name, 0)
        if value is None:
            value = 0
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_HOST_QUANTITY:
            raise ValidationFailed(f"inventory.{name} must be an integer 0..{MAX_HOST_QUANTITY}.",
                                   field=f"inventory.{name}")
        out.append(value)
    return out[0], out[1]


def _share_enforcement(item: dict, index: int) -> dict:
    """A GPU's ``share_enforcement`` (``mps`` | ``none``) and its reason as the agent reports them; an agent that
    does not report it (one from before MPS management) enforces nothing the broker knows of: ``none``."""
    mode = item.get("share_enforcement", ShareEnforcement.NONE)
    if mode not in ShareEnforcement.values:
        raise ValidationFailed(f"inventory.gpus[{index}].share_enforcement must be one of "
                               f"{', '.join(ShareEnforcement.values)}.",
                               field=f"inventory.gpus[{index}].share_enforcement")
    reason = item.get("share_enforcement_reason", "")
    if not isinstance(reason, str):
        raise ValidationFailed(f"inventory.gpus[{index}].share_enforcement_reason must be a string.",
                               field=f"inventory.gpus[{index}].share_enforcement_reason")
    if mode == ShareEnforcement.MPS:
        reason = ""
    elif not reason:
        reason = "its agent does not report share enforcement (an agent from before MPS management)"
    return {"share_enforcement": mode, "share_enforcement_reason": reason[:300]}


def node_isolation_parse(inventory: dict) -> tuple[str, str]:
    """(workload runtime, isolation mode) from an agent's inventory (``agent.workloads.WorkloadManager.report``);
    ("", "") from an agent too old to say. A malformed report is 400 naming ``inventory.isolation``."""
    runtime, isolation = inventory.get("workload_runtime", ""), inventory.get("isolation")
    if isolation is None:
        return ("", "") if not runtime else (str(runtime)[:16], "")
    mode = isolation.get("mode") if isinstance(isolation, dict) else None
    if mode not in ("uid", "none", "container") or not isinstance(runtime, str) or len(runtime) > 16:
        raise ValidationFailed("inventory.isolation must be {\"mode\": \"uid\" | \"none\" | \"container\"} with "
                               "inventory.workload_runtime a runtime name", field="inventory.isolation")
    return runtime, mode


MAX_WORKLOAD_ROOTS = 16
MAX_NVLINK_DOMAIN = 63  # Gpu.nvlink_domain
MAX_HOST_QUANTITY = 1 << 40  # milli-cores or MiB: far above any machine


def _workload_roots(inventory: dict) -> list[str] | None:
    """The inventory's ``workload_roots`` (absolute, normalised paths), or None when the agent reports none."""
    roots = inventory.get("workload_roots")
    if roots is None:
        return None
    if (not isinstance(roots, list) or len(roots) > MAX_WORKLOAD_ROOTS
            or not all(isinstance(r, str) and r.startswith("/") and len(r) <= 300 and "\0" not in r
                       and os.path.normpath(r) == r for r in roots)):
        raise ValidationFailed(f"inventory.workload_roots must list at most {MAX_WORKLOAD_ROOTS} absolute, "
                               "normalised paths.", field="inventory.workload_roots")
    return list(roots)


def _signed_by(*, node_id: str, secret: str | None, headers, method: str, path: str, query: str, body: bytes,
               now: datetime, claim) -> None:
    """The request's signature checked (``agent.protocol``) against the node's ``secret`` (None: no such node), its
    nonce claimed by ``claim(nonce, expires_at) -> bool`` (False: seen before); else ``AgentUnauthenticated``."""
    from agent.protocol import HEADER_NONCE, WINDOW, SignatureError, verify

    if len(headers.get(HEADER_NONCE, "")) > 64:
        raise AgentUnauthenticated("X-Gpub-Nonce must be at most 64 characters.", field=HEADER_NONCE)

    class _Nonces:
        @staticmethod
        def add(nonce: str, _now: float) -> bool:
            return claim(nonce, now + timedelta(seconds=2 * WINDOW))

    try:
        verify(headers, method, path, query, body, lambda nid: secret if nid == node_id else None, _Nonces,
               now=now.timestamp())
    except SignatureError as error:
        raise AgentUnauthenticated(str(error)) from None


def node_request_verify(*, node_id: str, headers, method: str, path: str, query: str, body: bytes,
                        now: datetime | None = None) -> Node:
    """The node that signed this request (``agent.protocol``), else ``AgentUnauthenticated``. The nonce is
    claimed in PostgreSQL (unique per node), so a replay is refused by every web process."""
    now = now or timezone.now()
    node = Node.objects.filter(node_id=node_id).only("pk", "node_id", "secret", "secret_used_at").first()

    def claim(nonce: str, expires_at: datetime) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO broker_agentnonce (node_id, nonce, expires_at) VALUES (%s, %s, %s) "
                "ON CONFLICT (node_id, nonce) DO NOTHING", [node.pk, nonce, expires_at])
            return cursor.rowcount == 1

    _signed_by(node_id=node_id, secret=node.secret if node is not None else None, headers=headers, method=method,
               path=path, query=query, body=body, now=now, claim=claim)
    if node.secret_used_at is None:  # the agent holds its secret: its enrollment answer is not repeated any more
        Node.objects.filter(pk=node.pk, secret_used_at__isnull=True).update(secret_used_at=now)
        node.secret_used_at = now
    return node


def node_heartbeat_signed(*, node_id: str, headers, method: str, path: str, query: str, body: bytes,
                          now: datetime | None = None) -> Node:
    """A signed heartbeat, checked and recorded: ``node_request_verify`` then ``node_heartbeat`` with the same
    checks and effects, in two statements for the usual case (a ready node) instead of three or four, and one
    commit (one WAL flush) instead of two: the node's row is read (its secret), the signature checked here,
    and one statement claims the nonce and, only when it was new, records the heartbeat (and the first use of
    the secret). A replayed nonce writes nothing; a node that is not ``ready`` (silent, back now) takes
    ``node_heartbeat``'s transaction as before. 1,000 nodes every 15 s are 67 of these a second."""
    now = now or timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, secret, secret_used_at FROM broker_node WHERE node_id = %s", [node_id])
        row = cursor.fetchone()
    outcome: dict[str, bool] = {}

    def claim(nonce: str, expires_at: datetime) -> bool:
        # the nonce (unique per node: a replay in any web process inserts nothing) and the heartbeat of a ready
        # node, in one statement; the UPDATE runs only when the INSERT did
        with connection.cursor() as cursor:
            cursor.execute(
                "WITH claimed AS (INSERT INTO broker_agentnonce (node_id, nonce, expires_at) VALUES (%s, %s, %s) "
                "ON CONFLICT (node_id, nonce) DO NOTHING RETURNING 1), "
                "beat AS (UPDATE broker_node SET last_heartbeat_at = %s, "
                "secret_used_at = COALESCE(secret_used_at, %s) "
                "WHERE id = %s AND status = 'ready' AND silent_since IS NULL AND EXISTS (SELECT FROM claimed) "
                "RETURNING 1) "
                "SELECT EXISTS (SELECT FROM claimed), EXISTS (SELECT FROM beat)",
                [row[0], nonce, expires_at, now, now, row[0]])
            claimed, outcome["beat"] = cursor.fetchone()
        return claimed

    _signed_by(node_id=node_id, secret=row[1] if row is not None else None, headers=headers, method=method,
               path=path, query=query, body=body, now=now, claim=claim)
    node = Node(pk=row[0], node_id=node_id, secret=row[1], secret_used_at=row[2] or now)
    if outcome.get("beat"):
        node.last_heartbeat_at = now
        node.status = NodeStatus.READY
        return node
    # not a ready node (silent and back now, or another status): the first use of the secret, then the
    # heartbeat's own transaction, as node_request_verify and node_heartbeat do
    if row[2] is None:
        Node.objects.filter(pk=node.pk, secret_used_at__isnull=True).update(secret_used_at=now)
    return node_heartbeat(node=node, now=now)


SILENT_NOTE = "is silent"


def node_heartbeat(*, node: Node, now: datetime | None = None) -> Node:
    """Record a heartbeat. A node that was silent (within the grace: its leases still hold their
    capacity) is back: it is open to scheduling again and its leases say so; audited."""
    now = now or timezone.now()
    # the usual case, a ready node: one conditional UPDATE, its own transaction (1,000 nodes every 15 s are
    # 67 of these a second; a lock, a read and a second statement each cost the API more than the heartbeat)
    ready = Node.objects.filter(pk=node.pk, status=NodeStatus.READY, silent_since__isnull=True)
    if ready.update(last_heartbeat_at=now):
        node.last_heartbeat_at = now
        node.status = NodeStatus.READY
        return node
    with transaction.atomic(durable=True):
        node_row = Node.objects.select_for_update().get(pk=node.pk)
        Node.objects.filter(pk=node.pk).update(last_heartbeat_at=now, status=NodeStatus.READY, silent_since=None)
        if node_row.status == NodeStatus.SILENT:
            reason = (f"node {node.node_id} answers again (silent since "
                      f"{node_row.silent_since.isoformat(timespec='seconds') if node_row.silent_since else '?'}); "
                      f"the lease runs on")
            leases = _leases_on(node).filter(reason__contains=SILENT_NOTE)
            count = leases.update(reason=reason)
            audit_record(tenant=None, by=None, action="node.back", target=node.node_id, data={
                "last_heartbeat_at": node_row.last_heartbeat_at.isoformat() if node_row.last_heartbeat_at else None,
                "leases_kept": count})
            if not node_row.cordoned:
                enqueue("schedule_cycle")
    node.last_heartbeat_at = now
    node.status = NodeStatus.READY
    return node


def _leases_on(node: Node):
    """Leases not final that hold a live allocation on the node."""
    return Lease.objects.filter(pk__in=Allocation.objects.filter(gpu__node=node, freed_at__isnull=True)
                                .values("lease_id")).exclude(state__in=FINAL_STATES)


def node_reenroll_approve(*, node: Node, by_user=None, reason: str = "") -> Node:
    """Staff: let the next token enrollment of this node id through once (an agent that lost its secret).
    Audited; the approval is spent by that enrollment."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        Node.objects.filter(pk=node.pk).update(reenroll_approved_at=now)
        audit_record(tenant=None, by=by_user, action="node.reenroll_approve", target=node.node_id,
                     data={"reason": reason} if reason else {})
    node.refresh_from_db()
    return node


def gpu_release(*, gpu: Gpu, by_user=None, reason: str = "") -> Gpu:
    """Staff: release a GPU from its node so that another node may claim it (moved hardware). It leaves
    scheduling at once (marked lost until a node reports it again); refused while an allocation holds it."""
    from core.errors import Conflict

    now = timezone.now()
    with transaction.atomic(durable=True):
        gpu = Gpu.objects.select_for_update(of=("self",)).select_related("node").get(pk=gpu.pk)  # not the node
        if Allocation.objects.filter(gpu=gpu, freed_at__isnull=True).exists():
            raise Conflict(f"GPU {gpu.uuid} is held by a live lease; release or fail that lease first.",
                           field="gpu")
        Gpu.objects.filter(pk=gpu.pk).update(released_at=now, lost_at=gpu.lost_at or now)
        audit_record(tenant=None, by=by_user, action="gpu.release", target=gpu.uuid,
                     data={"node": gpu.node.node_id, **({"reason": reason} if reason else {})})
    gpu.refresh_from_db()
    return gpu


# -- reconcile ---------------------------------------------------------------------------------------
STUCK_AFTER = timedelta(seconds=30)


def leases_resume_stuck(*, now: datetime | None = None) -> int:
    """Leases left mid-flight by a worker that died (its message may come back only much later):
    provisioning or releasing for longer than ``STUCK_AFTER`` → the idempotent task again."""
    now = now or timezone.now()
    count = 0
    stale = now - STUCK_AFTER
    for lease_id in Lease.objects.filter(state=LeaseState.PROVISIONING, allocations__freed_at__isnull=True,
                                         allocations__created_at__lte=stale).values_list("pk", flat=True).distinct():
        task("lease_provision_run").delay(lease_id)
        count += 1
    releasing = Lease.objects.filter(state=LeaseState.RELEASING, events__to_state=LeaseState.RELEASING,
                                     events__at__lte=stale).values_list("pk", flat=True).distinct()
    for lease_id in releasing:
        final = LeaseState.EXPIRED if Lease.objects.filter(pk=lease_id, ends_at__lte=now).exists() \
            else LeaseState.RELEASED
        task("lease_release_run").delay(lease_id, final)
        count += 1
    return count


def node_reconcile(*, node: Node, now: datetime | None = None) -> dict:
    """The agent's inventory against the database: instances no live allocation owns are destroyed
    (orphans); live, ready allocations whose instance vanished fail their lease at that moment."""
    now = now or timezone.now()
    asked_at = timezone.now()
    inventory = agent_client(node).inventory()
    with transaction.atomic(durable=True):
        node_inventory_sync(node=node, inventory=inventory, now=now)
    present = {item["allocation_id"] for item in inventory["instances"]}
    live = {a.instance_id: a for a in Allocation.objects.filter(gpu__node=node, freed_at__isnull=True)
            .select_related("lease")}
    orphans = [instance for instance in present if instance not in live]
    for instance in orphans:
        # made by a create whose answer never arrived, or left behind by a release that gave up
        agent_client(node).destroy(instance)
    # only what was ready before the inventory was asked for (a create racing the reconcile is not lost)
    vanished = [a for a in live.values() if a.instance_id not in present and a.state == AllocationState.READY
                and a.ready_at is not None and a.ready_at < asked_at]
    lost_warm = [a.pk for a in live.values() if a.lease_id is None and a.state == AllocationState.WARM
                 and a.instance_id not in present and a.warm_at is not None and a.warm_at < asked_at]
    if lost_warm:  # a warm pool member destroyed behind the broker's back: the pool is one smaller
        Allocation.objects.filter(pk__in=lost_warm, lease__isnull=True, state=AllocationState.WARM).update(
            state=AllocationState.FREED, freed_at=now)
    for lease_id in sorted({a.lease_id for a in vanished}):
        lease = Lease.objects.get(pk=lease_id)
        if lease.state in FINAL_STATES:
            continue
        release_instances_quietly(lease)  # the rest of a multi-GPU lease goes too
        allocations_free(lease=lease, now=now, to=LeaseState.FAILED, actor=f"agent:{node.node_id}",
                         reason=f"the instance vanished from {node.node_id} (GPU lost or destroyed outside the "
                                f"broker) at {now.isoformat(timespec='seconds')}")
    return {"orphans": len(orphans), "vanished": len(vanished)}


def nodes_check_heartbeats(*, now: datetime | None = None) -> int:
    """Silence, in two steps (docs/operations.md, "A silent node"):

    1. A ready node silent for three heartbeat periods becomes ``silent``: out of scheduling at once. Its
       leases keep their allocations (and their instances on the node) and their reason says the node is
       silent and when they will fail. Audited (``node.silent``).
    2. A silent node whose last heartbeat is older than ``AGENT_LOST_AFTER_SECONDS`` loses its leases:
       they fail, and their time stops counting (billing, SLO) at the node's last heartbeat (or at the
       lease's own last event, when that is later), not at the end of the grace.

    A node that heartbeats within the grace is ready again (``node_heartbeat``) and its leases run on.
    Also prunes expired agent nonces. Returns the number of nodes newly taken out."""
    from broker.models import AgentNonce

    now = now or timezone.now()
    grace = timedelta(seconds=settings.AGENT_LOST_AFTER_SECONDS)
    limit = now - timedelta(seconds=3 * settings.AGENT_HEARTBEAT_SECONDS)
    silenced = 0
    for node in Node.objects.filter(status=NodeStatus.READY, last_heartbeat_at__lt=limit).order_by("pk"):
        with transaction.atomic(durable=True):
            if not Node.objects.filter(pk=node.pk, status=NodeStatus.READY, last_heartbeat_at__lt=limit).update(
                    status=NodeStatus.SILENT, silent_since=now):
                continue  # it answered meanwhile
            last = node.last_heartbeat_at
            deadline = last + grace
            reason = (f"node {node.node_id} {SILENT_NOTE} (last heartbeat {last.isoformat(timespec='seconds')}); "
                      f"the lease keeps its capacity and fails at {deadline.isoformat(timespec='seconds')} "
                      f"unless the node answers again")
            count = _leases_on(node).update(reason=reason)
            audit_record(tenant=None, by=None, action="node.silent", target=node.node_id,
                         data={"last_heartbeat_at": last.isoformat(), "lost_at": deadline.isoformat(), "leases": count})
            silenced += 1
    for node in Node.objects.filter(status=NodeStatus.SILENT, last_heartbeat_at__lt=now - grace).order_by("pk"):
        for lease in _leases_on(node).order_by("pk"):
            last_event = lease.events.order_by("-at").values_list("at", flat=True).first()
            stop = max(node.last_heartbeat_at, last_event or node.last_heartbeat_at)
            if not Node.objects.filter(pk=node.pk, status=NodeStatus.SILENT).exists():
                break  # it came back meanwhile: its leases run on
            allocations_free(lease=lease, now=stop, to=LeaseState.FAILED, actor="broker",
                             reason=f"node {node.node_id} stopped answering (last heartbeat "
                                    f"{node.last_heartbeat_at.isoformat(timespec='seconds')}, silent for more than "
                                    f"{settings.AGENT_LOST_AFTER_SECONDS} s); the lease ended at its last heartbeat")
    AgentNonce.objects.filter(expires_at__lt=now).delete()
    return silenced


# -- nodes: cordon ---------------------------------------------------------------------------------------
def node_cordon(*, node: Node, by_user=None, reason: str = "") -> Node:
    """Close a node to new placements (platform staff). Leases running there keep running; the scheduler
    snapshot treats the node as full from the next cycle. Idempotent; the change is audited."""
    return _node_set_cordoned(node=node, cordoned=True, by_user=by_user, reason=reason)


def node_uncordon(*, node: Node, by_user=None, reason: str = "") -> Node:
    """Open a cordoned node to new placements again and trigger a cycle for what waits. Idempotent."""
    return _node_set_cordoned(node=node, cordoned=False, by_user=by_user, reason=reason)


def _node_set_cordoned(*, node: Node, cordoned: bool, by_user, reason: str) -> Node:
    with transaction.atomic(durable=True):
        changed = Node.objects.filter(pk=node.pk, cordoned=not cordoned).update(cordoned=cordoned)
        if changed:
            audit_record(tenant=None, by=by_user, action="node.cordon" if cordoned else "node.uncordon",
                         target=node.node_id, data={"reason": reason} if reason else {})
            if not cordoned:
                enqueue("schedule_cycle")
    node.refresh_from_db()
    return node

