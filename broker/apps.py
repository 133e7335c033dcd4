from django.apps import AppConfig


class BrokerConfig(AppConfig):
    """Leases, nodes, GPUs and their allocations: the request → schedule → provision → release lifecycle.

    Package name, app label and table prefix say the same word: ``broker`` (``broker.Lease``, ``broker_lease``).
    """

    name = "broker"
    verbose_name = "Broker"
