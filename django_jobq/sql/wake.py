"""Waking idle workers: the channel enqueue notifies, and the listener's statements.

``enqueue`` (``INSERT_JOBS``) sends one ``pg_notify`` per queue that got a job; each worker's
listener (:mod:`django_jobq.worker.listener`) runs ``LISTEN`` on a connection of its own and
wakes its worker when a queue it serves is named.
"""

from __future__ import annotations

#: The channel ``INSERT_JOBS`` notifies: one channel (not one per queue), so a worker that
#: serves every queue can listen without knowing their names; the payload is the queue.
WAKE_CHANNEL = "jobq"

#: Subscribe the worker's listener connection to ``WAKE_CHANNEL`` (LISTEN takes no
#: parameters; the channel is the constant above).
LISTEN_WAKE = f'LISTEN "{WAKE_CHANNEL}"'

#: A round trip that does nothing: surfaces a connection the server has closed.
PING = "SELECT 1"
