"""Auto-tiering's REST API: workloads, their profiles per slice, the engine's prediction, and the samples a
running workload reports on its lease. Views parse, read through ``tiering.selectors``, call one service."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from broker import selectors as broker_selectors
from core.api import paginate, parse
from core.openapi import PAGE_PARAMETERS, paginated, problem
from tenants.permissions import TenantRolePermission
from tiering import profiler, selectors, services
from tiering.api import serializers as s
from tiering.credentials import SamplesCredential, SamplesCredentialAuthentication


class WorkloadListApi(APIView):
    write_action = "use"

    @extend_schema(responses=paginated(s.WorkloadOutput), parameters=PAGE_PARAMETERS, operation_id="v1_workloads_list",
                   summary="The tenant's workloads")
    def get(self, request):
        return paginate(self, request, selectors.workload_list(actor=request.actor), s.WorkloadOutput)

    @extend_schema(request=s.WorkloadInput, responses={201: s.WorkloadOutput},
                   summary="Register a workload (an architecture, how it runs, and its target)")
    def post(self, request):
        parse(s.WorkloadInput, request)  # the body's shape: unknown fields, JSON types (the service checks values)
        workload = services.workload_register(actor=request.actor, data=request.data)
        return Response(s.WorkloadOutput(workload).data, status=status.HTTP_201_CREATED)


class WorkloadDetailApi(APIView):
    write_action = "use"

    @extend_schema(responses=s.WorkloadOutput, summary="One workload")
    def get(self, request, name: str):
        return Response(s.WorkloadOutput(selectors.workload_get(actor=request.actor, name=name)).data)

    @extend_schema(request=s.WorkloadRegimeInput, responses={200: s.WorkloadOutput},
                   summary="Set the regime the workload runs in (engine, eager, or empty: inferred)")
    def patch(self, request, name: str):
        data = parse(s.WorkloadRegimeInput, request)
        workload = selectors.workload_get(actor=request.actor, name=name)
        if "regime" in data:
            workload = services.workload_regime_set(actor=request.actor, workload=workload,
                                                    regime=data["regime"] or "")
        return Response(s.WorkloadOutput(workload).data)


class WorkloadProfileApi(APIView):
    @extend_schema(responses=s.ProfileOutput(many=True),
                   summary="The workload's profile per slice: profiled, observed and predicted figures")
    def get(self, request, name: str):
        workload = selectors.workload_get(actor=request.actor, name=name)
        return Response(s.ProfileOutput(selectors.profile_list(workload=workload), many=True).data)


def _option_data(option) -> dict:
    return {"slice": option.slice.key, "label": option.slice.label, "price_per_hour": option.price,
            "throughput": option.throughput, "memory_mib": option.memory_mib, "confidence": option.confidence,
            "basis": option.basis}


def prediction_data(workload, decision) -> dict:
    option = decision.option
    return {"workload": workload.name, "regime": services.workload_regime(workload)[0],
            "required_throughput": decision.required,
            "chosen": None if option is None else _option_data(option),
            "slices": [_option_data(each) for each in decision.options],
            "profile_first": decision.profile_first, "reason": decision.reason,
            "explore": [where.key for where in decision.candidates]}


class WorkloadPredictionApi(APIView):
    """A POST: the prediction is stored as the workload's ``predicted`` profiles (replacing the last ones) and
    audited, so asking for one writes rows and needs the ``use`` action (members and up, write tokens)."""

    write_action = "use"

    @extend_schema(request=None, responses={200: s.PredictionOutput, 404: problem("No such workload in this tenant")},
                   operation_id="v1_workloads_prediction_create",
                   summary="Predict (and store as predicted profiles) the cheapest slice at the tenant's prices that "
                           "meets the workload's target")
    def post(self, request, name: str):
        workload = selectors.workload_get(actor=request.actor, name=name)
        return Response(prediction_data(workload, services.workload_predict(workload=workload)))


class WorkloadProfilingApi(APIView):
    """Profiling runs of a workload: one short lease per candidate slice, measured from Prometheus and the
    workload's own samples (docs/tiering.md, "The profiler")."""

    write_action = "use"

    @extend_schema(responses=paginated(s.ProfilingRunOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_workloads_profiling_runs_list",
                   summary="The workload's profiling runs, newest first, with each candidate slice's outcome (a page)")
    def get(self, request, name: str):
        workload = selectors.workload_get(actor=request.actor, name=name)
        return paginate(self, request, selectors.profiling_run_list(workload=workload), s.ProfilingRunOutput)

    @extend_schema(request=s.ProfilingRunInput,
                   responses={201: s.ProfilingRunOutput, 404: problem("No such workload or project in this tenant"),
                              402: problem("Every candidate's lease would pass a refusing monthly spend cap "
                                           "(budget_exceeded, with the figures)"),
                              409: problem("The workload is being profiled already, or no candidate's lease fits "
                                           "the quota")},
                   summary="Profile the workload: a short lease per candidate slice (default: the whole GPU of each "
                           "priced model in the fleet), in parallel where capacity allows")
    def post(self, request, name: str):
        workload = selectors.workload_get(actor=request.actor, name=name)
        body = parse(s.ProfilingRunInput, request)
        run = profiler.profiling_start(actor=request.actor, workload=workload, project=body.get("project"),
                                       slices=body.get("slices"), window_seconds=body.get("window_seconds"))
        return Response(s.ProfilingRunOutput(run).data, status=status.HTTP_201_CREATED)


class WorkloadAdviceApi(APIView):
    @extend_schema(responses=paginated(s.AdviceOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_workloads_advice_list",
                   summary="Open migration and quantization advice for the workload's running leases (advice only; "
                           "a page)")
    def get(self, request, name: str):
        workload = selectors.workload_get(actor=request.actor, name=name)
        return paginate(self, request, selectors.advice_list(actor=request.actor, workload=workload), s.AdviceOutput)


class SamplesCredentialOrTenantRole(TenantRolePermission):
    """The samples route: a profiling lease's samples credential (checked against the lease by the service), or
    a tenant's API token or session with the ``use`` action as on every other route."""

    def has_permission(self, request, view) -> bool:
        if isinstance(request.auth, SamplesCredential):
            return True
        return super().has_permission(request, view)


class LeaseSampleApi(APIView):
    write_action = "use"
    authentication_classes = [SamplesCredentialAuthentication, *api_settings.DEFAULT_AUTHENTICATION_CLASSES]
    permission_classes = [SamplesCredentialOrTenantRole]

    @extend_schema(request=s.SampleInput,
                   responses={201: s.SampleOutput, 403: problem("A samples credential of another lease"),
                              404: problem("No such lease (or named workload) in this tenant"),
                              409: problem("The lease is not running: samples are taken while it runs")},
                   summary="The workload's own throughput on this lease (samples/s; tokens/s for generation)")
    def post(self, request, pk: int):
        if isinstance(request.auth, SamplesCredential):
            body = parse(s.SampleInput, request)
            sample = services.lease_sample_record_by_credential(
                credential=request.auth, lease_id=pk, throughput=body.get("throughput"), step_ms=body.get("step_ms"),
                workload=body.get("workload"))
            return Response(s.SampleOutput(sample).data, status=status.HTTP_201_CREATED)
        broker_selectors.lease_get(actor=request.actor, lease_id=pk)  # 404 before the body, as every lease route
        body = parse(s.SampleInput, request)
        sample = services.lease_sample_record(actor=request.actor, lease_id=pk, throughput=body.get("throughput"),
                                              step_ms=body.get("step_ms"), workload=body.get("workload"))
        return Response(s.SampleOutput(sample).data, status=status.HTTP_201_CREATED)
