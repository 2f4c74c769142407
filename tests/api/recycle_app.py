"""A tiny ASGI app for the worker-recycling test (tests/api/test_worker_recycling.py): ``GET /`` answers
its process id, ``GET /grow`` makes the process hold 120 MB more (kept until it exits)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_held: list[bytearray] = []


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    if scope["path"] == "/grow":
        _held.append(bytearray(os.urandom(1) * (120 * 1024 * 1024)))  # touched: resident, not just mapped
    body = str(os.getpid()).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


def make() -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The app (a factory, as api.replicas.serve expects by default)."""
    return _app
