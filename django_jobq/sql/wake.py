"""Waking idle workers: the channel enqueue notifies, and the listener's statements.

``enqueue`` (``INSERT_JOBS``) sends one ``pg_notify`` per queue that got a job; each worker's
listener (:mod:`django_jobq.worker.listener`) runs ``LISTEN`` on a connection of its own and
wakes its worker when a queue it serves is named. Before it listens, the listener checks that
its connection hears notifications at all (``LISTEN_CHECK`` ... ``UNLISTEN_CHECK``): behind a
pooler in transaction mode it does not.
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

#: The channel of the listener's start-up check, not ``WAKE_CHANNEL``: the check wakes no
#: worker. Each check sends a payload of its own, so the checks of workers starting together
#: do not mix.
CHECK_CHANNEL = "jobq_listener_check"

#: The listener subscribes its connection to ``CHECK_CHANNEL``, before ``LISTEN_WAKE``.
LISTEN_CHECK = f'LISTEN "{CHECK_CHANNEL}"'

#: Sent on another connection to the queue database (the way enqueue's notifications travel)
#: once ``LISTEN_CHECK`` has run: the listener's connection must receive it. A
#: connection that does not keeps no session across transactions (a pooler in transaction
#: mode): its ``LISTEN`` ended with the transaction that ran it.
NOTIFY_CHECK = f"SELECT pg_notify('{CHECK_CHANNEL}', %(payload)s)"

#: The listener unsubscribes from ``CHECK_CHANNEL`` once the check is over.
UNLISTEN_CHECK = f'UNLISTEN "{CHECK_CHANNEL}"'
