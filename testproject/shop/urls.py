from django.urls import path

from . import views

app_name = "shop"

urlpatterns = [
    path("signup/", views.signup, name="signup"),
    path("orders/", views.create_order, name="create_order"),
]
