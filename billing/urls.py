from django.urls import path

from billing import views

urlpatterns = [
    path("spend", views.SpendView.as_view(), name="spend"),
    path("orders", views.OrderListCreateView.as_view(), name="orders"),
    path("orders/<uuid:order_id>", views.OrderDetailView.as_view(), name="order-detail"),
]
