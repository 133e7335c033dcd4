"""Thin tasks: the outbox run, one delivery's send (re-enqueued with its back-off when it must be retried),
and the sweep of due deliveries (periodic, ``settings.CELERY_BEAT_SCHEDULE``)."""

from __future__ import annotations

from celery import shared_task

from core.task_registry import tasks_register
from notifications import billing_events, services


@shared_task(name="notifications.outbox_process", acks_late=True, ignore_result=True)
def outbox_process_task() -> int:
    return services.outbox_process()


@shared_task(name="notifications.delivery_send", acks_late=True, ignore_result=True)
def delivery_send_task(delivery_id: int) -> None:
    delay = services.delivery_send(delivery_id=delivery_id)
    if delay is not None:
        delivery_send_task.apply_async((delivery_id,), countdown=delay)


@shared_task(name="notifications.leases_expiring_notify", acks_late=True, ignore_result=True)
def leases_expiring_notify_task() -> int:
    return services.leases_expiring_notify()


@shared_task(name="notifications.deliveries_send_due", acks_late=True, ignore_result=True)
def deliveries_send_due_task() -> int:
    due = services.deliveries_due()
    for delivery_id in due:
        delivery_send_task.delay(delivery_id)
    return len(due)


@shared_task(name="notifications.spend_alerts_run", acks_late=True, ignore_result=True)
def spend_alerts_run_task() -> int:
    """Billing raises the month's spend alerts (thresholds, the month-boundary cap check); then they are told."""
    from billing.services.alerts import spend_alerts_run

    spend_alerts_run()
    return billing_events.spend_alerts_notify()


@shared_task(name="notifications.usage_events_notify", acks_late=True, ignore_result=True)
def usage_events_notify_task() -> int:
    return billing_events.usage_events_notify()


# the services send these by name (core.task_registry), without importing this module
tasks_register("notifications", outbox_process_task=outbox_process_task, delivery_send_task=delivery_send_task,
               deliveries_send_due_task=deliveries_send_due_task,
               leases_expiring_notify_task=leases_expiring_notify_task, spend_alerts_run_task=spend_alerts_run_task,
               usage_events_notify_task=usage_events_notify_task)
