"""URLs of django-jobq: ``metrics`` (the database gauges, see :mod:`django_jobq.views`).

::

    path("jobq/", include("django_jobq.urls")),   # GET /jobq/metrics, URL name "jobq:metrics"
"""

from django.urls import path

from . import views

app_name = "jobq"

urlpatterns = [path("metrics", views.metrics, name="metrics")]
