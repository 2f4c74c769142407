"""The Azure provider through the real azure-mgmt-compute/-network clients against a local ARM fake over TLS.

azure-core refuses bearer tokens over plain HTTP, so the fake serves HTTPS with a certificate of a throwaway
trustme CA that the clients trust via ``connection_verify``. The fake keeps VMs and NICs in memory and answers
PUT with 201 + ``Azure-AsyncOperation`` and DELETE with 202 + ``Location`` (``Retry-After: 0``), so the real
ARM pollers run their long-running-operation protocol to completion.
"""

from __future__ import annotations

import base64
import copy
import json
import shlex
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import trustme
from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError

from costopt.cloud import (
    AuthError,
    CapacityError,
    CloudError,
    InstanceState,
    LaunchSpec,
    NotFoundError,
    QuotaError,
)
from costopt.domain import Cloud, Market, OfferKey
from costopt.errors import BadRecord
from providers.azure import AzureProvider, imds_scheduled_events, nic_name, parse_scheduled_events, vm_name

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "azure"
SUBSCRIPTION = "00000000-0000-0000-0000-000000000001"
RG = "costopt-rg"
TOKEN = "fake-token"
SUBNET = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{RG}/providers/Microsoft.Network/virtualNetworks/vnet/subnets/a"
IMAGE = "microsoft-dsvm:ubuntu-hpc:2204:latest"
RG_PREFIX = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{RG}/providers/"
NOW = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)


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
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.handle(self, "GET")

            def do_PUT(self) -> None:
                fake.handle(self, "PUT")

            def do_DELETE(self) -> None:
                fake.handle(self, "DELETE")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self) -> FakeArm:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

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


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture
def arm(ca: trustme.CA) -> Iterator[FakeArm]:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(ctx)
    with FakeArm(ctx) as server:
        yield server


def provider(arm: FakeArm, ca_file: str, **kw: Any) -> AzureProvider:
    kw.setdefault("credential", FakeCredential())
    return AzureProvider(
        SUBSCRIPTION,
        RG,
        subnet_id=SUBNET,
        image=IMAGE,
        ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests costopt@test",
        base_url=arm.url,
        client_kwargs={"connection_verify": ca_file, "retry_total": 0, "polling_interval": 0},
        clock=lambda: NOW,
        **kw,
    )


def spec(market: Market = Market.SPOT, zone: str = "1", tags: dict[str, str] | None = None) -> LaunchSpec:
    return LaunchSpec(
        offer=OfferKey(Cloud.AZURE, "eastus", zone, "Standard_NC6s_v3", market),
        command=("python", "train.py", "--name", "it's a $(test)"),
        env={"COSTOPT_JOB_ID": "job-1", "COSTOPT_EPOCH": "3", "COSTOPT_CHECKPOINT_URI": "az://ckpt/job 1; rm -rf /"},
        tags={"costopt:job": "job-1", "costopt:epoch": "3", **(tags or {})},
    )


# --------------------------------------------------------------------------- launch


def test_a_spot_launch_creates_a_nic_and_a_spot_vm_with_tags_custom_data_and_zone(arm, ca_file):
    inst = provider(arm, ca_file).launch(spec(), "tok-1")
    name = vm_name("tok-1")
    assert inst.instance_id == name
    assert inst.state is InstanceState.RUNNING
    assert inst.offer == OfferKey(Cloud.AZURE, "eastus", "1", "Standard_NC6s_v3", Market.SPOT)
    assert inst.tags == {"costopt:job": "job-1", "costopt:epoch": "3", "costopt:token": "tok-1"}
    assert inst.launched_at is not None
    [(put_name, body)] = arm.puts
    props = body["properties"]
    assert put_name == name
    assert (props["priority"], props["evictionPolicy"], props["billingProfile"]) == ("Spot", "Delete", {"maxPrice": -1})
    assert props["hardwareProfile"] == {"vmSize": "Standard_NC6s_v3"}
    assert body["zones"] == ["1"] and body["location"] == "eastus"
    assert body["tags"]["costopt:token"] == "tok-1"
    assert props["storageProfile"]["imageReference"] == {
        "publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest"
    }  # fmt: skip
    nic_ref = props["networkProfile"]["networkInterfaces"][0]
    assert nic_ref["id"].endswith(f"/networkInterfaces/{nic_name(name)}")
    assert arm.nics[nic_name(name)]["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"] == SUBNET
    assert props["osProfile"]["linuxConfiguration"]["disablePasswordAuthentication"] is True


def test_custom_data_exports_the_env_quoted_and_execs_the_command(arm, ca_file):
    provider(arm, ca_file).launch(spec(), "tok-1")
    script = base64.b64decode(arm.puts[0][1]["properties"]["osProfile"]["customData"]).decode()
    assert script.startswith("#!/bin/bash\n")
    assert "export COSTOPT_CHECKPOINT_URI='az://ckpt/job 1; rm -rf /'" in script
    assert "export COSTOPT_EPOCH=3" in script
    last = script.strip().splitlines()[-1]
    assert shlex.split(last) == ["exec", "python", "train.py", "--name", "it's a $(test)"]


