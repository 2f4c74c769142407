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
import socket
from typing import Any, cast

import uvloop

LOOP = "api.replicas:ReusePortLoop"
"""uvicorn's ``loop`` setting for a worker that binds its own socket."""


class ReusePortLoop(uvloop.Loop):
    """uvloop's event loop whose servers bound by host and port set ``SO_REUSEPORT`` (a server given a
    socket keeps it as it is)."""

    async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.Server:
        if kwargs.get("sock") is None:
            kwargs.setdefault("reuse_port", True)
        return cast(asyncio.Server, await super().create_server(*args, **kwargs))


def serve(
    app: str,
    *,
    workers: int,
    host: str,
    port: int,
    factory: bool = True,
    log_level: str = "info",
    access_log: bool = True,
) -> None:
    """Run ``app`` (an import string, ``module:attribute``; a factory when ``factory``) in ``workers``
    processes on ``host:port``, each accepting on its own socket; returns when the workers have stopped
    (SIGINT/SIGTERM). A port taken by a socket without ``SO_REUSEPORT`` (or an app that fails to start)
    stops every worker at start-up: exits with uvicorn's start-up failure code, 3."""
    from uvicorn import Config
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors.multiprocess import Multiprocess

    if workers < 2:
        raise ValueError(f"serve() runs two or more workers, got {workers}: run uvicorn.run for one")
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
    supervisor = Multiprocess(config, sockets=cast(list[socket.socket], None))
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
    args = parser.parse_args(argv)
    serve(
        args.app,
        workers=args.workers,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=not args.no_access_log,
    )


if __name__ == "__main__":
    main()
