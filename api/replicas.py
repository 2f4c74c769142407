"""Several uvicorn worker processes on one port, each with its own listening socket (``SO_REUSEPORT``).

uvicorn's ``--workers`` binds one socket in the parent and every worker accepts from it. An event loop
that wakes on a connection accepts every connection pending (uvloop, like asyncio, drains the queue),
so connections opened together (a client's pool, a load balancer's warm-up) tend to land on one worker
while the others idle: a GIL-bound worker then serves alone at one core's rate (the REST reads'
bimodal rates in docs/benchmarks.md). Here each worker binds its own socket to the same address with
``SO_REUSEPORT`` and the kernel spreads new connections over the sockets by a hash of their addresses.

The supervision (restart of a worker that dies, signals, health checks) is uvicorn's own
``Multiprocess``; only where a worker's socket comes from differs: none is bound in the parent, and the
worker's event loop (:class:`ReusePortLoop`, uvicorn's ``loop`` setting) sets ``SO_REUSEPORT`` when it
binds. Linux lets only processes of the same effective user join a port's group.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any, cast

import uvloop

if TYPE_CHECKING:
    from uvicorn.supervisors.multiprocess import Process

log = logging.getLogger("uvicorn.error")

RECYCLE_MIN_AGE_S = 60.0
"""A worker younger than this is never recycled for its memory (a limit set below a fresh worker's size
would otherwise replace workers without end: the supervisor says so instead)."""
RECYCLE_READY_S = 180.0
"""How long a replacement has to finish its start-up (imports, the app's start) before it is given up
(a loaded 2-core machine took over 10 s)."""
RECYCLE_RETRY_S = 60.0
"""After a replacement that was not ready in time, the next try waits this long."""

LOOP = "api.replicas:ReusePortLoop"
"""uvicorn's ``loop`` setting for a worker that binds its own socket."""


class ReusePortLoop(uvloop.Loop):
    """uvloop's event loop whose servers bound by host and port set ``SO_REUSEPORT`` (a server given a
    socket keeps it as it is)."""

    async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.Server:
        if kwargs.get("sock") is None:
            kwargs.setdefault("reuse_port", True)
        return cast(asyncio.Server, await super().create_server(*args, **kwargs))


def resident_mb(pid: int | None) -> float | None:
    """The resident memory of process ``pid`` in MB (``/proc/<pid>/statm``); None when unknown (no such
    process, no ``/proc``)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def _supervisor(config: Any, max_rss_mb: float | None) -> Any:
    """uvicorn's ``Multiprocess`` supervisor that also replaces a worker whose resident memory passed
    ``max_rss_mb`` (None: never; as uWSGI's ``reload-on-rss``): the replacement is started and ready before
    the old worker is sent SIGTERM (it answers its in-flight requests, then exits), one worker at a time, so
    the port is never left unserved. A worker younger than :data:`RECYCLE_MIN_AGE_S` is left alone."""
    from uvicorn.supervisors.multiprocess import Multiprocess, Process

    if max_rss_mb is None:
        return Multiprocess(config, sockets=cast(list[socket.socket], None))
    limit: float = max_rss_mb

    class Recycling(Multiprocess):
        def __init__(self) -> None:
            super().__init__(config, sockets=cast(list[socket.socket], None))
            self.born: dict[int, float] = {}  # pid -> when this supervisor first saw it (within 0.5 s of its start)
            self.recycled = 0
            self.warned = False
            self.not_before = 0.0

        def keep_subprocess_alive(self) -> None:
            super().keep_subprocess_alive()
            now = time.monotonic()
            self.born = {p.pid or 0: self.born.get(p.pid or 0, now) for p in self.processes}
            if self.should_exit.is_set() or now < self.not_before:
                return
            for idx, process in enumerate(self.processes):
                rss = resident_mb(process.pid)
                if rss is None or rss <= limit:
                    continue
                if now - self.born[process.pid or 0] < RECYCLE_MIN_AGE_S:
                    if not self.warned:
                        self.warned = True
                        log.warning(
                            "worker [%s] holds %.0f MB within %.0f s of its start, over the %.0f MB limit: "
                            "raise COSTOPT_WORKER_MAX_RSS_MB above a worker's size after its start-up",
                            process.pid,
                            rss,
                            RECYCLE_MIN_AGE_S,
                            limit,
                        )
                    continue
                self._replace(idx, process, rss)
                return  # one at a time

        def _replace(self, idx: int, old: Process, rss: float) -> None:
            new = Process(self.config, self.sockets)
            new.start()
            deadline, ready = time.monotonic() + RECYCLE_READY_S, False
            while not ready and time.monotonic() < deadline and not self.signal_queue:  # a stop is not held up
                ready = new.wait_until_ready(min(1.0, max(deadline - time.monotonic(), 0.0)), self.should_exit)
                if not new.process.is_alive():
                    break
            if not ready:
                new.kill()
                new.join()
                if not self.should_exit.is_set():
                    self.not_before = time.monotonic() + RECYCLE_RETRY_S
                    log.error(
                        "worker [%s]'s replacement was not ready within %.0f s: keeping it, trying again in %.0f s",
                        old.pid,
                        RECYCLE_READY_S,
                        RECYCLE_RETRY_S,
                    )
                return
            self.processes[idx] = new
            self.recycled += 1
            log.warning(
                "worker [%s] holds %.0f MB, over the %.0f MB limit: replaced by [%s] (%d replaced so far)",
                old.pid,
                rss,
                limit,
                new.pid,
                self.recycled,
            )
            old.terminate()
            old.join()

    return Recycling()


def serve(
    app: str,
    *,
    workers: int,
    host: str,
    port: int,
    factory: bool = True,
    log_level: str = "info",
    access_log: bool = True,
    max_rss_mb: float | None = None,
) -> None:
    """Run ``app`` (an import string, ``module:attribute``; a factory when ``factory``) in ``workers``
    processes on ``host:port``, each accepting on its own socket; returns when the workers have stopped
    (SIGINT/SIGTERM). A port taken by a socket without ``SO_REUSEPORT`` (or an app that fails to start)
    stops every worker at start-up: exits with uvicorn's start-up failure code, 3. ``max_rss_mb``: a worker
    whose resident memory passes it is replaced, its replacement serving first (None: never)."""
    from uvicorn import Config
    from uvicorn.config import STARTUP_FAILURE

    if workers < 1 or (workers < 2 and max_rss_mb is None):
        raise ValueError(f"serve() runs two or more workers (one with max_rss_mb), got {workers}: uvicorn.run")
    if not hasattr(socket, "SO_REUSEPORT"):
        raise RuntimeError("this platform has no SO_REUSEPORT: run uvicorn's own --workers")
    config = Config(
        app,
        factory=factory,
        host=host,
        port=port,
        workers=workers,
        loop=LOOP,
        log_level=log_level,
        access_log=access_log,
    )
    # No socket from the parent: each worker's server binds host:port itself, through ReusePortLoop.
    supervisor = _supervisor(config, max_rss_mb)
    supervisor.run()
    if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes):
        raise SystemExit(STARTUP_FAILURE)  # the address is taken, or the app failed to start: see the log


def main(argv: list[str] | None = None) -> None:
    """``python -m api.replicas APP --workers N --host H --port P [--log-level L] [--no-access-log]``:
    :func:`serve` from a command line (bench/api_load.py starts its server this way, as ``costopt serve
    --workers N`` does)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m api.replicas", description=serve.__doc__)
    parser.add_argument("app", help="module:factory")
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--no-access-log", action="store_true")
    parser.add_argument("--max-rss-mb", type=float, default=None, help="replace a worker over this many MB")
    args = parser.parse_args(argv)
    serve(
        args.app,
        workers=args.workers,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=not args.no_access_log,
        max_rss_mb=args.max_rss_mb,
    )


if __name__ == "__main__":
    main()
