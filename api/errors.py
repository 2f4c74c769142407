"""One JSON error shape for every 4xx and 5xx answer of the REST API.

Every error reads ``{"error": {"code": "<snake_case>", "message": "<what to fix>", "details": [...]}}``
(``details`` only when there is something to list: the fields of a rejected body, close matches of an
unknown name, the binding constraint). That holds for the routes' own errors (:class:`ApiError`, or an
``HTTPException`` whose ``detail`` is a string or a ``{"code", "message", "details"}`` mapping), for
FastAPI's validation errors (malformed JSON, wrong types, missing or unknown fields: 422
``invalid_request`` with one detail per field, its path and what to fix), for unknown routes (404) and
methods (405), for bodies over the size limit (413, :class:`BodyLimit`), for a database that cannot
serve right now (503 ``unavailable`` with ``Retry-After``: the server is down or restarting, a connection
was cut, the pool is exhausted, a query was cancelled on ``COSTOPT_DB_STATEMENT_TIMEOUT_S``, the message
then saying which bound; :func:`costopt.db.engine.db_unavailable`; one warning line per failure, no
traceback) and for unexpected exceptions (500 ``internal_error``, logged here with the request's method and
path, never echoed to the caller).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("costopt.api")

__all__ = [
    "ERROR_SCHEMA",
    "ApiError",
    "BodyLimit",
    "document_errors",
    "error_body",
    "install_error_docs",
    "install_error_handlers",
    "validation_details",
]

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    500: "internal_error",
    503: "unavailable",
}


class ApiError(Exception):
    """An error answer: HTTP ``status``, a snake_case ``code``, a ``message`` saying what to fix and,
    optionally, ``details`` (a list of JSON values)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: Sequence[Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.details = list(details) if details is not None else None
        self.headers = dict(headers) if headers is not None else None


def error_body(code: str, message: str, details: Sequence[Any] | None = None) -> dict[str, Any]:
    """The error document (see the module doc)."""
    err: dict[str, Any] = {"code": code, "message": message}
    if details:
        err["details"] = list(details)
    return {"error": err}


def _response(
    status: int, code: str, message: str, details: Sequence[Any] | None = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(code, message, details), headers=dict(headers or {}))


def _default_code(status: int) -> str:
    if status in _CODES:
        return _CODES[status]
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "server_error" if status >= 500 else "bad_request"


def _field_path(loc: Sequence[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        where, rest = parts[0], parts[1:]
        if not rest:
            return where
        return f"{where}.{'.'.join(rest)}" if where != "body" else ".".join(rest)
    return ".".join(parts)


_FIX = {
    "json_invalid": "send a valid JSON document (Content-Type: application/json)",
    "missing": "add this field",
    "extra_forbidden": "remove this field (it is not part of the request; check its spelling)",
    "finite_number": "send a finite number (NaN and infinity are not accepted)",
    "int_from_float": "send a whole number",
    "model_attributes_type": "send a JSON object",
    "dict_type": "send a JSON object",
    "list_type": "send a JSON list",
}


def validation_details(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """pydantic's errors as ``{"field": "objective.deadline_hours", "problem": ..., "fix": ...}``; the
    rejected value is never echoed (it may be large, or a secret)."""
    out: list[dict[str, Any]] = []
    for e in errors[:50]:
        kind = str(e.get("type", ""))
        loc = e.get("loc", ())
        # tagged unions and function validators add their own step to the path: keep the user's path
        path = _field_path([p for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-")))])
        problem = str(e.get("msg", "invalid value"))
        if kind == "json_invalid":
            ctx = e.get("ctx") or {}
            problem = f"the body is not valid JSON ({ctx.get('error', 'parse error')})"
            path = "body"
        fix = _FIX.get(kind, _fix_from_ctx(kind, e.get("ctx") or {}))
        item = {"field": path or "body", "problem": problem}
        if fix:
            item["fix"] = fix
        out.append(item)
    return out


def _fix_from_ctx(kind: str, ctx: Mapping[str, Any]) -> str:
    for key, text in (
        ("gt", "send a value greater than {}"),
        ("ge", "send a value of at least {}"),
        ("lt", "send a value less than {}"),
        ("le", "send a value of at most {}"),
        ("max_length", "send at most {} items or characters"),
        ("min_length", "send at least {} items or characters"),
        ("expected", "send one of {}"),
    ):
        if key in ctx:
            return text.format(ctx[key])
    if kind.endswith("_parsing") or kind.endswith("_type"):
        return "send a value of the expected type"
    return ""


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return _response(exc.status, exc.code, exc.message, exc.details, exc.headers)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status, detail = exc.status_code, exc.detail
    headers = getattr(exc, "headers", None)
    if isinstance(detail, Mapping):
        code = str(detail.get("code") or _default_code(status))
        message = str(detail.get("message") or HTTPStatus(status).phrase)
        details = detail.get("details")
        return _response(status, code, message, details if isinstance(details, list) else None, headers)
    if status == 404 and detail == "Not Found":
        message = f"no route {request.method} {request.url.path}: see /docs for the routes"
    elif status == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(detail) if detail else HTTPStatus(status).phrase
    return _response(status, _default_code(status), message, None, headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    details = validation_details(exc.errors())
    if len(details) == 1:
        d = details[0]
        message = f"{d['field']}: {d['problem']}" + (f" ({d['fix']})" if d.get("fix") else "")
    else:
        message = f"the request has {len(exc.errors())} invalid fields: see details"
    return _response(422, "invalid_request", message, details)


DB_RETRY_AFTER_S = 5
"""The ``Retry-After`` (seconds) of a 503 answered while the database cannot serve."""


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    """A database error: 503 when it is worth retrying (:func:`costopt.db.engine.db_unavailable`); any
    other goes on to the 500 of an unexpected error (re-raised, as if this handler were not there)."""
    from costopt.db.engine import db_timeout, db_unavailable

    if not db_unavailable(exc):
        raise exc
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    timeout = db_timeout(exc)
    if timeout is None:
        what = "the database is unavailable right now"
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path, first)
    else:
        what = _timeout_message(request, timeout)
        log.warning("database query timed out on %s %s: %s", request.method, request.url.path, first)
    return _response(
        503,
        "unavailable",
        f"{what}; retry in {DB_RETRY_AFTER_S} s (GET /readyz answers 200 when it is back; a submission retried "
        "with the same Idempotency-Key creates its job once)",
        None,
        {"Retry-After": str(DB_RETRY_AFTER_S)},
    )


def _timeout_message(request: Request, timeout: str) -> str:
    """What a statement the database cancelled on a time bound means (``timeout``: :func:`db_timeout`)."""
    settings = getattr(request.app.state, "settings", None)
    bound = getattr(settings, "db_statement_timeout_s", None)
    limit = f" of {bound:g} s (COSTOPT_DB_STATEMENT_TIMEOUT_S)" if bound else ""
    if timeout == "lock timeout":
        return (
            f"a database query waited too long for a lock held by another session (lock timeout: half the "
            f"statement bound{limit}) and was cancelled"
        )
    if timeout == "busy timeout":
        return f"the database file stayed locked by another writer past the busy timeout{limit}; the query gave up"
    if timeout == "no answer":
        from costopt.db.engine import answer_bound_s

        answer = answer_bound_s(bound, getattr(settings, "db_answer_timeout_s", None)) if bound is not None else None
        within = f" within {answer:g} s (COSTOPT_DB_ANSWER_TIMEOUT_S)" if answer else ""
        return (
            f"the database server did not answer{within}: it is frozen or the network drops packets; the "
            "connection was closed"
        )
    if timeout == "statement timeout":
        return (
            f"a database query ran past the statement bound{limit} (the database is stalled or overloaded) "
            "and was cancelled"
        )
    return "a database query was cancelled by the database (an operator or a shutdown)"


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return _response(500, "internal_error", "the service failed unexpectedly; the error is logged, retry later")


def install_error_handlers(app: FastAPI) -> None:
    """Route every error of ``app`` through the one shape (see the module doc)."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    for kind in _database_errors():
        app.add_exception_handler(kind, _database_error)
    app.add_exception_handler(Exception, _unexpected)


def _database_errors() -> list[type[Exception]]:
    """The exception classes :func:`_database_error` looks at: SQLAlchemy's, the drivers' own (a raw
    connection's, e.g. COPY) and the store's :class:`~costopt.errors.StoreError` (raised from them)."""
    import sqlite3

    import psycopg
    from sqlalchemy.exc import SQLAlchemyError

    from costopt.errors import StoreError

    return [SQLAlchemyError, psycopg.Error, sqlite3.Error, StoreError]


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets 413 ``body_too_large`` before any route
    reads it (a ``Content-Length`` over the limit at once; a chunked body as soon as it passes it)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._refuse(send, 400, "bad_request", "Content-Length is not a number")
                    return
                if declared > self.max_bytes:
                    await self._too_large(send)
                    return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._too_large(send)

    async def _too_large(self, send: Send) -> None:
        doc = _too_large_detail(self.max_bytes)
        await self._refuse(send, 413, doc["code"], doc["message"])

    @staticmethod
    async def _refuse(send: Send, status: int, code: str, message: str) -> None:
        import json

        body = json.dumps(error_body(code, message)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _too_large_detail(max_bytes: int) -> dict[str, str]:
    return {
        "code": "body_too_large",
        "message": f"the request body is over {max_bytes} bytes: send fewer or smaller items (e.g. split a batch)",
    }


class _TooLarge(StarletteHTTPException):
    """The body passed the limit while being read (an HTTPException, so that FastAPI's body parsing
    lets it through to the error handlers, which read the mapping ``detail``)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, _too_large_detail(max_bytes))  # type: ignore[arg-type]


ERROR_SCHEMA: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "description": "The one error shape of the API (see api/errors.py).",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "additionalProperties": False,
            "properties": {
                "code": {"type": "string", "pattern": "^[a-z0-9_]+$", "description": "snake_case, stable"},
                "message": {"type": "string", "minLength": 1, "description": "what went wrong and what to fix"},
                "details": {"type": "array", "items": {}, "description": "fields, close matches, constraints"},
            },
        }
    },
}

_WHY = {
    400: "the request cannot be read (a malformed body or header)",
    401: "no API key, or not a valid one (`Authorization: Bearer co_...`)",
    403: "the key's role may not do this (an admin route, another team's filter)",
    404: "no such resource, or it belongs to another team",
    409: "the request conflicts with the resource's state or a name in use",
    413: "the request body is over the size limit",
    422: "a field is missing, of the wrong type or out of range: the details name each",
    429: "this key sent too many requests: retry after `Retry-After` seconds",
    503: "the service is starting or its database is unreachable: retry shortly",
}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}
"""Declared (not required) on 429 and 503: a 429 always sends it, a 503 of the database
(:func:`_database_error`) does, one of a service still starting does not."""


def _error_statuses(path: str, op: Mapping[str, Any]) -> list[int]:
    """The error answers an operation can give (its declared ones are kept)."""
    if not path.startswith("/v1/"):
        return [422] if op.get("parameters") else []
    out = [422, 503]
    if op.get("security"):
        out += [401, 403, 404, 429]
    if any(p.get("in") == "path" for p in op.get("parameters", ())):
        out.append(404)
    if "requestBody" in op:
        out += [400, 409, 413]
    return sorted(set(out))


def document_errors(doc: dict[str, Any]) -> dict[str, Any]:
    """Declare the one error shape on every operation of the OpenAPI document ``doc`` (in place): the
    statuses of :func:`_error_statuses` answer ``ERROR_SCHEMA`` (FastAPI's own 422 schema, which the API
    never sends, is replaced); 401 says ``WWW-Authenticate``, 429 and 503 ``Retry-After``."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    if "Error" in schemas:
        return doc
    schemas["Error"] = ERROR_SCHEMA
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, ops in doc.get("paths", {}).items():
        for op in ops.values():
            responses = op.setdefault("responses", {})
            for status in _error_statuses(path, op):
                have = responses.get(str(status))
                if have is not None and "content" in have and status != 422:
                    continue  # the route declares its own body (e.g. /readyz's 503)
                entry: dict[str, Any] = {"description": (have or {}).get("description") or _WHY[status]}
                if status == 422:
                    entry["description"] = _WHY[422]
                entry["content"] = ref
                if status == 401:
                    entry["headers"] = {"WWW-Authenticate": {"description": "`Bearer`", "schema": {"type": "string"}}}
                elif status in (429, 503):
                    entry["headers"] = {**_RETRY_AFTER}
                responses[str(status)] = entry
    return doc


def install_error_docs(app: FastAPI) -> None:
    """Make ``app.openapi()`` declare the error answers (:func:`document_errors`, once per document: FastAPI
    caches its document until the routes change, and :func:`document_errors` leaves a declared one as is)."""

    def openapi() -> dict[str, Any]:
        return document_errors(FastAPI.openapi(app))

    app.openapi = openapi  # type: ignore[method-assign]
