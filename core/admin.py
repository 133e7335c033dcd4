"""The one Django admin wrapper for models written by services (tenants, billing, capacity use it).

How a write goes (``ServiceAdmin``):
- the admin's forms check types; ``save_model`` / ``save_related`` / ``delete_model`` of each admin call the
  app's services, which check the rest and write the audit row;
- every service is one transaction of its own, so the admin's own wrapping transaction (Django opens one
  around each change form and delete) is left out: a durable service cannot nest in it, and a non-durable one
  gains nothing from it, since each admin write is one service call;
- a service's refusal (``ApplicationError``) is an error message on the page, naming the field, nothing of that
  write saved, never a 500;
- Django's bulk "delete selected" is off (it deletes rows without the services): one object at a time;
- an inline without a service of its own refuses to save rather than write around the services.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import admin, messages
from django.contrib.admin.options import csrf_protect_m
from django.http import HttpResponseRedirect

from core.errors import ApplicationError


class ServiceAdmin(admin.ModelAdmin):
    """A model admin whose writes are service calls: no wrapping transaction, refusals as messages."""

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # bulk deletes bypass the services
        return actions

    @csrf_protect_m
    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:  # not in a transaction: each service is one transaction of its own
            return self._changeform_view(request, object_id, form_url, extra_context)
        except ApplicationError as error:
            return self.refused(request, error)

    @csrf_protect_m
    def delete_view(self, request, object_id, extra_context=None):
        try:
            return self._delete_view(request, object_id, extra_context)
        except ApplicationError as error:
            return self.refused(request, error)

    def refused(self, request, error: ApplicationError) -> HttpResponseRedirect:
        """The service's refusal as a message on the same page (the field first, when one was at fault)."""
        where = f"{error.field}: " if error.field else ""
        self.message_user(request, f"Not saved — {where}{error.message}", level=messages.ERROR)
        return HttpResponseRedirect(request.get_full_path())

    def save_formset(self, request, form, formset, change):
        formset.save(commit=False)  # what changed, for the admin's log; read-only inlines change nothing
        if formset.new_objects or formset.changed_objects or formset.deleted_objects:
            raise NotImplementedError(f"{type(self).__name__}: {formset.model.__name__} has no service here")

    def each_row(self, request, queryset, what: str, call: Callable) -> None:
        """An action over the selection, one service call per row, each refusal reported with its row."""
        done = 0
        for obj in queryset.order_by("pk"):
            try:
                call(obj)
            except ApplicationError as error:
                self.message_user(request, f"{obj}: {error.message}", level=messages.ERROR)
                continue
            done += 1
        if done:
            self.message_user(request, f"{done} {what}.", level=messages.SUCCESS)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows written only by the services (alerts, notifications, deliveries): listed and shown, never added, changed
    or deleted from the admin."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
