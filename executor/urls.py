from django.urls import path

from executor import views

urlpatterns = [
    path("callbacks/<slug:provider>", views.provider_callback, name="provider-callback"),
]
