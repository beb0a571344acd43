"""A TCP proxy between a worker and the test PostgreSQL, to make its connections misbehave.

``Proxy(host, port)`` listens on 127.0.0.1 (an ephemeral port, :attr:`Proxy.port`) and
forwards every connection to ``host:port``, on two threads per connection. It can:

- :meth:`Proxy.freeze`: stop forwarding, both ways, on the connections whose client sent
  ``match`` (e.g. ``b"jobq worker w1"``: the ``application_name`` in PostgreSQL's startup
  packet, plain text without SSL), or on all of them; new connections too. The sockets stay
  open and the kernel still acknowledges what is sent: a silent network partition, which
  neither TCP keepalives nor ``tcp_user_timeout`` see.
- :meth:`Proxy.refuse`: close every connection, and close new ones at once (the client's
  connection attempt fails); :attr:`Proxy.refused` counts those.
- :meth:`Proxy.resume`: forward again (what was held back is delivered).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field

#: Bytes of what the client sends first kept for :meth:`Proxy.freeze` to match.
_HEAD = 4096


@dataclass(eq=False)
class _Pair:
    client: socket.socket
    server: socket.socket
    head: bytes = b""
    threads: list[threading.Thread] = field(default_factory=list)


class Proxy:
    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._pairs: list[_Pair] = []
        self._state = threading.Condition()
        self._frozen: bytes | None = None  # b"": every connection
        self._refusing = False
        self._closed = False
        self.refused = 0
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def url(self, database_url: str, host_port: str) -> str:
        """``database_url`` with its ``host_port`` replaced by this proxy's address."""
        return database_url.replace(host_port, f"127.0.0.1:{self.port}", 1)

    def freeze(self, match: bytes = b"") -> None:
        with self._state:
            self._frozen = match

    def refuse(self) -> None:
        with self._state:
            self._refusing = True
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            self._close(pair)

    def resume(self) -> None:
        with self._state:
            self._frozen = None
            self._refusing = False
            self._state.notify_all()

    def close(self) -> None:
        with self._state:
            self._closed = True
            self._frozen = None
            self._state.notify_all()
        self.refuse()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._state:
                refusing = self._refusing or self._closed
                if refusing:
                    self.refused += 1
            if refusing:
                client.close()
                continue
            try:
                server = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, server)
            with self._state:
                self._pairs.append(pair)
            for source, target in ((client, server), (server, client)):
                thread = threading.Thread(
                    target=self._pump, args=(pair, source, target), daemon=True
                )
                pair.threads.append(thread)
                thread.start()

    def _is_frozen(self, pair: _Pair) -> bool:
        return self._frozen is not None and not self._closed and self._frozen in pair.head

    def _pump(self, pair: _Pair, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                with self._state:
                    if source is pair.client and len(pair.head) < _HEAD:
                        pair.head += data[:_HEAD]
                    self._state.wait_for(lambda: not self._is_frozen(pair))
                target.sendall(data)
        except OSError:
            pass
        self._close(pair)

    @staticmethod
    def _close(pair: _Pair) -> None:
        for sock in (pair.client, pair.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
