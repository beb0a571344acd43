"""A throwaway PostgreSQL cluster of a test's own, for tests that restart the server.

The shared server the rest of the suite uses (DATABASE_URL, often 127.0.0.1:5432) is never
restarted: a test that needs a restart starts a cluster of its own from the machine's
PostgreSQL binaries, on a free port, with durability off (its data is thrown away), and
removes it afterwards. ``initdb`` and ``pg_ctl`` refuse to run as root, so as root they run
as the ``postgres`` OS user, in a directory that user owns outside pytest's temporary base
(that one is root's, mode 0700). The same recipe as ``scripts/_lib.sh``.

The benchmark's backlog scenario (bench/backlog.py) starts its clusters here too, with
settings of its own (the server's default durability, statement logging).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

import psycopg
from psycopg import sql


def server_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: ``pg_config --bindir``, else the
    newest ``/usr/lib/postgresql/*/bin``, else ``PATH``; ``None`` if there is none."""
    candidates: list[Path] = []
    if shutil.which("pg_config"):
        found = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=False
        ).stdout.strip()
        candidates.append(Path(found))
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda d: [int(part) for part in Path(d).parent.name.split(".") if part.isdigit()],
    )
    candidates += [Path(d) for d in reversed(versions)]
    if initdb := shutil.which("initdb"):
        candidates.append(Path(initdb).parent)
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    return None


def unavailable_reason() -> str | None:
    """Why no cluster can be started here, or ``None`` if one can."""
    if server_bindir() is None:
        return (
            "no PostgreSQL server binaries (initdb, pg_ctl) found: tried pg_config --bindir, "
            "/usr/lib/postgresql/*/bin and PATH"
        )
    if os.geteuid() == 0 and (shutil.which("runuser") is None or _postgres_uid() is None):
        return "running as root, but there is no 'postgres' OS user and runuser to run initdb as"
    return None


def _postgres_uid() -> tuple[int, int] | None:
    import pwd

    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


#: The settings of a test's cluster: durability off (its data is thrown away).
THROWAWAY_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


class Cluster:
    """A cluster in a fresh ``/tmp/jobq-test-pg.*`` directory; :meth:`start` it, then
    :meth:`remove` it (stops it and deletes the directory).

    ``settings`` (``{name: value}``, written to its ``postgresql.conf``) default to
    :data:`THROWAWAY_SETTINGS`; ``{}`` keeps every server default."""

    def __init__(self, settings: Mapping[str, str] | None = None) -> None:
        self.settings = dict(THROWAWAY_SETTINGS if settings is None else settings)
        bindir = server_bindir()
        assert bindir is not None, unavailable_reason()
        self.bindir = bindir
        self.directory = Path(tempfile.mkdtemp(prefix="jobq-test-pg.", dir="/tmp"))
        if os.geteuid() == 0:
            uid, gid = _postgres_uid() or (0, 0)
            os.chown(self.directory, uid, gid)
        self.data = self.directory / "data"
        self.port = _free_port()

    def as_owner(self, *argv: str) -> list[str]:
        """``argv`` run as the cluster's owner (``runuser -u postgres --`` as root). Run it
        with ``cwd=self.directory``: that user may not be able to enter the caller's."""
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)

    def _run(self, *argv: str) -> None:
        done = subprocess.run(
            self.as_owner(*argv),
            cwd=self.directory,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} failed ({done.returncode}): {done.stdout}{done.stderr}"
                f"{self.log.read_text() if self.log.exists() else ''}"
            )

    def start(self, **settings: str) -> None:
        """initdb and start; ``settings`` are more server settings (``wal_level="logical"``)."""
        self._run(
            *(str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"),
            *("--no-sync", "-E", "UTF8", "--locale=C"),
        )
        self._start_server(settings)

    def start_as_standby(self, primary: Cluster, **settings: str) -> None:
        """Copy ``primary`` (``pg_basebackup -R``: streaming replication, no slot) and start
        as its hot standby; ``settings`` as for :meth:`start`."""
        self._run(
            str(self.bindir / "pg_basebackup"),
            *("-D", str(self.data), "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres"),
            *("-R", "--no-sync", "--checkpoint=fast"),
        )
        self._start_server(settings)

    def _start_server(self, settings: Mapping[str, str]) -> None:
        """Write the cluster's settings and ``settings`` to its ``postgresql.conf``; start."""
        merged = {**self.settings, **settings}
        quoted = {name: str(value).replace("'", "''") for name, value in merged.items()}
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.writelines(f"{name} = '{value}'\n" for name, value in quoted.items())
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1"
        self._run(*self._pg_ctl("-l", str(self.log), "-o", options, "start"))

    @property
    def log(self) -> Path:
        """The server's log file (its stderr)."""
        return self.directory / "server.log"

    @property
    def restart_argv(self) -> list[str]:
        """The command that restarts the cluster (fast shutdown: every session is cut)."""
        return self.as_owner(*self._pg_ctl("-l", str(self.log), "restart", "-m", "fast"))

    def _pg_ctl(self, *argv: str) -> list[str]:
        return [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", *argv]

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create database ``name``; return its URL."""
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def remove(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(*self._pg_ctl("stop", "-m", "immediate"))
        shutil.rmtree(self.directory, ignore_errors=True)
