"""A stateful loopback fake of the Compute Engine v1 REST API for the real google-cloud-compute clients:
instances insert/get/list/delete and aggregatedList, zone operations get/list, and the zones list; built
from tests/fixtures/gcp/provider_*.json. Shared by the GCP provider tests and the provider contract test.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.net_support import LoopbackServer

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gcp"
PROJECT = "costopt-demo"
ZONE = "us-central1-a"
ZONE_B = "us-central1-b"
PROJECT_ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "europe-west4-a")
"""The zones the fake's Zones API lists (us-central1-f is DOWN, as zones sometimes are)."""
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

_BASE = r"^/compute/v1/projects/(?P<project>[^/]+)"
INSTANCES = re.compile(_BASE + r"/zones/(?P<zone>[^/]+)/instances$")
INSTANCE = re.compile(_BASE + r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$")
SERIAL = re.compile(_BASE + r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)/serialPort$")
AGGREGATED = re.compile(_BASE + r"/aggregated/instances$")
OPERATIONS = re.compile(_BASE + r"/zones/(?P<zone>[^/]+)/operations$")
OPERATION = re.compile(_BASE + r"/zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)$")
ZONES = re.compile(_BASE + r"/zones$")
FILTER_TERM = re.compile(r'(?P<field>[\w.-]+)\s*(?P<op>>=|=|:)\s*"?(?P<value>[^")]*)"?')


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    data.pop("_comment", None)
    return data


def _fill(template: Any, **values: str) -> Any:
    """``template`` with ``{key}`` placeholders in every string replaced."""
    if isinstance(template, str):
        for k, v in values.items():
            template = template.replace("{" + k + "}", v)
        return template
    if isinstance(template, dict):
        return {k: _fill(v, **values) for k, v in template.items()}
    if isinstance(template, list):
        return [_fill(v, **values) for v in template]
    return template


def _stamp(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000-00:00")


def _matches(item: dict[str, Any], flt: str) -> bool:
    """A subset of the Compute Engine list filter: ``labels.k:*``, ``field = "v"``, ``insertTime >= "t"``."""
    for term in FILTER_TERM.finditer(flt):
        name, op, value = term["field"], term["op"], term["value"]
        if name.startswith("labels."):
            labels = item.get("labels", {})
            key = name.removeprefix("labels.")
            if op == ":" and value == "*":
                if key not in labels:
                    return False
            elif labels.get(key) != value:
                return False
        elif op == ">=":
            if datetime.fromisoformat(str(item.get(name))) < datetime.fromisoformat(value.replace("Z", "+00:00")):
                return False
        elif str(item.get(name, "")) != value:
            return False
    return True


@dataclass
class FakeCompute:
    """State of one fake project: instances and operations by zone, inserts received, injected failures.

    ``insert_failures`` are consumed one per insert: ``op:<name>`` fails the insert's operation with
    ``provider_errors.json``'s operation error ``<name>``; ``http:<name>`` answers the insert with that HTTP
    error body. ``hold_operations``: operations stay RUNNING (the client's wait times out). ``zone_lists``
    counts the Zones API calls.
    """

    url: str = ""
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    operations: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    request_ids: dict[str, tuple[str, str]] = field(default_factory=dict)
    inserts: list[dict[str, Any]] = field(default_factory=list)
    requests: list[tuple[str, str, dict[str, list[str]]]] = field(default_factory=list)
    insert_failures: list[str] = field(default_factory=list)
    get_failures: list[str] = field(default_factory=list)
    serial: dict[tuple[str, str], str] = field(default_factory=dict)
    """Serial console text per (zone, name): what the instance wrote on port 1."""
    hold_operations: bool = False
    zone_lists: int = 0
    clock: datetime = T0
    lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1000))
    errors: dict[str, Any] = field(default_factory=lambda: _load("provider_errors.json"))

    # -- helpers for tests

    def add_instance(self, zone: str, name: str, body: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
        raw: dict[str, Any] = _fill(_load("provider_instance.json"), project=PROJECT, zone=zone, name=name)
        raw.update(body or {})
        raw.update({"id": str(next(self._ids)), "name": name, "creationTimestamp": _stamp(self.clock)})
        raw.update(fields)
        self.instances[(zone, name)] = raw
        return raw

    def preempt(self, zone: str, name: str, at: datetime, *, delete: bool = True) -> None:
        """GCP preempts a Spot VM: a ``compute.instances.preempted`` operation, then the instance is
        deleted (termination action DELETE) or left TERMINATED (STOP)."""
        with self.lock:
            raw = self.instances[(zone, name)]
            op = _fill(_load("provider_preempted_operation.json"), project=PROJECT, zone=zone, name=name, op=name)
            op.update({"targetId": raw["id"], "insertTime": _stamp(at), "startTime": _stamp(at), "endTime": _stamp(at)})
            self.operations[(zone, op["name"])] = op
            if delete:
                del self.instances[(zone, name)]
            else:
                raw.update({"status": "TERMINATED", "lastStopTimestamp": _stamp(at)})

    # -- the API

    def _error(self, kind: str, **values: str) -> tuple[int, dict[str, Any]]:
        body = _fill(self.errors["http_errors"][kind], project=PROJECT, **values)
        return int(body["error"]["code"]), body

    def _new_op(self, zone: str, name: str, kind: str, **extra: Any) -> dict[str, Any]:
        op_name = f"operation-{next(self._ids)}"
        op: dict[str, Any] = _fill(
            _load("provider_operation.json"), project=PROJECT, zone=zone, name=name, op=op_name, type=kind
        )
        op.update({"id": str(next(self._ids)), "insertTime": _stamp(self.clock), "startTime": _stamp(self.clock)})
        op.update(extra)
        self.operations[(zone, op_name)] = op
        return op

    def answer(self, method: str, target: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(target)
        query = parse_qs(parts.query)
        path = parts.path
        flt = query.get("filter", [""])[0]
        with self.lock:
            self.requests.append((method, path, query))
            if (m := INSTANCES.match(path)) and method == "POST":
                return self._insert(m["zone"], body or {}, query.get("requestId", [""])[0])
            if (m := INSTANCES.match(path)) and method == "GET":
                items = [i for (z, _), i in self.instances.items() if z == m["zone"] and _matches(i, flt)]
                return 200, {"kind": "compute#instanceList", "id": "x", "items": items}
            if (m := AGGREGATED.match(path)) and method == "GET":
                scoped: dict[str, Any] = {}
                for (z, _), i in self.instances.items():
                    if _matches(i, flt):
                        scoped.setdefault(f"zones/{z}", {"instances": []})["instances"].append(i)
                return 200, {"kind": "compute#instanceAggregatedList", "id": "x", "items": scoped}
            if (m := SERIAL.match(path)) and method == "GET":
                if (m["zone"], m["name"]) not in self.instances:
                    return self._error("not_found", zone=m["zone"], name=m["name"])
                text = self.serial.get((m["zone"], m["name"]), "")
                return 200, {"kind": "compute#serialPortOutput", "contents": text, "start": "0", "next": str(len(text))}
            if m := INSTANCE.match(path):
                zone, name = m["zone"], m["name"]
                if self.get_failures and method == "GET":
                    return self._error(self.get_failures.pop(0), zone=zone, name=name)
                if (zone, name) not in self.instances:
                    return self._error("not_found", zone=zone, name=name)
                if method == "GET":
                    return 200, self.instances[(zone, name)]
                if method == "DELETE":
                    del self.instances[(zone, name)]
                    op = self._new_op(zone, name, "delete")
                    return 200, op
            if (m := OPERATION.match(path)) and method == "GET":
                return self._poll(m["zone"], m["op"])
            if (m := ZONES.match(path)) and method == "GET":
                self.zone_lists += 1
                items = [
                    {
                        "kind": "compute#zone",
                        "name": z,
                        "region": f"{self.url}/compute/v1/projects/{PROJECT}/regions/{z.rsplit('-', 1)[0]}",
                        "status": "DOWN" if z == "us-central1-f" else "UP",
                    }
                    for z in PROJECT_ZONES
                ]
                return 200, {"kind": "compute#zoneList", "id": "x", "items": items}
            if (m := OPERATIONS.match(path)) and method == "GET":
                items = [o for (z, _), o in self.operations.items() if z == m["zone"] and _matches(o, flt)]
                return 200, {"kind": "compute#operationList", "id": "x", "items": items}
        return 404, {"error": {"code": 404, "message": f"no route {method} {path}"}}

    def _insert(self, zone: str, body: dict[str, Any], request_id: str) -> tuple[int, dict[str, Any]]:
        name = str(body.get("name", ""))
        if request_id and request_id in self.request_ids:  # GCP answers a retried request with its operation
            return 200, self.operations[self.request_ids[request_id]]
        self.inserts.append(copy.deepcopy(body))
        failure = self.insert_failures.pop(0) if self.insert_failures else ""
        if failure.startswith("http:"):
            return self._error(failure.removeprefix("http:"), zone=zone, name=name)
        if (zone, name) in self.instances:
            return self._error("already_exists", zone=zone, name=name)
        op = self._new_op(zone, name, "insert")
        if failure.startswith("op:"):
            op["_fail"] = failure.removeprefix("op:")
        else:
            self.add_instance(zone, name, body)
        if request_id:
            self.request_ids[request_id] = (zone, op["name"])
        return 200, op

    def _poll(self, zone: str, op_name: str) -> tuple[int, dict[str, Any]]:
        op = self.operations.get((zone, op_name))
        if op is None:
            return self._error("not_found", zone=zone, name=op_name)
        if not self.hold_operations and op["status"] != "DONE":
            op.update({"status": "DONE", "progress": 100, "endTime": _stamp(self.clock)})
            fail = op.pop("_fail", None)
            if fail:
                op.update(_fill(self.errors["operation_errors"][fail], project=PROJECT, zone=zone))
            name = op["targetLink"].rsplit("/", 1)[-1]
            if (zone, name) in self.instances and op["operationType"] == "insert":
                self.instances[(zone, name)]["status"] = "RUNNING"
        return 200, {k: v for k, v in op.items() if not k.startswith("_")}

    def posts(self) -> int:
        return sum(1 for method, _, _ in self.requests if method == "POST")


def _handler(fake: FakeCompute) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            try:
                status, answer = fake.answer(method, self.path, body)
            except Exception as exc:  # a bug in the fake: answer 500 (not retried by these calls) and say why
                logging.getLogger("fake-compute").exception("fake failed")
                status, answer = 500, {"error": {"code": 500, "message": f"fake failed: {exc!r}"}}
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def log_message(self, format: str, *args: Any) -> None:
            logging.getLogger("fake-compute").debug(format, *args)

    return Handler


@contextmanager
def serve_compute() -> Iterator[FakeCompute]:
    """A :class:`FakeCompute` served on a free loopback port (its ``url``) for the duration."""
    state = FakeCompute()
    with LoopbackServer(_handler(state)) as server:
        state.url = server.url
        yield state
