"""The code the benchmark runs inside workers and producers (see bench/README.md).

``settings`` configures Django for django-jobq and django-tasks-db workers; ``jobs``,
``tasks`` and ``procrastinate_app`` define the same no-op handler for each system;
``recorder`` timestamps each handler start; ``produce`` enqueues the jobs.
"""
