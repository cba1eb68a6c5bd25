from django.urls import path

from orders import views

urlpatterns = [
    path("v1/orders", views.OrderListCreateView.as_view(), name="orders"),
    path("v1/orders/<uuid:order_id>", views.OrderDetailView.as_view(), name="order-detail"),
]
