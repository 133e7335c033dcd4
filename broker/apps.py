from django.apps import AppConfig


class BrokerConfig(AppConfig):
    """Leases, nodes, GPUs and their allocations: the request → schedule → provision → release lifecycle.

    Package name, app label and table prefix say the same word: ``broker`` (``broker.Lease``, ``broker_lease``).
    """

    name = "broker"
    verbose_name = "Broker"

    def ready(self) -> None:
        # the services send their follow-up tasks by name: importing the tasks registers them (core.task_registry)
        from broker import tasks  # noqa: F401
        from broker.selectors import quota_usage
        from broker.services.suspension import TENANT_STATUS_LISTENER
        from tenants.extensions import quota_usage_register, tenant_status_listener_register

        # tenants sits below the broker: what a tenant's status change does to its leases, and the usage its
        # quotas show, are the broker's, registered here (tenants.extensions)
        tenant_status_listener_register(TENANT_STATUS_LISTENER)
        quota_usage_register(lambda actor: quota_usage(actor=actor))
        # the fleet's node pools, that a project's pools are checked against (tenants.services.project_pools_set)
        from broker.selectors import node_pool_names
        from tenants.extensions import fleet_pools_register

        fleet_pools_register(node_pool_names)
        # its kind of data in the retention policy (tenants.retention): raw lease events
        from broker.retention import LEASE_EVENTS
        from tenants.retention import retention_kind_register

        retention_kind_register(LEASE_EVENTS)
        # its part in a tenant leaving (tenants.offboarding): leases in the export, closure refused while one runs
        from broker.offboarding import leases_part, leases_unfinished
        from tenants.offboarding import closure_check_register, export_part_register

        export_part_register("broker", leases_part)
        closure_check_register("broker-leases", leases_unfinished)
