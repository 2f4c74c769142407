"""The REST client sends a request again when its pooled connection was closed under it, only when that is safe.

uvicorn closes a keep-alive connection idle for 5 s; a request written as it closes fails with
``RemoteProtocolError`` ("Server disconnected without sending a response"), and whether the server read it is
unknown. The client repeats GET/PUT/DELETE and requests with an ``Idempotency-Key`` once on a new connection,
never an unkeyed POST (it might create a second job).
"""

from __future__ import annotations

import json

import httpx
import pytest

from api.client import ApiClient, ApiUnreachable, repeatable


class _DropsFirst:
    """A transport whose first ``drops`` requests fail as a connection the server just closed."""

    def __init__(self, drops: int = 1) -> None:
        self.drops = drops
        self.seen: list[tuple[str, str, str | None]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append((request.method, request.url.path, request.headers.get("Idempotency-Key")))
        if self.drops > 0:
            self.drops -= 1
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        return httpx.Response(201 if request.method == "POST" else 200, json={"id": "job-1", "n": len(self.seen)})


def _client(handler: _DropsFirst) -> ApiClient:
    return ApiClient("http://costopt.test", "key", transport=httpx.MockTransport(handler))


def test_a_keyed_post_is_sent_again_once_and_answers() -> None:
    handler = _DropsFirst()
    doc = _client(handler).request("POST", "/v1/jobs", json={"steps": 10}, headers={"Idempotency-Key": "k-1"})
    assert doc == {"id": "job-1", "n": 2}
    assert handler.seen == [("POST", "/v1/jobs", "k-1"), ("POST", "/v1/jobs", "k-1")]


def test_an_unkeyed_post_is_not_sent_again() -> None:
    handler = _DropsFirst()
    with pytest.raises(ApiUnreachable, match="RemoteProtocolError"):
        _client(handler).request("POST", "/v1/jobs", json={"steps": 10})
    assert handler.seen == [("POST", "/v1/jobs", None)]


def test_a_get_is_sent_again() -> None:
    handler = _DropsFirst()
    assert _client(handler).request("GET", "/v1/jobs/job-1") == {"id": "job-1", "n": 2}
    assert [m for m, _, _ in handler.seen] == ["GET", "GET"]


def test_only_once_a_second_failure_is_unreachable() -> None:
    handler = _DropsFirst(drops=2)
    with pytest.raises(ApiUnreachable):
        _client(handler).request("GET", "/v1/jobs")
    assert len(handler.seen) == 2


def test_the_repeat_carries_the_same_body() -> None:
    bodies: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        if len(bodies) == 1:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        return httpx.Response(201, json={"id": "job-1"})

    client = ApiClient("http://costopt.test", "key", transport=httpx.MockTransport(handler))
    client.request("POST", "/v1/jobs", json={"steps": 7, "name": "a"}, headers={"idempotency-key": "k"})
    assert bodies == [{"steps": 7, "name": "a"}, {"steps": 7, "name": "a"}]


@pytest.mark.parametrize(
    ("method", "headers", "expected"),
    [
        ("GET", None, True),
        ("delete", {}, True),
        ("PUT", None, True),
        ("POST", None, False),
        ("PATCH", {"X-Other": "1"}, False),
        ("POST", {"Idempotency-Key": "k"}, True),
        ("POST", {"IDEMPOTENCY-KEY": "k"}, True),
    ],
)
def test_repeatable(method: str, headers: dict[str, str] | None, expected: bool) -> None:
    assert repeatable(method, headers) is expected
