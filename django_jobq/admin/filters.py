"""The admin lists' filters, whose choices come from code and settings, never from the rows.

Django's ``list_filter = ("kind",)`` lists every distinct value of the column: a
``SELECT DISTINCT`` over the whole table on every page load, and one link per value (a
link per dead letter when their reasons all differ). These filters'
choices are bounded by the project instead:

- :class:`QueueFilter`: the queues the settings and the registry name
  (:func:`known_queues`);
- :class:`KindFilter`: the registered kinds and their aliases
  (:func:`django_jobq.registry.claimable_kinds`);
- :class:`StatusFilter`: ready or running (the Jobs list sorts by it, see
  :meth:`django_jobq.admin.JobAdmin.get_ordering`);
- :class:`ReasonFilter`: the dead-letter reasons (:class:`DeadLetter.Reason`), each matching
  its detailed forms too (``failed`` matches ``failed: card declined``).

Each filters by any value its parameter is given (``?kind=another.service.kind``, as the
dashboard links), and lists that value among its choices while it is selected, so a value
the project does not name (another service's kind, a reason's detailed form) can be
filtered by and is shown as selected.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from .. import flow_control, registry
from ..models import DeadLetter, Job


def known_queues() -> list[str]:
    """The queues this project names, sorted (:func:`django_jobq.flow_control.configured_queues`:
    ``JOBQ['DEFAULT_QUEUE']``, ``JOBQ['QUEUES']``, each registered ``@job``'s queue, and the
    ``QUEUES`` of each ``TASKS`` entry on ``JobqBackend``); no database read."""
    return flow_control.configured_queues()


class _NamedChoicesFilter(admin.SimpleListFilter):
    """A filter on one column whose choices are names the project gives (:meth:`names`),
    plus the selected value when the project does not name it."""

    #: The column filtered on.
    field: str

    def names(self) -> Iterable[str]:
        """The values offered, in the order shown."""
        raise NotImplementedError

    def condition(self, value: str) -> Q:
        """The rows that match ``value``."""
        return Q(**{self.field: value})

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = list(self.names())
        selected = self.value()
        if selected is not None and selected not in names:
            names.append(selected)
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset if value is None else queryset.filter(self.condition(value))


class QueueFilter(_NamedChoicesFilter):
    """Jobs or dead letters of one queue; the choices: :func:`known_queues`."""

    title = "queue"
    parameter_name = field = "queue"

    def names(self) -> Iterable[str]:
        return known_queues()


class KindFilter(_NamedChoicesFilter):
    """Jobs or dead letters of one kind; the choices: the kinds registered in this process
    (with their aliases, the names jobs of a renamed kind still carry)."""

    title = "kind"
    parameter_name = field = "kind"

    def names(self) -> Iterable[str]:
        return registry.claimable_kinds()


class StatusFilter(_NamedChoicesFilter):
    """Ready or running jobs."""

    title = "status"
    parameter_name = field = "status"

    def names(self) -> Iterable[str]:
        return Job.Status.values


class ReasonFilter(_NamedChoicesFilter):
    """Dead letters that died for one reason: a :class:`DeadLetter.Reason` matches the
    reason itself and its detailed forms (``"<reason>: <detail>"``); any other value, the
    reasons equal to it or detailing it."""

    title = "reason"
    parameter_name = field = "reason"

    def names(self) -> Iterable[str]:
        return DeadLetter.Reason.values

    def condition(self, value: str) -> Q:
        return Q(reason=value) | Q(reason__startswith=f"{value}:")
