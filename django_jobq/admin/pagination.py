"""The admin lists' paginator: it counts at most :attr:`CappedCountPaginator.count_cap` rows.

Django's admin counts a list's rows with ``SELECT COUNT(*)`` over everything its filters
match, on every page load: with a million jobs that reads a million rows. The Jobs and Dead
letters lists use :class:`CappedCountPaginator` instead (``ModelAdmin.paginator``), with
``show_full_result_count = False`` (no second count of the unfiltered table)::

    class DeadLetterAdmin(admin.ModelAdmin):
        paginator = CappedCountPaginator
        show_full_result_count = False

The list then says "37 dead letters" when the filters match 37, and "more than 10,000 dead
letters" when they match more: its pages stop at the 10,000th row (page 100 at 100 rows a
page); the filters and the search narrow it down. The app's ``pagination.html``,
``search_form.html`` and ``actions.html`` admin templates show that wording.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

if TYPE_CHECKING:  # Paginator is generic only in django-stubs
    PaginatorBase = Paginator[Any]
else:
    PaginatorBase = Paginator


class CappedCountPaginator(PaginatorBase):
    """A paginator of a queryset that counts at most :attr:`count_cap` rows.

    The count is one bounded statement, filtered or not: ``SELECT COUNT(*) FROM (SELECT id
    FROM ... WHERE <the list's filters> LIMIT count_cap + 1)``, without the list's ordering
    (so no sort); it stops reading at the ``count_cap + 1``-th matching row. When it finds
    that many, :attr:`capped` is true and :attr:`count` is ``count_cap``: the pages end there.

    Arguments are :class:`django.core.paginator.Paginator`'s; ``object_list`` must be a
    queryset.
    """

    #: The most rows counted (and paged through); subclass to change it.
    count_cap = 10_000

    @cached_property
    def _counted(self) -> int:
        """The matching rows, counted up to ``count_cap + 1`` (one statement)."""
        queryset: QuerySet[Any] = self.object_list  # type: ignore[assignment]
        return queryset.order_by().values("pk")[: self.count_cap + 1].count()

    @cached_property
    def count(self) -> int:
        """The number of rows, at most :attr:`count_cap` (more: see :attr:`capped`)."""
        return min(self._counted, self.count_cap)

    @cached_property
    def capped(self) -> bool:
        """Whether more than :attr:`count_cap` rows match (then :attr:`count` is the cap)."""
        return self._counted > self.count_cap

    @cached_property
    def count_label(self) -> str:
        """The count as the admin shows it: ``"37"``, or ``"more than 10,000"``."""
        return f"more than {self.count_cap:,}" if self.capped else f"{self.count:,}"
