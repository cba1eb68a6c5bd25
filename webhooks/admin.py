from django.contrib import admin, messages

from webhooks.models import Delivery, DeliveryAttempt, Endpoint, SigningSecret
from webhooks.services import delivery_replay, endpoint_enable


class DeliveryAttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    can_delete = False
    fields = ("number", "attempted_at", "url", "status_code", "duration_ms", "error", "response_body")
    readonly_fields = fields


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ("id", "event", "status", "attempts", "last_status_code", "next_attempt_at", "created_at")
    list_filter = ("status", "event")
    search_fields = ("id", "job__id")
    readonly_fields = [f.name for f in Delivery._meta.fields]
    inlines = [DeliveryAttemptInline]
    actions = ["replay"]

    @admin.action(description="Replay: send the stored envelope again, same webhook-id")
    def replay(self, request, queryset):
        for delivery in queryset:
            delivery_replay(delivery=delivery)
        self.message_user(request, f"Replaying {queryset.count()} deliveries.", messages.SUCCESS)


class SigningSecretInline(admin.TabularInline):
    model = SigningSecret
    extra = 0
    fields = ("created_at", "expires_at")
    readonly_fields = fields


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    list_display = ("client", "url", "disabled_at", "disabled_reason")
    list_filter = (("disabled_at", admin.EmptyFieldListFilter),)
    inlines = [SigningSecretInline]
    actions = ["enable"]

    @admin.action(description="Enable: take deliveries again (waiting ones are sent)")
    def enable(self, request, queryset):
        waiting = sum(endpoint_enable(endpoint=endpoint) for endpoint in queryset)
        self.message_user(request, f"Enabled; {waiting} waiting deliveries are due now.", messages.SUCCESS)
