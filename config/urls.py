"""The URL map: every app's own urls, named by string (config imports no app)."""

from django.urls import include, path

urlpatterns = [
    path("", include("jobs.api.urls")),  # the API (/v1/jobs, /v1/spend, /v1/callbacks, /v1/schema) and /r/ pages
    path("", include("orders.urls")),  # /v1/orders
    path("", include("operators.urls")),  # /admin/ and /metrics
]

# Errors outside DRF views (unknown paths, crashes) are JSON too, never an HTML page.
handler400 = "jobs.api.errors.json_bad_request"
handler403 = "jobs.api.errors.json_permission_denied"
handler404 = "jobs.api.errors.json_not_found"
handler500 = "jobs.api.errors.json_server_error"
