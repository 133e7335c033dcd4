"""Run the Stripe test server in the foreground: ``python -m tests.stripe_server`` (Ctrl-C stops it)."""

import threading

from tests.stripe_server.server import StripeTestServer


def main() -> None:
    server = StripeTestServer().start()
    print(f"STRIPE_API_BASE={server.url}\nSTRIPE_API_KEY={server.api_key}\n"
          f"STRIPE_WEBHOOK_SECRET={server.webhook_secret}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
