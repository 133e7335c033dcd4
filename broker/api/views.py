"""Leasing REST API (tenant-facing) and the agents' enrollment and heartbeat endpoints."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from agent.protocol import HEADER_NODE
from broker import selectors, services
from broker.api import serializers as s
from broker.choices import LeaseState
from core.api import paginate, parse
from core.errors import ValidationFailed
from core.openapi import PAGE_PARAMETERS, paginated, problem
from core.parsers import parse_integer


def _actor_label(request) -> str:
    return f"user:{request.user.get_username()}"


class LeaseListApi(APIView):
    write_action = "use"

    @extend_schema(
        parameters=[OpenApiParameter("state", {"type": "array", "minItems": 1,
                                               "items": {"type": "string", "enum": list(LeaseState.values)}},
                                     style="form", explode=False, description="comma-separated states"),
                    OpenApiParameter("project", str, description="project slug"), *PAGE_PARAMETERS],
        responses=paginated(s.LeaseOutput), operation_id="v1_leases_list",
        summary="Leases of the tenant, newest first")
    def get(self, request):
        if request.query_params.get("state") == "":
            raise ValidationFailed("state must name at least one state (or be left out).", field="state")
        leases = selectors.lease_list(actor=request.actor, state=request.query_params.get("state", ""),
                                      project=request.query_params.get("project", ""))
        return paginate(self, request, leases, s.LeaseOutput)

    @extend_schema(
        request=s.LeaseCreateInput,
        responses={201: s.LeaseOutput, 200: s.LeaseOutput,
                   402: problem("A monthly spend cap would be exceeded (the figures are in the body)"),
                   404: problem("No such project in this tenant"),
                   409: problem("Quota exceeded, or the Idempotency-Key was used with another body")},
        parameters=[OpenApiParameter("Idempotency-Key", {"type": "string", "maxLength": 200}, OpenApiParameter.HEADER,
                                     description="same key + same body → the same lease; other body → 409")],
        summary="Request GPU capacity (a whole GPU, a MIG slice or a share)")
    def post(self, request):
        data = s.lease_create_parse(request.data)
        lease, created = services.lease_request(actor=request.actor,
                                                idempotency_key=request.headers.get("Idempotency-Key", ""), **data)
        return Response(s.LeaseOutput(lease).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class LeaseDetailApi(APIView):
    write_action = "release"  # DELETE gives the lease back: allowed while the tenant is suspended

    @extend_schema(responses=s.LeaseDetailOutput, summary="A lease with its devices and events")
    def get(self, request, pk: int):
        return Response(s.LeaseDetailOutput(selectors.lease_get(actor=request.actor, lease_id=pk)).data)

    @extend_schema(responses={202: s.LeaseOutput},  # idempotent under the row lock: never a 409
                   summary="Release a lease (202; it becomes RELEASED; again: 202 with the lease as it is)")
    def delete(self, request, pk: int):
        lease = selectors.lease_get(actor=request.actor, lease_id=pk)
        lease = services.lease_release(lease=lease, actor=_actor_label(request))
        return Response(s.LeaseOutput(lease).data, status=status.HTTP_202_ACCEPTED)


class LeaseRenewApi(APIView):
    write_action = "use"

    @extend_schema(request=s.LeaseRenewInput,
                   responses={200: s.LeaseOutput, 409: problem("Only an active lease can be renewed"),
                              402: problem("A refusing monthly spend cap would be passed by the renewal's added "
                                           "cost (budget_exceeded, with the figures)")},
                   summary="Extend an active lease (it then ends duration_seconds after the renewal)")
    def post(self, request, pk: int):
        data = parse(s.LeaseRenewInput, request)
        lease = selectors.lease_get(actor=request.actor, lease_id=pk)
        lease = services.lease_renew(lease=lease, actor=_actor_label(request), **data)
        return Response(s.LeaseOutput(lease).data)


class LeaseLogsApi(APIView):
    """The lease's workload log from its node: ``offset`` (from there) or ``tail`` (the last bytes), ``limit``
    (at most 256 KiB), ``stream`` (stdout | stderr), ``follow`` (a long poll: wait at most
    ``WORKLOAD_LOG_FOLLOW_SECONDS`` for bytes after ``offset``, then re-ask from ``next_offset``; 429 over the
    tenant's waiting follows), ``placement`` (an earlier placement's log, as the broker kept it when that placement
    ended). docs/leasing.md "Following a log"."""

    @extend_schema(
        parameters=[OpenApiParameter("stream", {"type": "string", "enum": ["stdout", "stderr"]}),
                    OpenApiParameter("offset", {"type": "integer", "minimum": 0}),
                    OpenApiParameter("tail", {"type": "integer", "minimum": 0}),
                    OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": 262144}),
                    OpenApiParameter("follow", {"type": "integer", "minimum": 0, "maximum": 60},
                                     description="a long poll: when there are no bytes after offset yet, wait up "
                                                 "to this many seconds, but never longer than the server's "
                                                 "WORKLOAD_LOG_FOLLOW_SECONDS (default 5), for some; then answer "
                                                 "(maybe empty) and re-ask with offset=next_offset while state "
                                                 "is running. Waiting follows are capped per tenant (429)"),
                    OpenApiParameter("placement", {"type": "integer", "minimum": 1, "maximum": 100000},
                                     description="an earlier placement's log (1, 2, …; default the current): "
                                                 "the tail the broker kept when it ended")],
        responses={200: {"type": "object", "additionalProperties": True},
                   400: problem("A parameter out of range (the field names it)"),
                   404: problem("No such lease in this tenant, or it has no workload"),
                   429: problem("too_many_follows: the tenant already has WORKLOAD_LOG_FOLLOWS_PER_TENANT follows "
                                "waiting, or this server's waiting places are taken; re-ask after Retry-After "
                                "seconds (or without follow). Also the request budget (too_many_requests)")},
        summary="The lease's workload log (tail, or from an offset; follow: a long poll of a few seconds)")
    def get(self, request, pk: int):
        lease = selectors.lease_get(actor=request.actor, lease_id=pk)
        query = request.query_params

        def number(name: str, high: int) -> int | None:
            return parse_integer(query[name], field=name, low=0, high=high) if name in query else None

        stream = query.get("stream", "stdout")
        if stream not in ("stdout", "stderr"):
            raise ValidationFailed("stream must be stdout or stderr.", field="stream")
        offset, tail = number("offset", 2**62), number("tail", 262144)
        if offset is not None and tail is not None:
            raise ValidationFailed("Give offset or tail, not both.", field="tail")
        limit = number("limit", 262144)
        if limit == 0:  # documented minimum 1 (the fuzzer's limit=0 was taken as "the default")
            raise ValidationFailed("limit must be a whole number from 1 to 262144.", field="limit")
        limit = limit or 65536
        follow = number("follow", 60) or 0
        placement = number("placement", 100000)
        if placement == 0:
            raise ValidationFailed("placement counts from 1.", field="placement")
        return Response(services.workload_logs(lease=lease, stream=stream, offset=offset,
                                               tail=tail if tail is not None or offset is not None else 16384,
                                               limit=limit, follow_seconds=follow, placement=placement))


class AgentEnrollApi(APIView):
    """An agent trades an enrollment token for its node's secret, or (an enrolled node) re-enrolls with a
    request signed with its current secret (docs/agent-protocol.md)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(request=s.EnrollInput,
                   responses={201: s.EnrolledOutput, 401: problem("Invalid, expired or spent enrollment token"),
                              409: problem("The node id is enrolled, or a GPU belongs to another node"),
                              422: problem("The address does not name an IP inside the agents' networks "
                                           "(NODE_ADDRESS_NETWORKS): node_address_refused")},
                   summary="Agent enrollment")
    def post(self, request):
        body = request.body
        data = parse(s.EnrollInput, request)
        signed = False
        if request.headers.get(HEADER_NODE):
            try:
                services.node_request_verify(node_id=data["node_id"], headers=request.headers, method="POST",
                                             path=request.path, query=request.META.get("QUERY_STRING", ""), body=body)
                signed = True
            except services.AgentUnauthenticated:
                if not data.get("token"):
                    raise
        node = services.node_enroll(node_id=data["node_id"], token=data.get("token", ""), address=data["address"],
                                    inventory=data["inventory"], hostname=data.get("hostname", ""),
                                    agent_version=data.get("agent_version", ""), signed_by_node=signed,
                                    enrollment_id=data.get("enrollment_id", ""))
        return Response({"node_id": node.node_id, "secret": node.secret,
                         "heartbeat_seconds": settings.AGENT_HEARTBEAT_SECONDS}, status=status.HTTP_201_CREATED)


