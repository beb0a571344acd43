from django.apps import AppConfig
from django.core import checks
from django.utils.module_loading import autodiscover_modules


class JobqConfig(AppConfig):
    """Registers the system checks and imports every installed app's ``jobs`` module,
    so ``@job`` handlers are registered in web processes and workers alike."""

    name = "django_jobq"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .checks import (
            check_crash_points,
            check_definitions,
            check_metrics,
            check_mvcc_health,
            check_schedules,
            check_settings,
            check_tasks_backends,
        )

        checks.register(check_settings)
        checks.register(check_metrics)
        checks.register(check_crash_points)
        checks.register(check_schedules)
        checks.register(check_tasks_backends)
        checks.register(check_definitions)
        checks.register(check_mvcc_health, checks.Tags.database)
        autodiscover_modules("jobs")
