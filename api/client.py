"""A small client of costopt's REST API (httpx), used by the CLI's ``jobs`` and ``admin`` commands.

Errors come back as :class:`ApiError` with the HTTP status and the service's message (the one JSON
error shape: ``{"error": {"code", "message", "details"}}``); a service that cannot be reached is an
:class:`ApiUnreachable` naming the URL and how to start it. Keys are sent as ``Authorization: Bearer``
and never printed.

A request that meets a pooled connection the server had just closed (uvicorn closes an idle keep-alive
connection after 5 s; a request sent as it closes gets ``Server disconnected without sending a response``)
is sent once more on a new connection when repeating it cannot do anything twice: a GET, HEAD, PUT or
DELETE, or a request with an ``Idempotency-Key`` (the service answers its repeat with the first result).
Any other request's failure is :class:`ApiUnreachable`, as it may have been carried out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from costopt.errors import CostoptError


class ApiError(CostoptError):
    """The service answered with an error: ``status`` (HTTP), ``code`` and ``message`` (what to fix)."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{message} (HTTP {status}, {code})")
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class ApiUnreachable(CostoptError):
    """No answer from the service at the configured URL."""


SAFE_TO_REPEAT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
"""Methods the service carries out at most once however often they are sent (HTTP's idempotent methods)."""


def repeatable(method: str, headers: Mapping[str, str] | None) -> bool:
    """True when sending ``method`` with ``headers`` twice does what sending it once does: an idempotent
    method, or any request with an ``Idempotency-Key`` header."""
    if method.upper() in SAFE_TO_REPEAT:
        return True
    return any(k.lower() == "idempotency-key" for k in (headers or {}))


def _error_of(resp: httpx.Response) -> ApiError:
    code, message, details = "http_error", resp.reason_phrase or f"HTTP {resp.status_code}", None
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict):
            code = str(err.get("code", code))
            message = str(err.get("message", message))
            details = err.get("details")
        elif "detail" in doc:  # FastAPI's default shape, should a route still use it
            message = str(doc["detail"])
    if resp.status_code == 401:
        message += "; set COSTOPT_API_KEY to a key (make run prints the admin key once)"
    return ApiError(resp.status_code, code, message, details)


@dataclass(slots=True)
class ApiClient:
    """``base_url`` (e.g. http://127.0.0.1:8000) and an optional API key; ``transport`` for tests
    (e.g. ``httpx.ASGITransport`` or a ``TestClient``'s)."""

    base_url: str
    api_key: str | None = None
    timeout_s: float = 30.0
    transport: httpx.BaseTransport | None = None
    _client: httpx.Client | None = field(default=None, init=False, repr=False)

    def _http(self) -> httpx.Client:
        if self._client is None:
            headers = {"Accept": "application/json"}
            if self.api_key:
                headers["Authorization"] = f"Bearer {self.api_key}"
            self._client = httpx.Client(
                base_url=self.base_url.rstrip("/"), headers=headers, timeout=self.timeout_s, transport=self.transport
            )
        return self._client

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """The decoded JSON answer (None for 204); raises :class:`ApiError` / :class:`ApiUnreachable`."""
        resp = self._send(method, path, json=json, params=params, headers=headers)
        if resp.status_code == 204 or not resp.content:
            return None
        return resp.json()

    def pages(
        self, path: str, *, params: Mapping[str, Any] | None = None, limit: int, page_size: int
    ) -> tuple[list[dict[str, Any]], int]:
        """Follow a listing's ``next_cursor`` until ``limit`` items (at most ``page_size`` a request):
        the items in the listing's order and its ``total`` (as the last page said)."""
        items: list[dict[str, Any]] = []
        total = 0
        cursor: str | None = None
        while len(items) < limit:
            page = self.request(
                "GET", path, params={**(params or {}), "limit": min(page_size, limit - len(items)), "cursor": cursor}
            )
            items += page["items"]
            total = int(page.get("total", len(items)))
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return items, total

    def download(self, path: str, *, params: Mapping[str, Any] | None = None) -> bytes:
        """The raw body of a GET (an export: CSV, Parquet); errors as :meth:`request`."""
        return self._send("GET", path, params=params, headers={"Accept": "*/*"}).content

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        sent = dict(headers or {})
        try:
            try:
                resp = self._http().request(method, path, json=json, params=clean, headers=sent)
            except httpx.RemoteProtocolError:
                # most likely a pooled connection the server closed as this request went out (module docstring)
                if not repeatable(method, sent):
                    raise
                resp = self._http().request(method, path, json=json, params=clean, headers=sent)
        except httpx.TransportError as exc:
            raise ApiUnreachable(
                f"cannot reach the costopt service at {self.base_url} ({type(exc).__name__}): start it with "
                "`make run` or set COSTOPT_API_URL"
            ) from exc
        if resp.status_code >= 400:
            raise _error_of(resp)
        return resp

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
