"""The operators' client views: clients and their API keys (the accounts app's rows)."""

from django.contrib import admin
from rest_framework_api_key.admin import APIKeyModelAdmin
from rest_framework_api_key.models import APIKey

from accounts.models import Client, ClientAPIKey


@admin.register(Client)
class ClientAdmin(admin.ModelAdmin):
    list_display = ("name", "id", "monthly_cap_usd", "creates_per_s", "create_burst", "max_running", "weight",
                    "created_at")
    search_fields = ("name", "id")


@admin.register(ClientAPIKey)
class ClientAPIKeyAdmin(APIKeyModelAdmin):
    list_display = (*APIKeyModelAdmin.list_display, "client")


# The library registers its own APIKey model's admin: a second "API keys" entry on the index, always
# empty (every key payonce issues is a ClientAPIKey, above). Its app loads before this one, so it is
# registered by the time this runs.
if admin.site.is_registered(APIKey):
    admin.site.unregister(APIKey)
