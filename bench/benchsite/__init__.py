"""The code the benchmark runs inside workers and producers (see bench/README.md).

``settings`` configures Django for django-jobq and django-tasks-db workers; ``jobs``,
``tasks`` and ``procrastinate_app`` define the same no-op handler for each system (and
``jobs`` and ``procrastinate_app`` one that writes a row); ``recorder`` timestamps each
handler start; ``pickup_trace`` times the steps of django-jobq's pickup (``--trace-pickup``);
``produce`` enqueues the jobs.
"""
