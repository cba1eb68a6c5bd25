from django.urls import path

from jobs import events, views

urlpatterns = [
    path("jobs", views.JobListCreateView.as_view(), name="jobs"),
    path("jobs/<uuid:job_id>", views.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<uuid:job_id>/cancel", views.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<uuid:job_id>/retry", views.JobRetryView.as_view(), name="job-retry"),
    path("jobs/<uuid:job_id>/output", views.JobOutputView.as_view(), name="job-output"),
    path("jobs/<uuid:job_id>/report", views.JobReportView.as_view(), name="job-report"),
    path("jobs/<uuid:job_id>/events", events.job_events, name="job-events"),
    path("whoami", views.WhoAmIView.as_view(), name="whoami"),
]
