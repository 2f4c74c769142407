"""A private PostgreSQL server for tests that stop, restart or cut the database (never the machine's
shared one at 127.0.0.1:5432 that the rest of the suite uses).

:class:`PrivateServer` runs ``initdb`` in a temporary folder with the machine's PostgreSQL binaries
(``COSTOPT_TEST_PG_BIN``, else the newest ``/usr/lib/postgresql/*/bin``, else ``pg_config --bindir``),
trust authentication, its own free loopback port and its own socket folder, ``fsync=off`` (a test
server: nothing to keep). ``initdb`` refuses to run as root: as root the folder is given to the
``postgres`` system user and every binary runs through ``runuser -u postgres``. Without binaries (or
without a user to run them as, under root) :func:`private_server` skips the test, or fails it under CI.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from costopt.db.engine import make_engine
from tests.net_support import free_port


def _bin_dir() -> Path | None:
    env = os.environ.get("COSTOPT_TEST_PG_BIN")
    if env:
        return Path(env)
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True)
    if found:
        return found[0]
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        return Path(out) if out else None
    return None


class PrivateServer:
    """One PostgreSQL server of the test's own: :meth:`start`, :meth:`stop` (``fast`` or ``immediate``),
    :meth:`terminate_backends` (cut every client connection, the server stays up), :meth:`new_database`."""

    def __init__(self, bin_dir: Path, root: Path, port: int, run_as: str | None) -> None:
        self.bin_dir, self.root, self.port, self.run_as = bin_dir, root, port, run_as
        self.data = root / "data"
        self.log = root / "server.log"
        self._frozen: list[int] = []

    def _run(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if self.run_as is not None:
            cmd = ["runuser", "-u", self.run_as, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr or done.stdout}")
        return done

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "-t", "30", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: roll back and disconnect; ``immediate``: no shutdown checkpoint, as a crash)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop")

    def running(self) -> bool:
        cmd = [str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "status"]
        if self.run_as is not None:
            cmd = ["runuser", "-u", self.run_as, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, check=False).returncode == 0

    def processes(self) -> list[int]:
        """This server's postmaster and its children (backends, background workers): its own processes
        only, read from its ``postmaster.pid`` and ``/proc`` (never another server's)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        cmdline = Path(f"/proc/{postmaster}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        if str(self.data) not in cmdline:
            raise RuntimeError(f"pid {postmaster} is not this server's postmaster ({cmdline!r})")
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with suppress(OSError, ValueError, IndexError):
                # the fields after the command's closing parenthesis: state, ppid, ...
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    children.append(int(stat.parent.name))
        return [postmaster, *children]

    def freeze(self) -> list[int]:
        """``SIGSTOP`` the postmaster, then its children: a server that accepts TCP (its kernel does) and
        never answers, whose own timers (``statement_timeout``) do not fire. Returns the pids stopped."""
        pids = self.processes()
        for pid in pids:  # the postmaster first: it forks no new backend meanwhile
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        self._frozen = pids
        return pids

    def thaw(self) -> None:
        """``SIGCONT`` what :meth:`freeze` stopped (children first, then the postmaster)."""
        for pid in reversed(self._frozen):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._frozen = []

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh empty database on this server; returns its URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        admin = make_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
        finally:
            admin.dispose()
        return self.url(name)

    def activity(self, database: str) -> list[tuple[Any, ...]]:
        """The client connections to ``database`` now: (state, wait event type, wait event, seconds in the
        state, the query's first 120 characters), for a failure's message (what waits on what)."""
        admin = make_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT state, wait_event_type, wait_event, "
                        "round(extract(epoch FROM now() - state_change)::numeric, 1), left(query, 120) "
                        "FROM pg_stat_activity WHERE datname = :db AND pid <> pg_backend_pid()"
                    ),
                    {"db": database},
                ).all()
            return [tuple(r) for r in rows]
        finally:
            admin.dispose()

    def terminate_backends(self, database: str) -> int:
        """Cut every client connection to ``database`` (``pg_terminate_backend``); returns how many."""
        admin = make_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                return int(
                    conn.execute(
                        text(
                            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE datname = :db AND pid <> pg_backend_pid()"
                        ),
                        {"db": database},
                    ).scalar_one()
                )
        finally:
            admin.dispose()


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"a private PostgreSQL server is required under CI: {reason}")
    pytest.skip(reason)


@contextmanager
def private_server() -> Iterator[PrivateServer]:
    """A started private server, stopped and its folder removed afterwards (see the module doc)."""
    bin_dir = _bin_dir()
    if bin_dir is None or not (bin_dir / "initdb").exists():
        _unavailable("no PostgreSQL binaries (initdb, pg_ctl): set COSTOPT_TEST_PG_BIN")
        raise AssertionError("unreachable")
    run_as = None
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            _unavailable("initdb refuses root and runuser is missing")
        try:
            import pwd

            pw = pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("initdb refuses root and there is no postgres user to run it as")
            raise
        run_as = "postgres"
    root = Path(tempfile.mkdtemp(prefix="costopt-pg-"))
    if run_as is not None:
        os.chown(root, pw.pw_uid, pw.pw_gid)
    server = PrivateServer(bin_dir, root, free_port(), run_as)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.thaw()  # a test that failed while the server was frozen
        if server.data.exists() and server.running():
            with suppress(RuntimeError, subprocess.TimeoutExpired):
                server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
