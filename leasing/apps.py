from django.apps import AppConfig


class LeasingConfig(AppConfig):
    """Leases, nodes, GPUs and their allocations: the request → schedule → provision → release lifecycle.

    The package was called ``broker``; its app label stays ``broker`` so that the migrations, the table names
    (``broker_lease`` …), the content types and the permissions of every existing database stay as they are.
    """

    name = "leasing"
    label = "broker"
    verbose_name = "Leasing"
