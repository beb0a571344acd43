"""The pieces of ``manage.py demo``: reset, workload, worker processes, progress, report.

The command (``shop/management/commands/demo.py``) strings them together.
"""
