"""A local Azure Resource Manager fake over TLS for the real azure-mgmt-compute/-network clients.

azure-core refuses bearer tokens over plain HTTP, so the fake serves HTTPS with a certificate of a throwaway
trustme CA that the clients trust via ``connection_verify``. It keeps VMs and NICs of one resource group in
memory and answers PUT with 201 + ``Azure-AsyncOperation`` and DELETE with 202 + ``Location``
(``Retry-After: 0``), so the real ARM pollers run their long-running-operation protocol to completion.
Shared by the Azure provider tests and the provider contract test.
"""

from __future__ import annotations

import copy
import json
import ssl
import threading
import time
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError

from providers.azure import AzureProvider
from tests.net_support import LoopbackServer

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "azure"
SUBSCRIPTION = "00000000-0000-0000-0000-000000000001"
RG = "costopt-rg"
TOKEN = "fake-token"
SUBNET = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{RG}/providers/Microsoft.Network/virtualNetworks/vnet/subnets/a"
IMAGE = "microsoft-dsvm:ubuntu-hpc:2204:latest"
RG_PREFIX = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{RG}/providers/"
NOW = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests costopt@test"


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    doc.pop("_comment", None)
    return doc


class FakeCredential:
    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken(TOKEN, int(time.time()) + 3600)


class RefusingCredential:
    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        raise ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token")


def make_provider(arm: FakeArm, ca_file: str, **kw: Any) -> AzureProvider:
    """An :class:`AzureProvider` on ``arm`` (trusting ``ca_file``, no retries, no polling delay) with the
    fake's subscription, resource group, subnet, image and key; ``kw`` are further constructor arguments
    (``credential`` defaults to :class:`FakeCredential`)."""
    kw.setdefault("credential", FakeCredential())
    return AzureProvider(
        SUBSCRIPTION,
        RG,
        subnet_id=SUBNET,
        image=IMAGE,
        ssh_public_key=SSH_KEY,
        base_url=arm.url,
        client_kwargs={"connection_verify": ca_file, "retry_total": 0, "polling_interval": 0},
        **kw,
    )


