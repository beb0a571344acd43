"""A local stand-in for a partner's webhook endpoint, flaky on purpose.

It records every POST, answers a seeded random fraction of them with 503 (as a partner
having a bad moment does), and dedups accepted deliveries by their ``Idempotency-Key``
header, as a well-behaved receiver would. Use it as a context manager::

    with WebhookStub(failure_rate=0.1, seed=1) as stub:
        settings.SHOP_WEBHOOK_URL = stub.url
        ...
        stub.stats().duplicates

or with :meth:`WebhookStub.start` / :meth:`WebhookStub.stop`. It listens on 127.0.0.1, on a
free port unless one is given.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

#: The path the stub serves; any other path gets 404.
PATH = "/hook"


@dataclass(frozen=True)
class Delivery:
    """One POST the stub received: its idempotency key, raw body and the status served."""

    key: str
    body: bytes
    status: int


@dataclass(frozen=True)
class WebhookStats:
    """What the stub has seen so far.

    ``received``: every POST to the hook path. ``failures_served``: POSTs answered 503 on
    purpose. ``accepted``: POSTs answered 200. ``unique_keys``: distinct idempotency keys
    among the accepted ones (the events processed). ``duplicates``: accepted POSTs whose key
    had already been accepted (a redelivery the receiver dedupped). ``rejected``: POSTs
    answered 400 (no key).
    """

    received: int
    failures_served: int
    accepted: int
    unique_keys: int
    duplicates: int
    rejected: int


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    stub: WebhookStub


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if self.path != PATH:
            self._answer(404)
            return
        key = self.headers.get("Idempotency-Key") or ""
        self._answer(self.server.stub._record(key, body))

    def _answer(self, status: int) -> None:
        payload = b'{"ok": true}' if status == 200 else b'{"ok": false}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the stats tell the story


class WebhookStub:
    """A threaded HTTP receiver on 127.0.0.1 that records POSTs and fails some with 503.

    Args:
        failure_rate: the fraction of POSTs answered 503, decided by a random generator
            seeded with ``seed`` (0 never fails, 1 always fails).
        seed: the seed for that generator.
        port: the port to listen on; 0 picks a free one.
    """

    def __init__(self, *, failure_rate: float = 0.1, seed: int = 1, port: int = 0) -> None:
        if not 0 <= failure_rate <= 1:
            raise ValueError(f"failure_rate must be between 0 and 1, not {failure_rate!r}")
        self.failure_rate = failure_rate
        self.port = port
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._deliveries: list[Delivery] = []
        self._accepted_keys: set[str] = set()
        self._duplicates = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The hook's URL (only once started: the port may be chosen at start)."""
        if self._server is None:
            raise RuntimeError("the webhook stub is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{PATH}"

    def start(self) -> WebhookStub:
        if self._server is not None:
            raise RuntimeError("the webhook stub is already running")
        self._server = _Server(("127.0.0.1", self.port), _Handler)
        self._server.stub = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="webhook-stub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = self._thread = None

    def __enter__(self) -> WebhookStub:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _record(self, key: str, body: bytes) -> int:
        """Decide the answer to one POST and record it; return the HTTP status."""
        with self._lock:
            if not key:
                status = 400
            elif self._random.random() < self.failure_rate:
                status = 503
            else:
                status = 200
                if key in self._accepted_keys:
                    self._duplicates += 1  # dedupped: acknowledged, not processed again
                self._accepted_keys.add(key)
            self._deliveries.append(Delivery(key, body, status))
        return status

    def deliveries(self) -> list[Delivery]:
        """Every POST received so far, in arrival order."""
        with self._lock:
            return list(self._deliveries)

    def stats(self) -> WebhookStats:
        with self._lock:
            statuses = [delivery.status for delivery in self._deliveries]
            return WebhookStats(
                received=len(statuses),
                failures_served=statuses.count(503),
                accepted=statuses.count(200),
                unique_keys=len(self._accepted_keys),
                duplicates=self._duplicates,
                rejected=statuses.count(400),
            )
