"""A Stripe-compatible test server for the test suite (Stripe's servers cannot be reached from here).

It answers the official ``stripe`` SDK as Stripe does for the endpoints the broker uses, checks every
request's method, path, authentication and form fields against Stripe's documented parameters
(:mod:`tests.stripe_server.spec`), keeps idempotent results for 24 h, can inject faults (500, 429, hangs),
records every request, and signs webhook events the way Stripe does (:mod:`tests.stripe_server.webhooks`).

    with StripeTestServer() as server:
        client = stripe.StripeClient(server.api_key, base_addresses={"api": server.url})

``python -m tests.stripe_server`` runs one in the foreground for manual use.
"""

from tests.stripe_server.server import DEFAULT_API_KEY, DEFAULT_WEBHOOK_SECRET, RecordedRequest, StripeTestServer
from tests.stripe_server.webhooks import build_event, deliver, post_signed, signature_header

__all__ = [
    "DEFAULT_API_KEY",
    "DEFAULT_WEBHOOK_SECRET",
    "RecordedRequest",
    "StripeTestServer",
    "build_event",
    "deliver",
    "post_signed",
    "signature_header",
]