class AgentHeartbeatApi(APIView):
    """Signed by the node's secret (agent.protocol), each nonce accepted once across all web processes;
    401 otherwise."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(request={"application/json": {"type": "object", "additionalProperties": True}},
                   responses={200: s.HeartbeatOutput, 401: problem("Missing, stale or wrong signature")},
                   summary="Agent heartbeat (signed)")
    def post(self, request, node_id: str):
        services.node_heartbeat_signed(node_id=node_id, headers=request.headers, method="POST", path=request.path,
                                       query=request.META.get("QUERY_STRING", ""), body=request.body)
        return Response({"heartbeat_seconds": settings.AGENT_HEARTBEAT_SECONDS})


class AgentWorkloadsApi(APIView):
    """What a node's workloads did (signed like the heartbeat): ``{"workloads": [report, ...]}`` →
    ``{"acked": {workload_id: last recorded event seq}}`` (docs/agent-protocol.md, "Workloads")."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(request={"application/json": {"type": "object", "additionalProperties": True}},
                   responses={200: {"type": "object", "additionalProperties": True},
                              401: problem("Missing, stale or wrong signature")},
                   summary="Agent workload report (signed)")
    def post(self, request, node_id: str):
        node = services.node_request_verify(node_id=node_id, headers=request.headers, method="POST",
                                            path=request.path, query=request.META.get("QUERY_STRING", ""),
                                            body=request.body)
        body = request.data if isinstance(request.data, dict) else {}
        return Response({"acked": services.workloads_report(node=node, reports=body.get("workloads"))})
