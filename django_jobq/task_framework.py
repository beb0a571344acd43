"""Django's Tasks framework, from wherever this Django has it.

Django 6.0+ ships it as ``django.tasks``; on Django 5.2 the ``django-tasks`` backport
(module ``django_tasks``, ``pip install "django-jobq[tasks]"``) provides the same API. The
two spell two exceptions differently (core ``InvalidTask`` / ``InvalidTaskBackend``, backport
``InvalidTaskError`` / ``InvalidTaskBackendError``); this module exports the core names for
whichever is installed. Import it only where the framework is needed: it raises
``ImportError`` (saying what to install) when neither is there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # django-stubs describe the core module; the backport has the same API.
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskException,
        TaskResultDoesNotExist,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
else:
    try:
        from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import TaskError
        from django.tasks.exceptions import (
            InvalidTask,
            InvalidTaskBackend,
            TaskException,
            TaskResultDoesNotExist,
        )
        from django.tasks.signals import task_enqueued, task_finished, task_started
    except ImportError:
        try:
            from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
        except ImportError as exc:
            raise ImportError(
                "django_jobq.tasks_backend needs Django's Tasks framework: Django 6.0 or newer, "
                "or on Django 5.2 the django-tasks backport (pip install 'django-jobq[tasks]', "
                "and add 'django_tasks' to INSTALLED_APPS)."
            ) from exc
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskException, TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started

if TYPE_CHECKING:
    TaskBase = Task[..., Any]
else:
    TaskBase = Task  # Django 6's Task is not subscriptable at run time
"""What a task class subclasses (``Task``, subscripted for the type checker only)."""

__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskBase",
    "TaskContext",
    "TaskError",
    "TaskException",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
