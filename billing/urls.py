from django.urls import path

from billing import views

urlpatterns = [
    path("spend", views.SpendView.as_view(), name="spend"),
]
