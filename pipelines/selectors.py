"""Reads of pipelines, plans and splits, always inside the actor's tenant (another tenant's is a 404)."""

from __future__ import annotations

from config.errors import NotFound
from pipelines.models import ModelSplit, Pipeline, PipelinePlan
from tenants.access import Actor


def pipeline_list(*, actor: Actor):
    return Pipeline.objects.filter(tenant=actor.tenant).select_related("project")


def pipeline_get(*, actor: Actor, pk: int) -> Pipeline:
    found = pipeline_list(actor=actor).filter(pk=pk).first()
    if found is None:
        raise NotFound("No such pipeline in this tenant.", field="id")
    return found


def plan_list(*, actor: Actor, pipeline: Pipeline):
    """The pipeline's plans, newest first."""
    return PipelinePlan.objects.filter(tenant=actor.tenant, pipeline=pipeline).order_by("-pk")


def model_split_list(*, actor: Actor):
    return ModelSplit.objects.filter(tenant=actor.tenant).order_by("-pk")


def plan_get(*, actor: Actor, pipeline: Pipeline, pk: int) -> PipelinePlan:
    found = PipelinePlan.objects.filter(tenant=actor.tenant, pipeline=pipeline, pk=pk).first()
    if found is None:
        raise NotFound("No such plan of this pipeline.", field="plan_id")
    return found


def model_split_get(*, actor: Actor, pk: int) -> ModelSplit:
    found = ModelSplit.objects.filter(tenant=actor.tenant, pk=pk).first()
    if found is None:
        raise NotFound("No such model split in this tenant.", field="id")
    return found
