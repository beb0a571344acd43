"""The django-jobq handlers (autodiscovered by django_jobq's app config)."""

import os

from django.db import connection

from django_jobq import job

from . import pickup_trace
from .recorder import record

if os.environ.get("JOBQ_BENCH_TRACE"):  # bench/run.py --trace-pickup: this worker only
    pickup_trace.install()

QUEUE = "bench"

#: The row a "write" handler inserts, like most real jobs do (the harness creates the
#: table in every system's database; a job that runs twice writes its row once).
INSERT_WRITTEN = "INSERT INTO jobq_bench_written (n) VALUES (%s) ON CONFLICT (n) DO NOTHING"


@job(name="bench.noop", queue=QUEUE)
def noop(n: int) -> None:
    """A job that does nothing but record its start."""
    record(n)


@job(name="bench.write", queue=QUEUE)
def write(n: int) -> None:
    """A job that records its start, then writes one row (Django's connection, autocommit:
    a round trip and a durable commit)."""
    record(n)
    with connection.cursor() as cursor:
        cursor.execute(INSERT_WRITTEN, [n])
