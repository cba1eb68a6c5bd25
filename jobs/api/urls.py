from django.urls import path, register_converter

from jobs.api import events, report_templates, views
from jobs.api.schema import DocsView, SchemaView


class TemplateNameConverter:
    """A report template's name as the API writes it (jobs.api.report_templates.NAME): anything else (a NUL, a
    slash, upper case) is no such path, 404, never a lookup PostgreSQL would refuse."""

    regex = report_templates.NAME_PATTERN

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(TemplateNameConverter, "template_name")

urlpatterns = [
    path("v1/jobs", views.JobListCreateView.as_view(), name="jobs"),
    path("v1/jobs/<uuid:job_id>", views.JobDetailView.as_view(), name="job-detail"),
    path("v1/jobs/<uuid:job_id>/cancel", views.JobCancelView.as_view(), name="job-cancel"),
    path("v1/jobs/<uuid:job_id>/retry", views.JobRetryView.as_view(), name="job-retry"),
    path("v1/jobs/<uuid:job_id>/output", views.JobOutputView.as_view(), name="job-output"),
    path("v1/jobs/<uuid:job_id>/report", views.JobReportView.as_view(), name="job-report"),
    path("v1/jobs/<uuid:job_id>/events", events.job_events, name="job-events"),
    path("v1/report-templates", report_templates.ReportTemplateListCreateView.as_view(), name="report-templates"),
    path("v1/report-templates/<template_name:name>/versions/<int:number>", report_templates.ReportTemplateVersionView.as_view(),
         name="report-template-version"),
    path("v1/report-templates/<template_name:name>/live", report_templates.ReportTemplateLiveView.as_view(),
         name="report-template-live"),
    path("v1/whoami", views.WhoAmIView.as_view(), name="whoami"),
    path("v1/spend", views.SpendView.as_view(), name="spend"),
    path("v1/callbacks/<slug:provider>", views.provider_callback, name="provider-callback"),
    path("v1/schema", SchemaView.as_view(), name="schema"),
    path("v1/docs", DocsView.as_view(url_name="schema"), name="docs"),
    path("r/<str:token>", views.report_page, name="report-page"),
]
