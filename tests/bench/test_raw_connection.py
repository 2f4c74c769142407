"""bench/api_load.py's raw keep-alive client when the server closes a kept-alive connection (a serving
replica replaced for its memory closes its connections): a request that met the close before any answer is
sent once more on a new connection only when repeating it is safe (GET, or a POST with an Idempotency-Key);
any other is an error."""

from __future__ import annotations

import asyncio

import pytest

from bench.api_load import HttpError, RawConnection, http_request

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def _serve(answer_first_only: bool) -> tuple[asyncio.Server, list[bytes]]:
    """A server that answers a connection's first request, then reads the next one and closes the
    connection without answering it (``answer_first_only``), or answers every request."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                seen.append(head.split(b"\r\n", 1)[0])
                n += 1
                if answer_first_only and n > 1:
                    break
                writer.write(OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), seen


def _port(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


def test_a_get_meeting_a_closed_keep_alive_is_sent_again_on_a_new_connection() -> None:
    async def go() -> tuple[list[tuple[int, bytes]], int, list[bytes]]:
        server, seen = await _serve(answer_first_only=True)
        conn = RawConnection("127.0.0.1", _port(server))
        got = [await conn.request(http_request("GET", "/a", "h")) for _ in range(3)]
        conn.close()
        server.close()
        return got, conn.retried, seen

    got, retried, seen = asyncio.run(go())
    assert got == [(200, b"ok")] * 3
    assert retried == 2  # the 2nd and 3rd each met a close on their first try
    assert seen == [b"GET /a HTTP/1.1"] * 5


@pytest.mark.parametrize(("key", "repeated"), [(None, False), ("k-1", True)])
def test_a_post_is_sent_again_only_with_an_idempotency_key(key: str | None, repeated: bool) -> None:
    async def go() -> tuple[bool, int]:
        server, _ = await _serve(answer_first_only=True)
        conn = RawConnection("127.0.0.1", _port(server))
        headers = {"Idempotency-Key": key} if key else {}
        assert await conn.request(http_request("GET", "/a", "h")) == (200, b"ok")
        try:
            await conn.request(http_request("POST", "/v1/x", "h", headers, b"{}"))
            ok = True
        except HttpError:
            ok = False
        conn.close()
        server.close()
        return ok, conn.retried

    ok, retried = asyncio.run(go())
    assert ok is repeated and retried == (1 if repeated else 0)


def test_a_fresh_connection_that_fails_is_not_retried() -> None:
    async def go() -> int:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.close()  # never answers

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        conn = RawConnection("127.0.0.1", _port(server))
        with pytest.raises(HttpError):
            await conn.request(http_request("GET", "/a", "h"))
        server.close()
        return conn.retried

    assert asyncio.run(go()) == 0
