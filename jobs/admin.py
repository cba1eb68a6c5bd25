from django.contrib import admin
from rest_framework_api_key.admin import APIKeyModelAdmin

from executor.models import Attempt
from jobs.models import Client, ClientAPIKey, Job


class AttemptInline(admin.TabularInline):
    """Every attempt of the job, with what it cost and where the figure comes from (quoted, derived or
    local; empty: unpriced)."""

    model = Attempt
    fields = ("number", "run", "step", "provider", "model", "upstream_key", "state", "error_class", "error",
              "usage", "cost_usd", "cost_source", "duration_ms", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("number",)

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Client)
class ClientAdmin(admin.ModelAdmin):
    list_display = ("name", "id", "monthly_cap_usd", "created_at")
    search_fields = ("name", "id")


@admin.register(ClientAPIKey)
class ClientAPIKeyAdmin(APIKeyModelAdmin):
    list_display = (*APIKeyModelAdmin.list_display, "client")


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "client", "kind", "status", "run", "created_at", "completed_at")
    list_filter = ("status", "kind")
    search_fields = ("id", "idempotency_key")
    readonly_fields = [f.name for f in Job._meta.fields]
    inlines = [AttemptInline]
