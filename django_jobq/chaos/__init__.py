"""The chaos suite: kill workers at every crash point under load, and prove that no job is
lost and no transactional effect is duplicated. See docs/guarantees.md.

- ``plan.py``: the seeded plan (which crash point kills which worker; outside faults).
- ``handlers.py``: the two chaos kinds, a transactional and an "external" effect.
- ``worker.py``: the worker processes' entry point (``jobq_worker`` plus the chaos kinds).
- ``supervisor.py``: keeps the workers running, arms their crashes, strikes from outside.
- ``verdict.py``: checks the outcome and writes the report.
- ``run.py``: one run, from the refusal checks to the clean-up (``manage.py jobq_chaos``).
- ``sql.py``: the suite's own statements (its business table, the connections it strikes).

Nothing here is imported by the worker or by ``django_jobq`` itself; importing this package
imports nothing else, so ``python -m django_jobq.chaos.worker`` can set things up first.
"""
