"""Loopback networking helpers shared by test packages: closed ports, HTTP(S) servers and TLS for local fakes.

azure-core refuses bearer tokens over plain HTTP, so the Azure fakes serve HTTPS with a certificate of a
throwaway trustme CA that the clients trust via ``connection_verify`` (the CA file).
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import trustme


def free_port() -> int:
    """A loopback port nobody listens on (free when this returns; connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def closed_port_url() -> str:
    """``http://127.0.0.1:<port>`` of a port nobody listens on."""
    return f"http://127.0.0.1:{free_port()}"


def server_tls(ca: trustme.CA) -> ssl.SSLContext:
    """A server-side TLS context with a certificate of ``ca`` for 127.0.0.1 and localhost."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(ctx)
    return ctx


def write_ca(ca: trustme.CA, folder: Path) -> str:
    """``ca``'s certificate written as ``folder/ca.pem`` (for ``connection_verify``); returns the path."""
    path = folder / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


class LoopbackServer:
    """A :class:`ThreadingHTTPServer` of ``handler`` on a free loopback port, serving from a daemon thread
    from construction until :meth:`close` (or the end of a ``with`` block); HTTPS with ``tls``. ``url`` is
    its base URL (``http(s)://127.0.0.1:<port>``)."""

    def __init__(
        self, handler: type[BaseHTTPRequestHandler], *, tls: ssl.SSLContext | None = None, poll_interval: float = 0.02
    ) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(poll_interval,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    def __enter__(self) -> LoopbackServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def stopped(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """``proc``, sent SIGTERM on the way out and killed if it has not exited 20 s later."""
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
