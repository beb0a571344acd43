"""The test project's URLconf plus the async views of ``tests/testapp/views_async.py``
(``override_settings(ROOT_URLCONF="tests.testapp.urls_async")``)."""

from django.urls import path

from testproject.urls import urlpatterns as project_urlpatterns

from . import views_async

urlpatterns = [
    path("async/record/", views_async.record_job),
    path("async/record-then-fail/", views_async.record_then_fail),
    path("async/record-non-atomic/", views_async.record_non_atomic),
    path("async/effect-and-job/", views_async.effect_and_job),
    *project_urlpatterns,
]
