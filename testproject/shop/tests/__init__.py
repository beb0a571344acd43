"""The shop's own tests: how a project tests the jobs its views enqueue (docs/testing.md).

``test_signup`` is written with pytest (``pytest.mark.django_db``), ``test_orders`` with
Django's ``TestCase``, ``test_eager`` in eager mode; each runs a view through the test
client, runs the jobs it enqueued with ``django_jobq.testing`` and asserts their effects.
"""
