"""Pipelines and model splits over REST: views parse, read through ``pipelines.selectors``, call one
``pipelines.services`` function and render; another tenant's objects are 404."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import paginate, parse
from core.openapi import PAGE_PARAMETERS, paginated, problem
from pipelines import selectors, services
from pipelines.api import serializers as s


class PipelineListApi(APIView):
    write_action = "use"

    @extend_schema(responses=paginated(s.PipelineOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_pipelines_list", summary="The tenant's pipelines (a page)")
    def get(self, request):
        return paginate(self, request, selectors.pipeline_list(actor=request.actor), s.PipelineOutput)

    @extend_schema(request=s.PipelineInput, responses={
        201: s.PipelineOutput, 404: problem("No such project"),
        422: problem("Well-formed parts that do not fit together (unprocessable, naming the field): an edge naming no "
                     "stage, a cycle, two stages of one name, a MIG profile the tier does not offer, a share without "
                     "milli, a stage with neither architecture nor profile, a model that fits on none of the tiers")},
                   summary="Describe an inference pipeline: stages, edges, end-to-end SLO, arrival rate")
    def post(self, request):
        data = parse(s.PipelineInput, request)
        pipeline = services.pipeline_create(actor=request.actor, **data)
        return Response(s.PipelineOutput(pipeline).data, status=status.HTTP_201_CREATED)


class PipelineDetailApi(APIView):
    @extend_schema(responses=s.PipelineOutput, summary="A pipeline")
    def get(self, request, pk: int):
        return Response(s.PipelineOutput(selectors.pipeline_get(actor=request.actor, pk=pk)).data)


class PlanCreateApi(APIView):
    write_action = "use"

    @extend_schema(request=s.PlanInput, responses={
        201: s.PlanOutput, 409: problem("Today's price list has no price for any of the pipeline's tiers")},
                   summary="Plan the pipeline (ESG: A* with dual-blade pruning, dominator-based SLO split)")
    def post(self, request, pk: int):
        pipeline = selectors.pipeline_get(actor=request.actor, pk=pk)
        data = parse(s.PlanInput, request)
        plan = services.plan_create(actor=request.actor, pipeline=pipeline, **data)
        return Response(s.PlanOutput(plan).data, status=status.HTTP_201_CREATED)


class PlanDetailApi(APIView):
    @extend_schema(responses=s.PlanOutput, summary="A plan with its leases once applied")
    def get(self, request, pk: int, plan_id: int):
        pipeline = selectors.pipeline_get(actor=request.actor, pk=pk)
        return Response(s.PlanOutput(selectors.plan_get(actor=request.actor, pipeline=pipeline, pk=plan_id)).data)


class PlanApplyApi(APIView):
    write_action = "use"

    @extend_schema(request=s.ApplyInput,
                   responses={200: s.PlanOutput, 409: problem("Not feasible or released"),
                              402: problem("A monthly spend cap refuses a stage's lease (budget_exceeded)")},
                   summary="Lease every stage of the plan, all or none")
    def post(self, request, pk: int, plan_id: int):
        pipeline = selectors.pipeline_get(actor=request.actor, pk=pk)
        plan = selectors.plan_get(actor=request.actor, pipeline=pipeline, pk=plan_id)
        data = parse(s.ApplyInput, request)
        return Response(s.PlanOutput(services.plan_apply(actor=request.actor, plan=plan, **data)).data)


class PlanReleaseApi(APIView):
    write_action = "release"

    @extend_schema(request=None, responses={200: s.PlanOutput, 409: problem("The plan is not applied")},
                   summary="Release every lease of the plan")
    def post(self, request, pk: int, plan_id: int):
        pipeline = selectors.pipeline_get(actor=request.actor, pk=pk)
        plan = selectors.plan_get(actor=request.actor, pipeline=pipeline, pk=plan_id)
        return Response(s.PlanOutput(services.plan_release(actor=request.actor, plan=plan)).data)


class ModelSplitCreateApi(APIView):
    write_action = "use"

    @extend_schema(request=s.ModelSplitInput, responses={
        201: s.ModelSplitOutput, 404: problem("No such project (candidates.project)"),
        409: problem("candidates {free: true}: no whole GPU is free now that the tenant's quotas let it lease "
                     "(field candidates)"),
        422: problem("Well-formed parts that do not fit together (unprocessable, naming the field): free_mib above "
                     "the model's memory, two candidates of one id, neither architecture nor layers, both or "
                     "neither of gpus and candidates, both or neither of candidates.free and candidates.tier, a "
                     "candidates.tier without candidates.count")},
                   summary="Split a model's layers over candidate GPUs (heuristic; equal-layers and optimum beside)")
    def post(self, request):
        data = parse(s.ModelSplitInput, request)
        split = services.model_split_create(actor=request.actor, gpus=data["gpus"], layers=data["layers"],
                                            architecture_name=data["architecture"], batch=data["batch"],
                                            name=data["name"], candidates=data["candidates"])
        return Response(s.ModelSplitOutput(split).data, status=status.HTTP_201_CREATED)


class ModelSplitDetailApi(APIView):
    @extend_schema(responses=s.ModelSplitOutput, summary="A model split")
    def get(self, request, pk: int):
        return Response(s.ModelSplitOutput(selectors.model_split_get(actor=request.actor, pk=pk)).data)


class ModelSplitApplyApi(APIView):
    write_action = "use"

    @extend_schema(request=s.ModelSplitApplyInput,
                   responses={200: s.ModelSplitOutput, 404: problem("No such split or project"),
                              409: problem("The split is released, found no groups that fit, or a node it was "
                                           "planned on no longer holds its model"),
                              402: problem("A monthly spend cap refuses a group's lease (budget_exceeded)")},
                   summary="Lease the split's GPUs as one gang (all or none), the layer range in each lease's access")
    def post(self, request, pk: int):
        split = selectors.model_split_get(actor=request.actor, pk=pk)
        data = parse(s.ModelSplitApplyInput, request)
        return Response(s.ModelSplitOutput(services.model_split_apply(actor=request.actor, split=split, **data)).data)


class ModelSplitReleaseApi(APIView):
    write_action = "release"

    @extend_schema(request=None, responses={200: s.ModelSplitOutput, 409: problem("The split is not applied")},
                   summary="Release every lease of the split")
    def post(self, request, pk: int):
        split = selectors.model_split_get(actor=request.actor, pk=pk)
        return Response(s.ModelSplitOutput(services.model_split_release(actor=request.actor, split=split)).data)
