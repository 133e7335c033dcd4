"""Webhook endpoints of the tenant: admins manage them, everyone in the tenant reads them (never the
secret, which is shown once in the answer to create and rotate). Another tenant's endpoint is a 404."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import paginate, parse
from core.openapi import PAGE_PARAMETERS, paginated, problem
from notifications import selectors, services
from notifications.api import serializers as s

UNSAFE_URL = problem("The url is not https, or resolves to an address that is not public (field: url)")


def _with_secret(endpoint, secret: str) -> dict:
    endpoint.secret = secret
    return s.WebhookEndpointSecretOutput(endpoint).data


class WebhookListApi(APIView):
    write_action = "manage"

    @extend_schema(responses=paginated(s.WebhookEndpointOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_webhooks_list", summary="Webhook endpoints of the tenant")
    def get(self, request):
        return paginate(self, request, selectors.webhook_endpoint_list(actor=request.actor), s.WebhookEndpointOutput)

    @extend_schema(request=s.WebhookEndpointCreateInput,
                   responses={201: s.WebhookEndpointSecretOutput, 422: UNSAFE_URL},
                   summary="Add a webhook endpoint; its signing secret is in the response, once")
    def post(self, request):
        data = parse(s.WebhookEndpointCreateInput, request)
        endpoint, secret = services.webhook_endpoint_create(actor=request.actor, **data)
        return Response(_with_secret(endpoint, secret), status=status.HTTP_201_CREATED)


class WebhookDetailApi(APIView):
    write_action = "manage"

    @extend_schema(responses=s.WebhookEndpointOutput, summary="One webhook endpoint (never its secret)")
    def get(self, request, pk: int):
        return Response(s.WebhookEndpointOutput(selectors.webhook_endpoint_get(actor=request.actor, pk=pk)).data)

    @extend_schema(request=s.WebhookEndpointUpdateInput, responses={200: s.WebhookEndpointOutput, 422: UNSAFE_URL},
                   summary="Change an endpoint's URL, events or description, or (de)activate it")
    def patch(self, request, pk: int):
        endpoint = selectors.webhook_endpoint_get(actor=request.actor, pk=pk)
        data = parse(s.WebhookEndpointUpdateInput, request)
        endpoint = services.webhook_endpoint_update(actor=request.actor, endpoint=endpoint, **data)
        return Response(s.WebhookEndpointOutput(endpoint).data)

    @extend_schema(responses={204: None}, summary="Delete an endpoint (its pending deliveries are dropped)")
    def delete(self, request, pk: int):
        endpoint = selectors.webhook_endpoint_get(actor=request.actor, pk=pk)
        services.webhook_endpoint_delete(actor=request.actor, endpoint=endpoint)
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookRotateApi(APIView):
    write_action = "manage"

    @extend_schema(request=None, responses={200: s.WebhookEndpointSecretOutput},
                   summary="New signing secret (in the response, once); the old one signs too for a grace period")
    def post(self, request, pk: int):
        endpoint = selectors.webhook_endpoint_get(actor=request.actor, pk=pk)
        endpoint, secret = services.webhook_endpoint_rotate(actor=request.actor, endpoint=endpoint)
        return Response(_with_secret(endpoint, secret))


class WebhookDeliveryListApi(APIView):
    @extend_schema(responses=paginated(s.DeliveryOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_webhooks_deliveries_list", summary="Recent deliveries to one endpoint")
    def get(self, request, pk: int):
        endpoint = selectors.webhook_endpoint_get(actor=request.actor, pk=pk)
        return paginate(self, request, selectors.delivery_list(actor=request.actor, endpoint=endpoint),
                         s.DeliveryOutput)
