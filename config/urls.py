from django.contrib import admin
from django.urls import include, path

from config.metrics import metrics_view
from jobs import views as job_views
from jobs.schema import DocsView, SchemaView

urlpatterns = [
    path("v1/", include("jobs.urls")),
    path("v1/", include("billing.urls")),
    path("v1/", include("executor.urls")),
    path("v1/schema", SchemaView.as_view(), name="schema"),
    path("v1/docs", DocsView.as_view(url_name="schema"), name="docs"),
    path("admin/", admin.site.urls),
    path("r/<str:token>", job_views.report_page, name="report-page"),
    path("metrics", metrics_view, name="metrics"),
]

# Errors outside DRF views (unknown paths, crashes) are JSON too, never an HTML page.
handler400 = "jobs.errors.json_bad_request"
handler403 = "jobs.errors.json_permission_denied"
handler404 = "jobs.errors.json_not_found"
handler500 = "jobs.errors.json_server_error"
