"""A PgBouncer process of a test's own, in front of the test PostgreSQL server.

tests/test_pgbouncer.py runs enqueue and workers through it. It is Debian's ``pgbouncer``
(``scripts/test`` installs the package when it runs as root and the binary is missing), started
in the foreground on a free port with a configuration of its own; its system service, if any,
is never used. PgBouncer refuses to run as root, so as root it runs as the ``postgres`` OS user,
in a directory that user owns outside pytest's temporary base (root's, mode 0700), as
tests/cluster.py does for PostgreSQL.

The configuration is what docs/pgbouncer.md recommends (``pool_mode = transaction``, and
``ignore_startup_parameters = options`` unless a test asks for PgBouncer's default), plus
``server_round_robin = 1``: a client's consecutive transactions then take the server
connections in turn instead of the most recently used one, as they do on a busy pool, so a
client that relies on session state (a prepared statement, a ``LISTEN``) fails in the test
as it would in production. :meth:`PgBouncer.warm` opens the server connections to take turns
on.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

#: Seconds PgBouncer may take to accept connections after it was started.
START_TIMEOUT = 20.0


def binary() -> str | None:
    """The ``pgbouncer`` executable: on ``PATH``, else Debian's ``/usr/sbin/pgbouncer``
    (``/usr/sbin`` is not on every user's ``PATH``); ``None`` if there is none."""
    found = shutil.which("pgbouncer")
    if found is None and os.access("/usr/sbin/pgbouncer", os.X_OK):
        found = "/usr/sbin/pgbouncer"
    return found


def unavailable_reason() -> str | None:
    """Why no PgBouncer can be started here, or ``None`` if one can."""
    if binary() is None:
        return (
            "pgbouncer is not installed (scripts/test installs Debian's pgbouncer package when "
            "it runs as root; elsewhere: apt-get install pgbouncer)"
        )
    if os.geteuid() == 0 and _postgres_user() is None:
        return "running as root, but there is no 'postgres' OS user to run pgbouncer as"
    return None


def _postgres_user() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _quoted(value: str) -> str:
    """``value`` as a double-quoted string of PgBouncer's auth file."""
    return '"' + value.replace('"', '""') + '"'


class PgBouncer:
    """PgBouncer in front of the PostgreSQL server at ``host``:``port``, every database of it
    (``* =``), with ``auth_type = trust`` for the one ``user`` (whose ``password``, if any,
    it uses to log in to the server).

    Args:
        pool_mode: PgBouncer's ``pool_mode``.
        ignore_startup_parameters: PgBouncer's ``ignore_startup_parameters``; none is
            PgBouncer's default.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        user: str,
        password: str = "",
        pool_mode: str = "transaction",
        ignore_startup_parameters: Sequence[str] = ("options",),
    ) -> None:
        self.user = user
        self.port = _free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="jobq-test-pgbouncer.", dir="/tmp"))
        self._process: subprocess.Popen[bytes] | None = None
        ignored = ",".join(ignore_startup_parameters)
        self._config = f"""\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.directory / "users.txt"}
admin_users = {user}
pool_mode = {pool_mode}
server_round_robin = 1
default_pool_size = 20
max_client_conn = 200
{f"ignore_startup_parameters = {ignored}" if ignored else ""}
"""
        self._users = f"{_quoted(user)} {_quoted(password)}\n"

    @property
    def log(self) -> Path:
        """PgBouncer's log (its stderr)."""
        return self.directory / "pgbouncer.log"

    def start(self) -> None:
        """Start PgBouncer and wait until it accepts connections.

        Raises:
            RuntimeError: it exited, or did not listen within :data:`START_TIMEOUT` seconds
                (the message quotes its log).
        """
        executable = binary()
        assert executable is not None, unavailable_reason()
        (self.directory / "pgbouncer.ini").write_text(self._config)
        (self.directory / "users.txt").write_text(self._users)
        run_as: dict[str, Any] = {}
        if os.geteuid() == 0:
            owner = _postgres_user()
            assert owner is not None, unavailable_reason()
            for path in (self.directory, *self.directory.iterdir()):
                os.chown(path, owner.pw_uid, owner.pw_gid)
            run_as = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
        with self.log.open("wb") as log:
            self._process = subprocess.Popen(
                [executable, str(self.directory / "pgbouncer.ini")],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.directory,
                **run_as,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited ({self._process.returncode}):\n{self._log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"pgbouncer did not listen on port {self.port} within "
                        f"{START_TIMEOUT:g} s:\n{self._log()}"
                    ) from None
                time.sleep(0.05)

    def _log(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else "(no log)"

    def url(self, database: str) -> str:
        """A ``postgres://`` URL of ``database`` through this PgBouncer."""
        return f"postgres://{quote(self.user)}@127.0.0.1:{self.port}/{quote(database)}"

    def warm(self, database: str, servers: int = 2) -> None:
        """Open ``servers`` server connections to ``database`` (that many clients, each in a
        transaction at once), for the round robin to take turns on."""
        clients = [psycopg.connect(self.url(database)) for _ in range(servers)]
        try:
            for client in clients:
                client.execute("SELECT 1")  # each holds a server connection until it ends
            for client in clients:
                client.rollback()  # PgBouncer closes a server left in a transaction
        finally:
            for client in clients:
                client.close()

    def show(self, what: str) -> list[dict[str, Any]]:
        """Rows of the admin console's ``SHOW <what>`` (``STATS``, ``SERVERS``, ...), as
        dicts. The console speaks the simple query protocol only, as a client-side cursor
        does."""
        with psycopg.connect(
            self.url("pgbouncer"), autocommit=True, cursor_factory=psycopg.ClientCursor
        ) as console:
            cursor = console.execute(f"SHOW {what}")
            names = [column.name for column in cursor.description or []]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def stop(self) -> None:
        """Stop PgBouncer (its server connections close with it) and remove its directory."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)
