from django.apps import AppConfig


class ChaosAppConfig(AppConfig):
    """The chaos app: adds ``manage.py jobq_chaos`` and, in a process started with
    ``JOBQ_TEST_CRASH_AT``, arms the crash points (docs/chaos.md). It has no models.

    Raises (from ``ready()``, so from ``django.setup()``):
        django.core.exceptions.ImproperlyConfigured: ``JOBQ_TEST_CRASH_AT`` is set but is not
            ``POINT:COUNT`` with a known crash point and a count >= 1.
    """

    name = "django_jobq.contrib.chaos"
    label = "jobq_chaos"
    verbose_name = "Job queue chaos suite"

    def ready(self) -> None:
        from .crashes import arm_from_environment

        arm_from_environment()
