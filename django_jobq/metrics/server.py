"""The HTTP server of a worker's metrics (``jobq_worker --metrics-port PORT``): this
process's, or, in multiprocess mode, the sum of every process's files.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.registry import Collector

from .multiprocess import multiprocess_directory, multiprocess_registry


@dataclass(frozen=True)
class MetricsServer:
    """An HTTP server answering every GET (``/metrics`` included) with the metrics, on a
    daemon thread. ``port`` is the bound port (useful after asking for port 0)."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        """Stop serving and release the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def serve(port: int, addr: str = "0.0.0.0", registry: Collector | None = None) -> MetricsServer:  # noqa: S104
    """Serve ``registry`` over HTTP on ``addr:port`` (port 0: any free port).

    The default registry is this process's (prometheus-client's default registry, with the
    process and Python collectors), or, in multiprocess mode, the sum of every process's
    files (:func:`multiprocess_registry`).

    Raises:
        OSError: the port is taken, or the address cannot be bound.
    """
    if registry is None:
        directory = multiprocess_directory()
        registry = REGISTRY if directory is None else multiprocess_registry(directory)
    server, thread = start_http_server(port, addr, registry=registry)
    return MetricsServer(server, thread)


def serve_multiprocess(
    port: int,
    addr: str = "0.0.0.0",  # noqa: S104
    directory: str | os.PathLike[str] | None = None,
) -> MetricsServer:
    """Serve the sum of every process's metrics in ``directory`` (default: the one
    :func:`prepare_multiprocess` set) on ``addr:port``; the supervisor calls this.

    Raises:
        ValueError: no directory given and none prepared.
        OSError: the port is taken, or the address cannot be bound.
    """
    directory = directory or multiprocess_directory()
    if directory is None:
        raise ValueError("no multiprocess directory: call prepare_multiprocess() first")
    return serve(port, addr, multiprocess_registry(directory))
