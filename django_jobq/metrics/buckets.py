"""The histogram bucket bounds that the metrics and the per-minute rollups share.

Plain constants, apart from :mod:`.instruments` so that the rollups (``django_jobq.stats``,
read by the admin in web processes) need no prometheus-client.
"""

#: Upper bounds (seconds) of the job duration and pickup latency buckets, from 5 ms to an
#: hour: handlers range from a cache write to a report, and an idle worker claims within
#: milliseconds of a wake-up while a backlog makes jobs wait minutes. The per-minute
#: rollups use the same bounds (``OutcomeRollup.duration_buckets`` has one more count, for
#: values above the last bound).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)  # fmt: skip
