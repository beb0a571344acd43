"""Opt-in Django apps that ship with django-jobq but are not part of its core: nothing in
``django_jobq`` imports them, and each takes effect only where its app is in
``INSTALLED_APPS``.

- ``chaos``: the chaos suite, ``manage.py jobq_chaos`` (docs/chaos.md).
"""
