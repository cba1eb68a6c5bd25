from django.urls import path

from jobs import views

urlpatterns = [
    path("jobs", views.JobListCreateView.as_view(), name="jobs"),
    path("jobs/<uuid:job_id>", views.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<uuid:job_id>/cancel", views.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<uuid:job_id>/retry", views.JobRetryView.as_view(), name="job-retry"),
    path("jobs/<uuid:job_id>/output", views.JobOutputView.as_view(), name="job-output"),
    path("whoami", views.WhoAmIView.as_view(), name="whoami"),
]
