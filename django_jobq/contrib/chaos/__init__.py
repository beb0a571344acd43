"""The chaos app (``"django_jobq.contrib.chaos"`` in ``INSTALLED_APPS``, opt-in): kill workers
at every crash point under load, and prove that no job is lost and no transactional effect is
duplicated. See docs/chaos.md and docs/guarantees.md.

- ``apps.py``: the app; its ``ready()`` arms the crash points when ``JOBQ_TEST_CRASH_AT`` is set.
- ``crashes.py``: reading ``JOBQ_TEST_CRASH_AT``, and the SIGKILL at the armed crash point.
- ``plan.py``: the seeded plan (which crash point kills which worker; outside faults).
- ``handlers.py``: the two chaos kinds, a transactional and an "external" effect.
- ``worker.py``: the worker processes' entry point (``jobq_worker`` plus the chaos kinds).
- ``supervisor.py``: keeps the workers running, arms their crashes, strikes from outside.
- ``verdict.py``: checks the outcome and writes the report.
- ``run.py``: one run, from the refusal checks to the clean-up.
- ``sql.py``: the suite's own statements (its business table, the connections it strikes).
- ``management/commands/jobq_chaos.py``: ``manage.py jobq_chaos``.

Nothing in the rest of ``django_jobq`` imports this package (the worker's crash points are
checks of :data:`django_jobq.crash_points.reach`); importing it imports nothing else, so
``python -m django_jobq.contrib.chaos.worker`` can set things up first.
"""
