"""The django-jobq handler (autodiscovered by django_jobq's app config)."""

from django_jobq import job

from .recorder import record

QUEUE = "bench"


@job(name="bench.noop", queue=QUEUE)
def noop(n: int) -> None:
    """A job that does nothing but record its start."""
    record(n)
