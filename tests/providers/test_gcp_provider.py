"""GCP provider through the real google-cloud-compute REST clients (InstancesClient, ZoneOperationsClient)
against a stateful loopback fake of the Compute Engine v1 REST API (instances insert/get/list/delete and
aggregatedList, zone operations get/list), built from tests/fixtures/gcp/provider_*.json."""

from __future__ import annotations

import copy
import itertools
import json
import logging
import re
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from google.auth.credentials import AnonymousCredentials

from costopt.cloud import (
    AuthError,
    CapacityError,
    CloudError,
    CloudProvider,
    InstanceState,
    LaunchSpec,
    NotFoundError,
    QuotaError,
)
from costopt.domain import Cloud, Market, OfferKey
from costopt.settings import Settings
from providers.gcp import (
    PREEMPTED_OPERATION,
    TOKEN_LABEL,
    GcpProvider,
    instance_name,
    map_status,
    request_id_for,
    sanitize_label,
    startup_script,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gcp"
PROJECT = "costopt-demo"
ZONE = "us-central1-a"
ZONE_B = "us-central1-b"
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

_BASE = r"^/compute/v1/projects/(?P<project>[^/]+)"
INSTANCES = re.compile(_BASE + r"/zones/(?P<zone>[^/]+)/instances$")
INSTANCE = re.compile(_BASE + r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$")
AGGREGATED = re.compile(_BASE + r"/aggregated/instances$")
OPERATIONS = re.compile(_BASE + r"/zones/(?P<zone>[^/]+)/operations$")
OPERATION = re.compile(_BASE + r"/zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)$")
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
    error body. ``hold_operations``: operations stay RUNNING (the client's wait times out).
    """

    url: str = ""
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    operations: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    request_ids: dict[str, tuple[str, str]] = field(default_factory=dict)
    inserts: list[dict[str, Any]] = field(default_factory=list)
    requests: list[tuple[str, str, dict[str, list[str]]]] = field(default_factory=list)
    insert_failures: list[str] = field(default_factory=list)
    get_failures: list[str] = field(default_factory=list)
    hold_operations: bool = False
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


@pytest.fixture
def fake() -> Iterator[FakeCompute]:
    state = FakeCompute()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def make_provider(fake: FakeCompute, **overrides: Any) -> GcpProvider:
    kwargs: dict[str, Any] = {
        "project": PROJECT,
        "zones": [ZONE],
        "endpoint": fake.url,
        "credentials": AnonymousCredentials(),  # type: ignore[no-untyped-call]
        "image": "projects/debian-cloud/global/images/family/debian-12",
        "operation_timeout_s": 2.0,
        "poll_interval_s": 0.01,
        "request_timeout_s": 5.0,
        "clock": lambda: T0,
    }
    kwargs.update(overrides)
    return GcpProvider(**kwargs)


@pytest.fixture
def provider(fake: FakeCompute) -> GcpProvider:
    return make_provider(fake)


def spec(
    instance_type: str = "n1-standard-8+v100x1",
    market: Market = Market.SPOT,
    zone: str = ZONE,
    job: str = "job-1",
    epoch: str = "3",
    **env: str,
) -> LaunchSpec:
    return LaunchSpec(
        offer=OfferKey(Cloud.GCP, "us-central1", zone, instance_type, market),
        command=("python", "train.py", "--steps", "100"),
        env={"COSTOPT_JOB_ID": job, "COSTOPT_EPOCH": epoch, "COSTOPT_CHECKPOINT_URI": "gs://ckpt/job-1", **env},
        tags={"costopt:job": job, "costopt:epoch": epoch},
    )


def _metadata(body: dict[str, Any]) -> dict[str, str]:
    return {i["key"]: i["value"] for i in body["metadata"]["items"]}


# --------------------------------------------------------------------------- launch


def test_is_a_cloud_provider(provider: GcpProvider) -> None:
    as_protocol: CloudProvider = provider
    assert as_protocol.name == "gcp"


def test_from_settings(fake: FakeCompute) -> None:
    settings = Settings(gcp_project=PROJECT, gcp_compute_endpoint=fake.url)
    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    provider = GcpProvider.from_settings(settings, zones=[ZONE], credentials=credentials, poll_interval_s=0.01)
    assert provider.project == PROJECT
    assert provider.launch(spec(), "tok-settings").state is InstanceState.RUNNING
    with pytest.raises(ValueError, match="needs a project"):
        GcpProvider.from_settings(Settings(gcp_project=None))


def test_spot_launch_sends_the_documented_request_body(fake: FakeCompute, provider: GcpProvider) -> None:
    inst = provider.launch(spec(), "tok-1")

    assert len(fake.inserts) == 1
    body = fake.inserts[0]
    name = instance_name("tok-1")
    assert body["name"] == name
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/n1-standard-8"
    assert body["guestAccelerators"] == [
        {
            "acceleratorType": f"projects/{PROJECT}/zones/{ZONE}/acceleratorTypes/nvidia-tesla-v100",
            "acceleratorCount": 1,
        }
    ]
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert body["labels"][TOKEN_LABEL] == "tok-1"
    assert body["labels"][sanitize_label("costopt:job", key=True)] == "job-1"
    assert all(re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k) for k in body["labels"])
    assert all(re.fullmatch(r"[a-z0-9_-]{0,63}", v) for v in body["labels"].values())
    disk = body["disks"][0]
    assert disk["boot"] and disk["autoDelete"]
    assert disk["initializeParams"]["sourceImage"] == "projects/debian-cloud/global/images/family/debian-12"
    meta = _metadata(body)
    assert meta["costopt-token"] == "tok-1"
    assert json.loads(meta["costopt-tags"]) == {"costopt:job": "job-1", "costopt:epoch": "3"}
    assert meta["startup-script"].endswith("exec python train.py --steps 100\n")
    insert_query = next(q for m, _, q in fake.requests if m == "POST")
    assert insert_query["requestId"] == [request_id_for("tok-1")]
    assert uuid.UUID(request_id_for("tok-1")).version == 5

    assert inst.instance_id == f"{ZONE}/{name}"
    assert inst.state is InstanceState.RUNNING
    assert inst.offer == OfferKey(Cloud.GCP, "us-central1", ZONE, "n1-standard-8+v100x1", Market.SPOT)
    assert inst.tags == {"costopt:job": "job-1", "costopt:epoch": "3"}
    assert inst.launched_at == T0


def test_startup_script_quotes_the_environment(fake: FakeCompute, provider: GcpProvider, tmp_path: Path) -> None:
    nasty = 'it\'s $(touch pwned) `id` "q" ; rm -rf x\nline2'
    provider.launch(spec(NASTY=nasty), "tok-q")
    script = _metadata(fake.inserts[0])["startup-script"]
    probe = script.replace("exec python train.py --steps 100", "printenv NASTY COSTOPT_JOB_ID")
    out = subprocess.run(["bash"], input=probe, capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout == f"{nasty}\njob-1\n"
    assert not (tmp_path / "pwned").exists()


def test_startup_script_rejects_bad_env_names() -> None:
    with pytest.raises(ValueError, match="shell identifier"):
        startup_script(LaunchSpec(spec().offer, command=("true",), env={"BAD-NAME": "x"}))


def test_accelerator_optimized_on_demand_has_builtin_gpus(fake: FakeCompute, provider: GcpProvider) -> None:
    inst = provider.launch(spec("a2-highgpu-1g", Market.ON_DEMAND), "tok-a2")
    body = fake.inserts[0]
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/a2-highgpu-1g"
    assert "guestAccelerators" not in body
    assert body["scheduling"] == {"onHostMaintenance": "TERMINATE", "automaticRestart": False}
    assert inst.offer.market is Market.ON_DEMAND and inst.offer.instance_type == "a2-highgpu-1g"


def test_unknown_instance_type_and_wrong_cloud_launch_nothing(fake: FakeCompute, provider: GcpProvider) -> None:
    with pytest.raises(ValueError, match="unknown GCP instance type"):
        provider.launch(spec("n1-standard-8+h100x3"), "tok-x")
    aws = LaunchSpec(OfferKey(Cloud.AWS, "us-east-1", "", "g5.xlarge", Market.SPOT), command=("true",))
    with pytest.raises(ValueError, match="cannot launch an offer of aws"):
        provider.launch(aws, "tok-y")
    assert fake.requests == []


def test_offer_without_zone_uses_a_configured_zone_of_its_region(fake: FakeCompute) -> None:
    provider = make_provider(fake, zones=["europe-west4-a", ZONE_B])
    inst = provider.launch(spec(zone=""), "tok-z")
    assert inst.offer.zone == ZONE_B
    with pytest.raises(ValueError, match="no configured zone"):
        provider.launch(LaunchSpec(OfferKey(Cloud.GCP, "asia-east1", "", "g2-standard-4", Market.SPOT)), "t")


# --------------------------------------------------------------------------- idempotency


def test_relaunch_with_the_same_token_creates_no_second_instance(fake: FakeCompute, provider: GcpProvider) -> None:
    first = provider.launch(spec(), "tok-same")
    second = provider.launch(spec(), "tok-same")
    assert second.instance_id == first.instance_id
    assert len(fake.instances) == 1 and len(fake.inserts) == 1 and fake.posts() == 1
    other = provider.launch(spec(), "tok-other")
    assert other.instance_id != first.instance_id and len(fake.instances) == 2


def test_relaunch_after_a_wait_timeout_finds_the_instance(fake: FakeCompute, provider: GcpProvider) -> None:
    fake.hold_operations = True
    slow = make_provider(fake, operation_timeout_s=0.1)
    with pytest.raises(CloudError, match="not done after"):
        slow.launch(spec(), "tok-slow")
    fake.hold_operations = False
    again = provider.launch(spec(), "tok-slow")
    assert again.instance_id == f"{ZONE}/{instance_name('tok-slow')}"
    assert len(fake.instances) == 1 and len(fake.inserts) == 1


def test_concurrent_insert_conflict_returns_the_existing_instance(fake: FakeCompute, provider: GcpProvider) -> None:
    """The name lookup said "absent" (a launch racing this one), then the insert hits 409 alreadyExists."""
    name = instance_name("tok-race")
    fake.add_instance(
        ZONE,
        name,
        labels={TOKEN_LABEL: "tok-race"},
        status="RUNNING",
        machineType=f"zones/{ZONE}/machineTypes/g2-standard-4",
    )
    fake.get_failures.append("not_found")
    inst = provider.launch(spec(), "tok-race")
    assert inst.instance_id == f"{ZONE}/{name}"
    assert len(fake.instances) == 1


# --------------------------------------------------------------------------- terminate, describe, list


def test_terminate_twice(fake: FakeCompute, provider: GcpProvider) -> None:
    inst = provider.launch(spec(), "tok-t")
    provider.terminate(inst.instance_id)
    assert fake.instances == {}
    provider.terminate(inst.instance_id)
    deletes = [p for m, p, _ in fake.requests if m == "DELETE"]
    assert len(deletes) == 1
    with pytest.raises(NotFoundError):
        provider.describe(inst.instance_id)


def test_terminate_refuses_an_instance_costopt_did_not_launch(fake: FakeCompute, provider: GcpProvider) -> None:
    fake.add_instance(ZONE, "someone-elses", status="RUNNING", labels={"team": "x"})
    with pytest.raises(CloudError, match="refusing"):
        provider.terminate(f"{ZONE}/someone-elses")
    assert (ZONE, "someone-elses") in fake.instances


def test_describe_and_list_by_tags(fake: FakeCompute, provider: GcpProvider) -> None:
    a = provider.launch(spec(job="job-a"), "tok-a")
    b = provider.launch(spec("g2-standard-8", job="job-b", zone=ZONE), "tok-b")
    fake.add_instance(ZONE, "foreign", status="RUNNING", labels={"costopt_job": "job-a"})

    described = provider.describe(b.instance_id)
    assert described.offer.instance_type == "g2-standard-8" and described.state is InstanceState.RUNNING
    assert {i.instance_id for i in provider.list({})} == {a.instance_id, b.instance_id}
    assert [i.instance_id for i in provider.list({"costopt:job": "job-a"})] == [a.instance_id]
    assert provider.list({"costopt:job": "job-zzz"}) == []
    flt = next(q["filter"][0] for m, p, q in fake.requests if m == "GET" and p.endswith("/instances") and "filter" in q)
    assert f"labels.{TOKEN_LABEL}:*" in flt

    fake.instances[(ZONE, instance_name("tok-a"))]["status"] = "TERMINATED"
    assert [i.instance_id for i in provider.list({})] == [b.instance_id]
    assert len(provider.list({}, include_terminated=True)) == 2


def test_list_without_zones_uses_the_aggregated_list(fake: FakeCompute) -> None:
    make_provider(fake, zones=[ZONE_B]).launch(spec(zone=ZONE_B), "tok-agg")
    provider = make_provider(fake, zones=[])
    found = provider.list({"costopt:epoch": "3"})
    assert [i.offer.zone for i in found] == [ZONE_B]
    assert any(p.endswith("/aggregated/instances") for _, p, _ in fake.requests)


def test_describe_of_a_bad_id_is_not_found(provider: GcpProvider) -> None:
    with pytest.raises(NotFoundError):
        provider.describe("no-slash")


@pytest.mark.parametrize(
    ("status", "preempted", "expected"),
    [
        ("PROVISIONING", False, InstanceState.PENDING),
        ("STAGING", False, InstanceState.PENDING),
        ("RUNNING", False, InstanceState.RUNNING),
        ("RUNNING", True, InstanceState.RUNNING),
        ("STOPPING", False, InstanceState.STOPPING),
        ("SUSPENDING", False, InstanceState.STOPPING),
        ("STOPPING", True, InstanceState.PREEMPTED),
        ("TERMINATED", False, InstanceState.TERMINATED),
        ("TERMINATED", True, InstanceState.PREEMPTED),
    ],
)
def test_status_mapping(status: str, preempted: bool, expected: InstanceState) -> None:
    assert map_status(status, preempted=preempted) is expected


def test_unknown_status_is_an_error() -> None:
    with pytest.raises(CloudError, match="unknown status"):
        map_status("EXPLODING")


def test_sanitize_label() -> None:
    assert sanitize_label("job-1") == "job-1"
    assert sanitize_label("Job-1") == "job-1"  # case alone: exact tags are compared from metadata
    assert sanitize_label("costopt:job", key=True).startswith("costopt_job_")
    assert sanitize_label("1abc", key=True).startswith("k1abc_")
    long = sanitize_label("x" * 100)
    assert len(long) == 63 and long != sanitize_label("x" * 101)
    assert sanitize_label("a:b") != sanitize_label("a/b")


# --------------------------------------------------------------------------- preemption


def test_preemption_from_zone_operations(fake: FakeCompute, provider: GcpProvider) -> None:
    inst = provider.launch(spec(), "tok-p")
    name = inst.instance_id.split("/")[1]
    at = T0 + timedelta(minutes=30)
    fake.preempt(ZONE, name, at)

    found = provider.interruptions(T0)
    assert [(i.instance_id, i.kind, i.noticed_at, i.deadline) for i in found] == [
        (inst.instance_id, "preempted", at, None)
    ]
    assert provider.interruptions(at + timedelta(seconds=1)) == []
    ops_query = [q for m, p, q in fake.requests if p.endswith("/operations") and m == "GET"]
    assert f'operationType = "{PREEMPTED_OPERATION}"' in ops_query[0]["filter"][0]
    with pytest.raises(NotFoundError):  # termination action DELETE: the VM is gone
        provider.describe(inst.instance_id)


def test_preempted_spot_vm_kept_stopped_is_preempted(fake: FakeCompute, provider: GcpProvider) -> None:
    inst = provider.launch(spec(), "tok-stop")
    fake.preempt(ZONE, inst.instance_id.split("/")[1], T0 + timedelta(minutes=5), delete=False)
    described = provider.describe(inst.instance_id)
    assert described.state is InstanceState.PREEMPTED
    assert described.terminated_at == T0 + timedelta(minutes=5)


def test_spot_vm_stopped_by_the_user_is_terminated(fake: FakeCompute, provider: GcpProvider) -> None:
    inst = provider.launch(spec(), "tok-user")
    fake.instances[(ZONE, inst.instance_id.split("/")[1])]["status"] = "TERMINATED"
    assert provider.describe(inst.instance_id).state is InstanceState.TERMINATED


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("failure", "error"),
    [
        ("op:stockout", CapacityError),
        ("op:quota", QuotaError),
        ("http:stockout", CapacityError),
        ("http:forbidden", AuthError),
        ("http:unauthorized", AuthError),
    ],
)
def test_launch_errors_are_translated(
    fake: FakeCompute, provider: GcpProvider, failure: str, error: type[CloudError]
) -> None:
    fake.insert_failures.append(failure)
    with pytest.raises(error):
        provider.launch(spec(), "tok-err")
    assert fake.instances == {}


def test_capacity_error_then_retry_with_a_fresh_token(fake: FakeCompute, provider: GcpProvider) -> None:
    fake.insert_failures.append("op:stockout")
    with pytest.raises(CapacityError, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
        provider.launch(spec(), "tok-1st")
    assert provider.launch(spec(), "tok-2nd").state is InstanceState.RUNNING


def test_describe_errors_are_translated(fake: FakeCompute, provider: GcpProvider) -> None:
    with pytest.raises(NotFoundError):
        provider.describe(f"{ZONE}/costopt-missing")
    fake.get_failures.append("forbidden")
    with pytest.raises(AuthError):
        provider.describe(f"{ZONE}/costopt-missing")
