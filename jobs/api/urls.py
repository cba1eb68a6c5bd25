from django.urls import path

from jobs.api import events, report_templates, views
from jobs.api.schema import DocsView, SchemaView

urlpatterns = [
    path("v1/jobs", views.JobListCreateView.as_view(), name="jobs"),
    path("v1/jobs/<uuid:job_id>", views.JobDetailView.as_view(), name="job-detail"),
    path("v1/jobs/<uuid:job_id>/cancel", views.JobCancelView.as_view(), name="job-cancel"),
    path("v1/jobs/<uuid:job_id>/retry", views.JobRetryView.as_view(), name="job-retry"),
    path("v1/jobs/<uuid:job_id>/output", views.JobOutputView.as_view(), name="job-output"),
    path("v1/jobs/<uuid:job_id>/report", views.JobReportView.as_view(), name="job-report"),
    path("v1/jobs/<uuid:job_id>/events", events.job_events, name="job-events"),
    path("v1/report-templates", report_templates.ReportTemplateListCreateView.as_view(), name="report-templates"),
    path("v1/report-templates/<str:name>/versions/<int:number>", report_templates.ReportTemplateVersionView.as_view(),
         name="report-template-version"),
    path("v1/report-templates/<str:name>/live", report_templates.ReportTemplateLiveView.as_view(),
         name="report-template-live"),
    path("v1/whoami", views.WhoAmIView.as_view(), name="whoami"),
    path("v1/spend", views.SpendView.as_view(), name="spend"),
    path("v1/callbacks/<slug:provider>", views.provider_callback, name="provider-callback"),
    path("v1/schema", SchemaView.as_view(), name="schema"),
    path("v1/docs", DocsView.as_view(url_name="schema"), name="docs"),
    path("r/<str:token>", views.report_page, name="report-page"),
]
