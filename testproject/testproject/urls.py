from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("jobq/", include("django_jobq.urls")),  # GET /jobq/metrics: the queue's gauges
    path("", include("shop.urls")),
]
