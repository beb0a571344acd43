"""Prometheus metrics: what each process does, and gauges read from the queue database.

Two kinds, served in two places (docs/operations.md has every name, label and alert):

- **Process metrics** (:mod:`.instruments`), recorded by the process that does the work:
  jobs enqueued (by any process that enqueues and has prometheus-client loaded, counted at
  commit), claimed, succeeded, retried, dead-lettered, leases reclaimed, refused fenced
  writes, heartbeats, job durations, pickup latency and handler threads.
  ``jobq_worker --metrics-port PORT`` serves a worker's (:func:`.server.serve`). They live
  in prometheus-client's default registry, so a web process's enqueue counts appear
  wherever that registry is already exposed.
- **Database gauges** (:class:`.collector.DatabaseCollector`): queue depth by state, the
  oldest ready age, dead letters by queue and kind, live and stale workers, and the MVCC
  health of the queue database (the xmin horizon's age, the jobq tables' live and dead rows,
  whether autovacuum may clean them, their indexes' sizes: :mod:`django_jobq.mvcc`). They
  describe the whole queue, whichever process reads them, so one place serves them: the
  view in :mod:`django_jobq.urls`. Reads are cached ``JOBQ['METRICS_CACHE_TIMEOUT']`` seconds.

Several processes on one host (``jobq_worker --processes N``) use prometheus-client's
multiprocess mode (:mod:`.multiprocess`): each process writes its values to files in one
directory, and the supervisor serves their sum. The supervisor calls, in this order::

    from django_jobq.metrics.multiprocess import mark_process_dead, prepare_multiprocess
    from django_jobq.metrics.server import serve_multiprocess

    directory = prepare_multiprocess(path)      # before starting any child
    server = serve_multiprocess(port, addr)     # serves the children's sum
    ...
    mark_process_dead(child_pid)                # each time a child has exited
    server.close()                              # at exit

Counters of a child that died stay in the sum (a restart never makes a counter go back);
its live gauges (``jobq_worker_threads``) leave with it.

The modules, lowest first: :mod:`.buckets` (the histogram bounds, shared with the
per-minute rollups; no prometheus-client), :mod:`.instruments` (the process metrics and the
calls that record them; the worker imports it, enqueue only where prometheus-client is
already loaded, and it imports no database read),
:mod:`.multiprocess`, :mod:`.server`, :mod:`.collector` (reads :mod:`django_jobq.stats` and
:mod:`django_jobq.mvcc`).
"""
