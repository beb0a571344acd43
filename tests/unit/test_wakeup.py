"""The main loop's wake-up (django_jobq.worker.wakeup): an event waited on beside a socket."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from django_jobq.worker.wakeup import Wakeup

#: Seconds a wait that nothing should end is given: long enough that a wake-up that does
#: come is not mistaken for it, short enough to keep the test fast.
BRIEF = 0.05


def test_a_wait_returns_at_once_once_set_and_times_out_once_cleared():
    wakeup = Wakeup()
    wakeup.set()
    assert wakeup.is_set()
    assert wakeup.wait(None) == (True, False)  # None: however long, but it is set
    wakeup.clear()
    assert not wakeup.is_set()
    assert wakeup.wait(BRIEF) == (False, False)


def test_a_timeout_already_passed_only_looks():
    """A negative timeout (a deadline computed a moment too late) waits for nothing, as
    ``threading.Event.wait`` does; ``poll()`` itself would wait forever."""
    wakeup = Wakeup()
    results: list[tuple[bool, bool]] = []
    waiter = threading.Thread(target=lambda: results.append(wakeup.wait(-0.001)))
    waiter.start()
    waiter.join(timeout=10)
    assert results == [(False, False)]


def test_many_sets_are_cleared_by_one_clear():
    wakeup = Wakeup()
    for _ in range(10_000):  # more than a pipe holds, had each set written a byte
        wakeup.set()
    wakeup.clear()
    assert wakeup.wait(BRIEF) == (False, False)


def test_a_set_from_another_thread_ends_a_wait_without_a_timeout():
    wakeup = Wakeup()
    results: list[tuple[bool, bool]] = []
    waiter = threading.Thread(target=lambda: results.append(wakeup.wait(None)))
    waiter.start()
    wakeup.set()
    waiter.join(timeout=10)
    assert results == [(True, False)]


def test_a_readable_socket_ends_the_wait_and_is_named():
    wakeup = Wakeup()
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert wakeup.wait(BRIEF, also=ours.fileno()) == (False, False)
        theirs.send(b"x")
        assert wakeup.wait(None, also=ours.fileno()) == (False, True)
        wakeup.set()
        assert wakeup.wait(None, also=ours.fileno()) == (True, True)


def test_its_pipe_is_closed_when_it_is_collected():
    wakeup = Wakeup()
    read_end = wakeup._read
    os.fstat(read_end)  # open
    del wakeup  # the last reference: collected at once
    with pytest.raises(OSError):
        os.fstat(read_end)
