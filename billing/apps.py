from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"
    verbose_name = "Metering and billing"

    def ready(self) -> None:
        """Take part in leasing's decisions through its seam (``broker.extensions``): the monthly spend caps
        admit or refuse requests and renewals, an invoice unpaid past its dunning grace refuses new
        requests, the general price book ranks ``model: auto``, and its money format writes
        the prices in leasing's reasons."""
        from billing import selectors, services, tasks  # noqa: F401 (tasks: registered for sending by name)
        from billing.core.pricing import format_money
        from broker import extensions

        extensions.request_check_register(services.budget_admit_request, applies=services.budget_caps_exist)
        from billing.services import dunning

        extensions.request_check_register(dunning.dunning_admit_request, applies=dunning.dunning_restricted_exists)
        extensions.renewal_check_register(services.budget_admit_renewal)
        extensions.list_prices_register(selectors.whole_list_prices)
        extensions.money_format_register(format_money)
        # its kind of data in the retention policy (tenants.retention): hourly utilisation samples
        from billing.retention import UTILISATION
        from tenants.retention import retention_kind_register

        retention_kind_register(UTILISATION)
        # its part in a tenant leaving (tenants.offboarding): usage and invoices in the export, the final invoice
        from billing.offboarding import billing_part, final_invoices_issue
        from tenants.offboarding import closure_step_register, export_part_register

        export_part_register("billing", billing_part)
        closure_step_register("billing-final-invoice", final_invoices_issue)
