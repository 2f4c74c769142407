"""api/replicas.py: worker processes on one port, each accepting on its own ``SO_REUSEPORT`` socket, so
connections opened together spread over the workers (uvicorn's shared socket gave them to whichever
worker woke first)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from costopt.settings import PROJECT_ROOT
from tests.net_support import free_port, stopped

LISTEN = "0A"  # the TCP state's code in /proc/net/tcp


def listening_sockets(port: int) -> int:
    """How many sockets listen on 127.0.0.1:``port`` (from /proc/net/tcp)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == LISTEN and int(local.split(":")[1], 16) == port:
            count += 1
    return count


def ask(sock: socket.socket) -> int:
    """Send one request on a connected socket; the answering worker's pid."""
    sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return int(data.split(b"\r\n\r\n", 1)[1])


@contextmanager
def replicas(port: int, workers: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    cmd = [sys.executable, "-m", "api.replicas", "tests.api.pid_app:make", "--workers", str(workers)]
    cmd += ["--port", str(port), "--log-level", "warning"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, stdout=out, stderr=subprocess.STDOUT)
    with stopped(proc):
        yield proc


def test_each_worker_listens_on_its_own_socket_and_connections_opened_together_spread(tmp_path: Path) -> None:
    port = free_port()
    with replicas(port, 2, tmp_path / "replicas.log") as proc:
        deadline = time.monotonic() + 120  # a hang's bound (two interpreters starting on a loaded machine)
        while listening_sockets(port) < 2:
            assert proc.poll() is None, (tmp_path / "replicas.log").read_text()
            assert time.monotonic() < deadline, "the workers did not listen in 120 s"
            time.sleep(0.1)
        assert listening_sockets(port) == 2  # one per worker, none in the parent
        # 16 connections opened before any request: on one shared socket the first worker to wake
        # accepts them all; with a socket per worker the kernel hashes each to one (all 16 on the same
        # worker by chance: 2 in 65,536)
        conns = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(16)]
        try:
            pids = [ask(c) for c in conns]
        finally:
            for c in conns:
                c.close()
        assert len(set(pids)) == 2, pids


def test_a_port_taken_without_reuse_port_stops_the_workers_with_the_start_up_failure_code(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        with replicas(port, 2, tmp_path / "replicas.log") as proc:
            try:
                code = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                pytest.fail("the supervisor kept running on a taken port")
        assert code == 3, (tmp_path / "replicas.log").read_text()
        assert "address already in use" in (tmp_path / "replicas.log").read_text().lower()


def test_one_worker_is_refused_with_what_to_run_instead() -> None:
    from api.replicas import serve

    with pytest.raises(ValueError, match=r"uvicorn\.run"):
        serve("tests.api.pid_app:make", workers=1, host="127.0.0.1", port=1)
