"""What the hottest read routes use to spend less CPU per request than FastAPI's defaults (issue 10's
load targets; bench/api_load.py measures them).

- :func:`blocking`: run a blocking function (a database read) on a worker thread through asyncio's own
  ``run_in_executor``, about a third less CPU a hop than Starlette's ``run_in_threadpool`` (anyio's
  capacity limiter, cancel scopes and context variables), which FastAPI uses for every ``def`` route. The pool has
  ``COSTOPT_DB_POOL_SIZE`` threads (a thread beyond the connection pool would only wait for a connection).
- :func:`json_of`: a pydantic model as a JSON response serialized once, by pydantic's own serializer,
  instead of FastAPI's response-model round trip (dump to a dict, validate it again, dump to JSON-able
  values, ``json.dumps``). The route keeps ``response_model=`` for its OpenAPI document; the body is the
  same JSON (``by_alias``, the model's own field serializers).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from fastapi import Request
from pydantic import BaseModel
from starlette.responses import Response

P = ParamSpec("P")
T = TypeVar("T")

_lock = threading.Lock()


def _executor(request: Request) -> ThreadPoolExecutor:
    pool: ThreadPoolExecutor | None = getattr(request.app.state, "hot_path_pool", None)
    if pool is None:
        with _lock:
            pool = getattr(request.app.state, "hot_path_pool", None)
            if pool is None:
                settings = getattr(request.app.state, "settings", None)
                size = int(getattr(settings, "db_pool_size", 20) or 20)
                pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="costopt-read")
                request.app.state.hot_path_pool = pool
    return pool


def shutdown(app: Any) -> None:
    """Stop the app's read pool (at the end of its lifespan); a later request makes a new one."""
    pool: ThreadPoolExecutor | None = getattr(app.state, "hot_path_pool", None)
    if pool is not None:
        app.state.hot_path_pool = None
        pool.shutdown(wait=False, cancel_futures=True)


async def blocking(request: Request, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on the app's read pool, in a copy of the caller's context; its exceptions
    propagate to the route (so the app's error handlers answer them as for a ``def`` route)."""
    ctx = contextvars.copy_context()
    call = functools.partial(ctx.run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_executor(request), call)


def json_of(model: BaseModel, status_code: int = 200) -> Response:
    """``model`` as an ``application/json`` response, serialized once (see the module docstring)."""
    return Response(model.model_dump_json(by_alias=True), status_code=status_code, media_type="application/json")
