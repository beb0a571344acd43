"""A small shop that uses django-jobq the way a real project does.

Views and a signal enqueue jobs inside the request's transaction (``views.py``,
``signals.py``); the handlers live in ``jobs.py``; ``manage.py demo`` drives it all.
"""
