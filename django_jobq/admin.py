"""Read-only admin screens for jobs and dead letters.

Rows are written only by enqueue and the worker's fenced statements, so the admin never
edits them: editing a running job would bypass its lease. Deleting (Django's own POST,
CSRF-protected, permission-checked action) is allowed: it cancels ready jobs and discards
dead letters.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .models import DeadLetter, Job


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "kind",
        "queue",
        "status",
        "priority",
        "run_at",
        "attempts",
        "max_attempts",
        "lease_deadline",
        "worker_id",
    )
    list_filter = ("status", "queue", "kind")
    search_fields = ("=id", "kind", "idempotency_key", "worker_id")
    ordering = ("-priority", "run_at", "id")
    date_hierarchy = "created_at"


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    list_display = ("id", "job_id", "kind", "queue", "reason", "attempts", "died_at")
    list_filter = ("queue", "kind", "reason")
    search_fields = ("=job_id", "kind", "reason", "last_error", "idempotency_key")
    ordering = ("-died_at",)
    date_hierarchy = "died_at"
