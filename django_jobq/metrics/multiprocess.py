"""prometheus-client's multiprocess mode, for ``jobq_worker --processes N``: each process
writes its values to files in one directory, and the supervisor serves their sum
(:func:`django_jobq.metrics.server.serve_multiprocess`).

The supervisor calls :func:`prepare_multiprocess` before starting any child, and
:func:`mark_process_dead` after reaping each one. Counters of a child that died stay in the
sum (a restart never makes a counter go back); its live gauges (``jobq_worker_threads``)
leave with it.
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry, values
from prometheus_client import multiprocess as prometheus_multiprocess

from .instruments import PROCESS_METRICS


def multiprocess_directory() -> str | None:
    """The multiprocess directory this process records to, or ``None`` outside that mode."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def multiprocess_registry(directory: str | os.PathLike[str]) -> CollectorRegistry:
    """A registry summing the metric files every process wrote to ``directory``: counters
    and histograms summed over all processes, dead ones included; ``jobq_worker_threads``
    summed over the live ones."""
    registry = CollectorRegistry()
    prometheus_multiprocess.MultiProcessCollector(registry, path=os.fspath(directory))  # type: ignore[no-untyped-call]
    return registry


def prepare_multiprocess(directory: str | os.PathLike[str]) -> Path:
    """Put this process and the children it starts next into multiprocess mode.

    The supervisor calls this once, before starting (forking or spawning) any child:

    1. creates ``directory`` if needed and deletes the ``*.db`` files a previous run left
       (their counts would otherwise be added to this run's): give it a directory of its
       own, not one another program's processes write to;
    2. sets ``PROMETHEUS_MULTIPROC_DIR`` in ``os.environ``, which spawned children inherit:
       prometheus-client reads it when it is imported;
    3. for forked children, which inherit this process's already-imported prometheus-client,
       switches it to multiprocess values (``prometheus_client.values.ValueClass``, the
       variable the library sets from that environment variable at import) and drops the
       label sets of :data:`PROCESS_METRICS` recorded so far, so every value a child records
       goes to its own file (named after its pid).

    Returns:
        The directory, as a :class:`~pathlib.Path`.

    Raises:
        OSError: the directory cannot be created or cleaned.
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()
    if not getattr(values.ValueClass, "_multiprocess", False):
        for metric in PROCESS_METRICS:
            metric.clear()
        values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
    return path


def mark_process_dead(pid: int, directory: str | os.PathLike[str] | None = None) -> None:
    """Tell the multiprocess files that the child ``pid`` has exited (the supervisor calls
    this after reaping it, before or after starting its replacement): its live gauges stop
    counting; its counters and histograms stay in the sum."""
    path = directory or multiprocess_directory()
    prometheus_multiprocess.mark_process_dead(pid, None if path is None else os.fspath(path))  # type: ignore[no-untyped-call]