def test_an_on_demand_offer_launches_a_regular_vm_without_spot_fields(arm, ca_file):
    inst = provider(arm, ca_file).launch(spec(Market.ON_DEMAND, zone=""), "tok-od")
    props = arm.puts[0][1]["properties"]
    assert props["priority"] == "Regular"
    assert "evictionPolicy" not in props and "billingProfile" not in props
    assert "zones" not in arm.puts[0][1]
    assert inst.offer.market is Market.ON_DEMAND and inst.offer.zone == ""


def test_the_same_token_twice_gives_one_vm_and_one_create(arm, ca_file):
    prov = provider(arm, ca_file)
    first = prov.launch(spec(), "tok-1")
    again = provider(arm, ca_file).launch(spec(), "tok-1")  # a fresh process, e.g. after a crash
    assert again.instance_id == first.instance_id
    assert len(arm.vms) == 1 and len(arm.puts) == 1
    other = prov.launch(spec(), "tok-2")
    assert other.instance_id != first.instance_id and len(arm.vms) == 2


def test_a_bad_spec_creates_nothing(arm, ca_file):
    bad = LaunchSpec(offer=spec().offer, command=(), env={})
    with pytest.raises(ValueError, match="command is empty"):
        provider(arm, ca_file).launch(bad, "tok-1")
    with pytest.raises(ValueError, match=r"azure|aws"):
        provider(arm, ca_file).launch(
            LaunchSpec(offer=OfferKey(Cloud.AWS, "us-east-1", "", "g5.xlarge", Market.SPOT), command=("x",)), "t"
        )
    assert arm.nics == {} and arm.puts == []


# --------------------------------------------------------------------------- terminate, describe, list


def test_terminate_deletes_vm_and_nic_and_twice_is_fine(arm, ca_file):
    prov = provider(arm, ca_file)
    inst = prov.launch(spec(), "tok-1")
    prov.terminate(inst.instance_id)
    assert arm.vms == {} and arm.nics == {}
    prov.terminate(inst.instance_id)  # VM answers 404, NIC 204: both fine
    assert prov.describe(inst.instance_id).state is InstanceState.TERMINATED
    assert ("DELETE", f"{RG_PREFIX}Microsoft.Network/networkInterfaces/{nic_name(inst.instance_id)}") in arm.requests


def test_terminate_refuses_a_vm_costopt_did_not_create(arm, ca_file):
    prov = provider(arm, ca_file)
    prov.launch(spec(Market.ON_DEMAND), "tok-1")
    arm.vms[vm_name("tok-1")]["tags"] = {"owner": "someone"}
    with pytest.raises(CloudError, match="refusing"):
        prov.terminate(vm_name("tok-1"))
    assert vm_name("tok-1") in arm.vms


def test_describe_reads_the_instance_view(arm, ca_file):
    prov = provider(arm, ca_file)
    name = prov.launch(spec(Market.ON_DEMAND), "tok-1").instance_id
    arm.vms[name]["_power"] = "PowerState/deallocated"
    assert prov.describe(name).state is InstanceState.STOPPING  # a regular VM: stopped, not preempted
    arm.vms[name]["_power"] = "PowerState/starting"
    assert prov.describe(name).state is InstanceState.PENDING
    with pytest.raises(NotFoundError):
        prov.describe("costopt-never-seen")


def test_list_returns_only_costopt_vms_with_the_tags_asked(arm, ca_file):
    prov = provider(arm, ca_file)
    a = prov.launch(spec(), "tok-a")
    b = prov.launch(spec(tags={"costopt:epoch": "4"}), "tok-b")
    arm.vms["someone-elses"] = copy.deepcopy(arm.vms[a.instance_id])
    arm.vms["someone-elses"]["tags"] = {"costopt:job": "job-1"}
    assert {i.instance_id for i in prov.list({})} == {a.instance_id, b.instance_id}
    assert [i.instance_id for i in prov.list({"costopt:epoch": "4"})] == [b.instance_id]
    assert prov.list({"costopt:job": "other"}) == []


# --------------------------------------------------------------------------- evictions


def test_a_deallocated_spot_vm_is_preempted_and_reported_once(arm, ca_file):
    prov = provider(arm, ca_file)
    name = prov.launch(spec(), "tok-1").instance_id
    assert prov.interruptions(NOW) == []
    arm.evict(name, deallocate=True)
    assert prov.describe(name).state is InstanceState.PREEMPTED
    [seen] = prov.interruptions(NOW - timedelta(hours=1))
    assert (seen.instance_id, seen.kind, seen.noticed_at) == (name, "preempted", NOW)
    assert prov.interruptions(NOW) == []


def test_a_spot_vm_that_vanished_is_preempted_but_one_costopt_deleted_is_not(arm, ca_file):
    prov = provider(arm, ca_file)
    evicted = prov.launch(spec(), "tok-1").instance_id
    deleted = prov.launch(spec(), "tok-2").instance_id
    prov.terminate(deleted)
    arm.evict(evicted, deallocate=False)
    assert [(i.instance_id, i.kind) for i in prov.interruptions(NOW)] == [(evicted, "preempted")]
    assert prov.describe(evicted).state is InstanceState.PREEMPTED
    assert prov.describe(deleted).state is InstanceState.TERMINATED


