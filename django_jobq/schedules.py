"""Recurring jobs as declared: :class:`Schedule`, for ``@job(schedule=...)``.

Declare schedules on a job, or in settings::

    from django_jobq import Schedule, job


    @job(schedule="*/5 * * * *")  # every 5 minutes (UTC)
    def refresh_rates() -> None: ...


    @job(
        schedule=[
            Schedule("30 2 * * *", name="report-eu", payload={"region": "eu"}),
            Schedule("0 6 * * 1-5", name="report-us", payload={"region": "us"},
                     timezone="America/New_York"),
        ],
        timezone="Europe/Paris",  # for the schedules that name none
    )
    def nightly_report(region: str) -> None: ...


    JOBQ = {"SCHEDULES": {"cleanup": {"kind": "shop.jobs.cleanup", "cron": "0 4 * * *"}}}

A declaration is only checked for its types here; its cron expression and timezone are
checked by ``manage.py check`` (:func:`django_jobq.scheduling.declared`), which binds each
schedule to its kind. When a cron expression ticks is :mod:`django_jobq.timetables`; how
every worker's scheduler enqueues each tick once is :mod:`django_jobq.scheduling`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .conf import KIND_NAME_RE, MAX_CATCH_UP
from .validation import encode_payload


@dataclass(frozen=True)
class Schedule:
    """A recurring run of a job, for ``@job(schedule=Schedule(...))``.

    Args:
        cron: 5 fields (minute hour day-of-month month day-of-week), optionally a 6th for
            seconds, or an alias such as ``@daily``; checked by ``manage.py check``
            (``django_jobq.E007``).
        timezone: IANA name the cron fields are read in; default the ``@job``'s
            ``timezone``, then ``"UTC"`` (``django_jobq.E008`` if unknown).
        payload: the handler's keyword arguments for every tick's job (JSON values).
        name: unique among all schedules; default the job's kind. Give each of several
            schedules of one job a name.
        catch_up: after workers were down, at most this many missed ticks are enqueued,
            the most recent ones (1 to 1000; default 1: the latest missed tick only).

    Raises:
        TypeError: a value of the wrong type, or a payload JSON cannot hold.
        ValueError: an invalid name or ``catch_up``.
    """

    cron: str
    timezone: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    catch_up: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.cron, str):
            raise TypeError(f"cron must be a str, not {self.cron!r}.")
        if self.timezone is not None and not isinstance(self.timezone, str):
            raise TypeError(f"timezone must be a str, not {self.timezone!r}.")
        if self.name is not None and (
            not isinstance(self.name, str) or not KIND_NAME_RE.match(self.name)
        ):
            raise ValueError(
                f"invalid schedule name {self.name!r}: expected {KIND_NAME_RE.pattern}."
            )
        catch_up = self.catch_up
        if not isinstance(catch_up, int) or isinstance(catch_up, bool):
            raise TypeError(f"catch_up must be an int, not {catch_up!r}.")
        if not 1 <= catch_up <= MAX_CATCH_UP:
            raise ValueError(f"catch_up must be 1 to {MAX_CATCH_UP}, not {catch_up}.")
        encode_payload(self.payload)


def from_job_options(schedule: object, timezone: object) -> tuple[Schedule, ...]:
    """The schedules that ``@job(schedule=..., timezone=...)`` declares.

    ``schedule`` is a cron string, a :class:`Schedule`, or a list or tuple of them;
    ``timezone`` fills in the schedules that name none.

    Raises:
        TypeError: ``schedule`` or ``timezone`` has the wrong type, or ``timezone`` is given
            without ``schedule``.
    """
    if timezone is not None and not isinstance(timezone, str):
        raise TypeError(f"timezone must be an IANA timezone name (str), not {timezone!r}.")
    if schedule is None:
        if timezone is not None:
            raise TypeError("timezone is the timezone of schedule=; give a schedule too.")
        return ()
    items = list(schedule) if isinstance(schedule, list | tuple) else [schedule]
    schedules = []
    for item in items:
        if isinstance(item, str):
            item = Schedule(item)
        if not isinstance(item, Schedule):
            raise TypeError(
                f"schedule must be a cron str, a Schedule, or a list of them; not {item!r}."
            )
        if item.timezone is None and timezone is not None:
            item = dataclasses.replace(item, timezone=timezone)
        schedules.append(item)
    return tuple(schedules)