class FakeArm:
    """VMs and NICs of one resource group, in memory, over TLS on 127.0.0.1."""

    def __init__(self, tls: ssl.SSLContext) -> None:
        self.vms: dict[str, dict[str, Any]] = {}
        self.nics: dict[str, dict[str, Any]] = {}
        self.ops: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.puts: list[tuple[str, dict[str, Any]]] = []
        self.fail_put: dict[str, Any] | None = None  # {"status", "body"} answered to the next VM PUT
        self.fail_operation: dict[str, Any] | None = None  # failed LRO result of the next VM PUT
        self.serial: dict[str, str] = {}  # serial console log per VM name (boot diagnostics)
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.handle(self, "GET")

            def do_PUT(self) -> None:
                fake.handle(self, "PUT")

            def do_POST(self) -> None:
                fake.handle(self, "POST")

            def do_DELETE(self) -> None:
                fake.handle(self, "DELETE")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = LoopbackServer(Handler, tls=tls)
        self.url = self.http.url

    def __enter__(self) -> FakeArm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    # ---------------------------------------------------------------- scripted platform events

    def evict(self, name: str, *, deallocate: bool) -> None:
        """Spot eviction: policy Deallocate leaves a deallocated VM, policy Delete removes it."""
        with self.lock:
            if deallocate:
                self.vms[name]["_power"] = "PowerState/deallocated"
            else:
                del self.vms[name]

    # ---------------------------------------------------------------- HTTP

    def send(self, h: BaseHTTPRequestHandler, status: int, doc: Any = None, headers: dict[str, str] | None = None):
        body = b"" if doc is None else json.dumps(doc).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)

    def new_op(self, kind: str, target: tuple[str, str], result: dict[str, Any] | None = None) -> str:
        op = uuid.uuid4().hex
        self.ops[op] = {"kind": kind, "target": target, "polls": 0, "result": result}
        return op

    def handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(h.path)
        query = parse_qs(parts.query)
        with self.lock:
            self.requests.append((method, parts.path))
        if parts.path.startswith("/blobs/") and method == "GET":  # a boot-diagnostics blob, read by its SAS
            self.blob(h, parts.path.split("/")[2], query)
            return
        if h.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send(h, 401, {"error": {"code": "AuthenticationFailed", "message": "no bearer token"}})
            return
        body: dict[str, Any] = {}
        if method == "PUT":
            length = int(h.headers.get("Content-Length", "0"))
            body = json.loads(h.rfile.read(length) or b"{}")
        with self.lock:
            self.route(h, method, parts.path, query, body)

    def route(self, h: Any, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any]) -> None:
        if path.startswith("/operations/"):
            self.poll(h, path.split("/")[2], path.endswith("/result"))
            return
        if not path.startswith(RG_PREFIX):
            self.send(h, 404, load("provider_errors.json")["ResourceGroupNotFound"]["body"])
            return
        rest = path[len(RG_PREFIX) :].split("/")
        kind = "/".join(rest[:2])
        store = {"Microsoft.Compute/virtualMachines": self.vms, "Microsoft.Network/networkInterfaces": self.nics}[kind]
        expand = query.get("$expand", [""])[0] == "instanceView"
        if len(rest) == 2 and method == "GET":
            self.send(h, 200, {"value": [self.view(path + "/" + n, r, expand) for n, r in store.items()]})
            return
        name = rest[2]
        if method == "POST" and rest[3:] == ["retrieveBootDiagnosticsData"]:
            if name not in store:
                self.send(h, 404, {"error": {"code": "ResourceNotFound", "message": f"{name} not found"}})
                return
            blob = f"{self.url}/blobs/{name}/serialconsole.log?sv=2020-08-04&sig=fake"
            self.send(
                h,
                200,
                {
                    "consoleScreenshotBlobUri": blob.replace("serialconsole.log", "screenshot.bmp"),
                    "serialConsoleLogBlobUri": blob,
                },
            )
            return
        if method == "GET":
            if name not in store:
                msg = f"The Resource '{kind}/{name}' under resource group '{RG}' was not found."
                self.send(h, 404, {"error": {"code": "ResourceNotFound", "message": msg}})
            else:
                self.send(h, 200, self.view(path, store[name], expand))
        elif method == "PUT":
            if kind.endswith("virtualMachines"):
                self.puts.append((name, copy.deepcopy(body)))
                if self.fail_put is not None:
                    fail, self.fail_put = self.fail_put, None
                    self.send(h, fail["status"], fail["body"])
                    return
            resource = {**body, "_power": "PowerState/starting", "_created": datetime.now(UTC).isoformat()}
            resource.setdefault("properties", {})["provisioningState"] = "Creating"
            failure = None
            if kind.endswith("virtualMachines"):
                failure, self.fail_operation = self.fail_operation, None
            store[name] = resource
            op = self.new_op("put", (kind, name), failure)
            self.send(
                h,
                201,
                self.view(path, resource, False),
                {"Azure-AsyncOperation": f"{self.url}/operations/{op}", "Retry-After": "0"},
            )
        elif method == "DELETE":
            if name not in store:
                if kind.endswith("virtualMachines"):  # both answers occur; the provider takes either as "gone"
                    self.send(h, 404, {"error": {"code": "ResourceNotFound", "message": f"{name} not found"}})
                else:
                    self.send(h, 204)
                return
            store[name]["properties"]["provisioningState"] = "Deleting"
            op = self.new_op("delete", (kind, name))
            self.send(h, 202, None, {"Location": f"{self.url}/operations/{op}/result", "Retry-After": "0"})

    def blob(self, h: BaseHTTPRequestHandler, name: str, query: dict[str, list[str]]) -> None:
        """The serial console log blob of VM ``name``: 403 without a SAS signature, 404 before any output."""
        if query.get("sig") != ["fake"]:
            self.send(h, 403, {"error": {"code": "AuthenticationFailed", "message": "no SAS signature"}})
            return
        with self.lock:
            text = self.serial.get(name)
        if text is None:
            self.send(h, 404, {"error": {"code": "BlobNotFound", "message": "The specified blob does not exist."}})
            return
        body = text.encode()
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def poll(self, h: Any, op_id: str, location: bool) -> None:
        op = self.ops[op_id]
        op["polls"] += 1
        kind, name = op["target"]
        store = self.vms if kind.endswith("virtualMachines") else self.nics
        if op["polls"] < 2:  # one "still running" answer first, so the poller really polls
            if location:
                self.send(h, 202, None, {"Location": f"{self.url}/operations/{op_id}/result", "Retry-After": "0"})
            else:
                self.send(h, 200, {"status": "InProgress"}, {"Retry-After": "0"})
            return
        if op["kind"] == "delete":
            store.pop(name, None)
            self.send(h, 204)
            return
        if op["result"] is not None:
            store.pop(name, None)
            self.send(h, 200, op["result"]["body"])
            return
        if name in store:
            store[name]["properties"]["provisioningState"] = "Succeeded"
            store[name]["_power"] = "PowerState/running"
        self.send(h, 200, {"status": "Succeeded"})

    def view(self, path: str, resource: dict[str, Any], expand: bool) -> dict[str, Any]:
        name = path.rsplit("/", 1)[1]
        doc = {k: copy.deepcopy(v) for k, v in resource.items() if not k.startswith("_")}
        doc.update(id=path, name=name)
        props = doc.setdefault("properties", {})
        if "virtualMachines" in path:
            doc["type"] = "Microsoft.Compute/virtualMachines"
            props["timeCreated"] = resource["_created"]
            if expand:
                view = load("provider_instance_view.json")
                state = props["provisioningState"].lower()
                view["statuses"][0]["code"] = f"ProvisioningState/{state}"
                view["statuses"][1]["code"] = resource["_power"]
                props["instanceView"] = view
        return doc