def test_scheduled_events_preempt_becomes_a_notice_with_the_not_before_deadline(arm, ca_file):
    doc = load("provider_scheduled_events.json")
    doc["Events"][0]["Resources"] = [vm_name("tok-1")]
    prov = provider(arm, ca_file, scheduled_events=lambda: json.dumps(doc))
    [notice] = prov.interruptions(NOW - timedelta(minutes=1))
    assert (notice.instance_id, notice.kind) == (vm_name("tok-1"), "notice")
    assert notice.deadline == NOW + timedelta(seconds=30)
    assert prov.interruptions(NOW) == []  # the same event is not reported twice


def test_parse_scheduled_events_keeps_only_preempt_and_defaults_the_deadline_to_30s():
    doc = load("provider_scheduled_events.json")
    doc["Events"][0]["NotBefore"] = ""
    [n] = parse_scheduled_events(doc, noticed_at=NOW)
    assert n.deadline == NOW + timedelta(seconds=30)
    assert parse_scheduled_events({"DocumentIncarnation": 1, "Events": []}) == []
    with pytest.raises(BadRecord):
        parse_scheduled_events("not json")
    with pytest.raises(BadRecord):
        parse_scheduled_events({"DocumentIncarnation": 1})


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("fixture", "error"),
    [
        ("SkuNotAvailable", CapacityError),
        ("QuotaOperationNotAllowed", QuotaError),
        ("QuotaExceeded", QuotaError),
        ("AuthorizationFailed", AuthError),
        ("OperationNotAllowed", CloudError),
    ],
)
def test_synchronous_arm_errors_are_translated(arm, ca_file, fixture, error):
    arm.fail_put = load("provider_errors.json")[fixture]
    with pytest.raises(error, match=fixture.replace("Quota", "").replace("Operation", "") or ".") as info:
        provider(arm, ca_file).launch(spec(), "tok-1")
    assert type(info.value) is error


@pytest.mark.parametrize(
    "fixture",
    ["AllocationFailedOperation", "ZonalAllocationFailedOperation", "OverconstrainedAllocationRequestOperation"],
)
def test_allocation_failures_of_the_long_running_operation_are_capacity_errors(arm, ca_file, fixture):
    arm.fail_operation = load("provider_errors.json")[fixture]
    with pytest.raises(CapacityError, match=fixture.removesuffix("Operation")):
        provider(arm, ca_file).launch(spec(), "tok-1")


def test_an_unknown_resource_group_is_not_found(arm, ca_file):
    prov = provider(arm, ca_file)
    prov.resource_group = "other-rg"
    with pytest.raises(NotFoundError, match="ResourceGroupNotFound"):
        prov.list({})


def test_refused_credentials_are_auth_errors(arm, ca_file):
    with pytest.raises(AuthError, match="az login"):
        provider(arm, ca_file, credential=RefusingCredential()).list({})
    assert arm.requests == []


def test_construction_needs_a_subnet_and_a_valid_image():
    with pytest.raises(ValueError, match="subnet"):
        AzureProvider(SUBSCRIPTION, RG, subnet_id="", image=IMAGE, ssh_public_key="k")
    with pytest.raises(ValueError, match="URN"):
        AzureProvider(SUBSCRIPTION, RG, subnet_id=SUBNET, image="ubuntu", ssh_public_key="k")


def test_the_real_pollers_follow_the_long_running_operation_headers(arm, ca_file):
    prov = provider(arm, ca_file)
    name = prov.launch(spec(), "tok-1").instance_id
    polls = [p for m, p in arm.requests if m == "GET" and p.startswith("/operations/")]
    assert len(polls) == 4  # NIC and VM: InProgress, then Succeeded (Azure-AsyncOperation)
    prov.terminate(name)
    results = [p for m, p in arm.requests if m == "GET" and p.endswith("/result")]
    assert len(results) == 4  # VM and NIC deletes: 202, then 204 (Location)


def test_a_token_the_server_refuses_is_an_auth_error(arm, ca_file):
    class WrongToken(FakeCredential):
        def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            return AccessToken("stale", int(time.time()) + 3600)

    with pytest.raises(AuthError, match="AuthenticationFailed"):
        provider(arm, ca_file, credential=WrongToken()).describe("costopt-x")


def test_imds_fetcher_sends_the_metadata_header_and_feeds_the_parser():
    doc = load("provider_scheduled_events.json")
    seen: list[str | None] = []

    class Imds(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Metadata"))
            body = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Imds)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metadata/scheduledevents?api-version=2020-07-01"
        [notice] = parse_scheduled_events(imds_scheduled_events(url)(), noticed_at=NOW)
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["true"]
    assert notice.deadline == datetime(2026, 11, 29, 10, 0, 30, tzinfo=UTC)
