from django.contrib import admin
from rest_framework_api_key.admin import APIKeyModelAdmin

from jobs.models import Client, ClientAPIKey, Job


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
