"""``POST /api/v1/billing/stripe/webhook``: Stripe's events, verified by their signature.

No session, token or CSRF check: the ``Stripe-Signature`` header (HMAC-SHA256 of the raw body with
``STRIPE_WEBHOOK_SECRET``, checked by the SDK with its default tolerance of 300 s) is the authentication.
A forged, stale or missing signature gets 400 problem+json and nothing is written; a verified event is handed
to :func:`billing.services.stripe_sync.stripe_event_apply` and answered 200 (a replay too, so Stripe stops resending).
"""

from __future__ import annotations

import json
import logging

import stripe
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from billing.services import stripe_sync
from core.errors import ApplicationError
from core.problems import PROBLEM_CONTENT_TYPE, problem_body

logger = logging.getLogger(__name__)


def _problem(status: int, title: str, code: str, detail: str, field: str | None = None,
             headers: dict[str, str] | None = None) -> JsonResponse:
    return JsonResponse(problem_body(status=status, title=title, detail=detail, code=code, field=field),
                        status=status, content_type=PROBLEM_CONTENT_TYPE, headers=headers)


@csrf_exempt
def stripe_webhook(request: HttpRequest) -> JsonResponse:
    if request.method != "POST":
        return _problem(405, "Method not allowed", "method_not_allowed", "Stripe delivers events with POST.",
                        headers={"Allow": "POST"})
    # comma-separated: the new signing secret first and, while Stripe rolls it, the old one (docs/security.md)
    secrets = [part.strip() for part in settings.STRIPE_WEBHOOK_SECRET.split(",") if part.strip()]
    if not secrets:
        return _problem(503, "Stripe webhooks are not configured", "stripe_webhooks_disabled",
                        "STRIPE_WEBHOOK_SECRET is empty; no event can be verified.")
    payload = request.body
    for number, secret in enumerate(secrets, start=1):
        try:
            stripe.WebhookSignature.verify_header(payload, request.headers.get("Stripe-Signature"), secret,
                                                  tolerance=stripe.Webhook.DEFAULT_TOLERANCE)
            break
        except stripe.SignatureVerificationError as error:
            if number < len(secrets):
                continue
            logger.warning("Stripe webhook refused: %s", error.user_message or error)
            return _problem(400, "Invalid Stripe signature", "invalid_signature",
                            f"Stripe-Signature: {error.user_message or error}", field="Stripe-Signature")
    try:
        event = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as error:
        return _problem(400, "Malformed request body", "parse_error", f"body: {error}", field="body")
    try:
        record, created = stripe_sync.stripe_event_apply(payload=event)
    except ApplicationError as error:
        return _problem(error.status, error.title, error.code, error.message, field=error.field)
    return JsonResponse({"id": record.event_id, "type": record.type, "outcome": record.outcome,
                         "replayed": not created, "invoice": record.invoice_id})
