"""The Azure provider through the real azure-mgmt-compute/-network clients against the local ARM fake over
TLS of ``azure_fake.py`` (fixtures ``arm`` and ``ca_file`` in conftest.py)."""

from __future__ import annotations

import base64
import copy
import json
import shlex
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from azure.core.credentials import AccessToken

from costopt.cloud import (
    AuthError,
    CapacityError,
    CloudError,
    InstanceState,
    LaunchSpec,
    NotFoundError,
    ProviderConfigError,
    QuotaError,
)
from costopt.domain import Cloud, Market, OfferKey
from costopt.errors import BadRecord
from costopt.settings import Settings
from providers.azure import (
    DEFAULT_IMAGE,
    AzureProvider,
    imds_scheduled_events,
    nic_name,
    parse_scheduled_events,
    read_ssh_public_key,
    vm_name,
)
from tests.net_support import LoopbackServer
from tests.providers.azure_fake import (
    IMAGE,
    NOW,
    RG,
    RG_PREFIX,
    SSH_KEY,
    SUBNET,
    SUBSCRIPTION,
    FakeArm,
    FakeCredential,
    RefusingCredential,
    load,
    make_provider,
)


def provider(arm: FakeArm, ca_file: str, **kw: Any) -> AzureProvider:
    return make_provider(arm, ca_file, clock=lambda: NOW, **kw)


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
    assert prov.describe(name).state is InstanceState.STOPPED  # a regular VM: stopped, not preempted
    assert [i.state for i in prov.list({})] == [InstanceState.STOPPED]  # still exists: still listed
    arm.vms[name]["_power"] = "PowerState/deallocating"
    assert prov.describe(name).state is InstanceState.STOPPING
    arm.vms[name]["_power"] = "PowerState/stopped"
    assert prov.describe(name).state is InstanceState.STOPPED
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


def azure_settings(arm: FakeArm, **kw: Any) -> Settings:
    values: dict[str, Any] = {
        "azure_subscription_id": SUBSCRIPTION,
        "azure_resource_group": RG,
        "azure_subnet_ids": {"eastus": SUBNET},
        "azure_ssh_public_key": SSH_KEY,
        "azure_arm_endpoint": arm.url,
    }
    values.update(kw)
    return Settings(**values)


def test_from_settings_builds_the_provider_and_launches_through_the_arm_endpoint(arm: FakeArm, ca_file: str) -> None:
    settings = azure_settings(arm, azure_admin_username="trainer")
    kw = {"connection_verify": ca_file, "retry_total": 0, "polling_interval": 0}
    prov = AzureProvider.from_settings(settings, credential=FakeCredential(), client_kwargs=kw)
    assert (prov.subscription_id, prov.resource_group, prov.image) == (SUBSCRIPTION, RG, DEFAULT_IMAGE)
    assert prov.launch(spec(), "tok-settings").state is InstanceState.RUNNING
    body = arm.puts[0][1]["properties"]
    assert body["osProfile"]["adminUsername"] == "trainer"
    assert body["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"] == SSH_KEY
    assert body["storageProfile"]["imageReference"]["offer"] == "ubuntu-hpc"
    nic = arm.nics[nic_name(vm_name("tok-settings"))]
    assert nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"] == SUBNET
    other_region = LaunchSpec(OfferKey(Cloud.AZURE, "westeurope", "", "Standard_NC6s_v3", Market.SPOT), ("x",))
    with pytest.raises(ProviderConfigError, match="COSTOPT_AZURE_SUBNET_IDS"):
        prov.launch(other_region, "tok-westeurope")
    assert len(arm.puts) == 1


@pytest.mark.parametrize(
    ("missing", "variable"),
    [
        ("azure_subscription_id", "COSTOPT_AZURE_SUBSCRIPTION_ID"),
        ("azure_resource_group", "COSTOPT_AZURE_RESOURCE_GROUP"),
        ("azure_subnet_ids", "COSTOPT_AZURE_SUBNET_IDS"),
        ("azure_ssh_public_key", "COSTOPT_AZURE_SSH_PUBLIC_KEY"),
    ],
)
def test_from_settings_names_the_missing_variable(arm: FakeArm, missing: str, variable: str) -> None:
    empty: Any = {} if missing == "azure_subnet_ids" else None
    with pytest.raises(ProviderConfigError, match=variable):
        AzureProvider.from_settings(azure_settings(arm, **{missing: empty}), credential=FakeCredential())


def test_the_ssh_key_is_the_key_itself_or_a_pub_file(tmp_path: Path) -> None:
    pub = tmp_path / "id_ed25519.pub"
    pub.write_text(SSH_KEY + "\n")
    assert read_ssh_public_key(SSH_KEY) == SSH_KEY
    assert read_ssh_public_key(str(pub)) == SSH_KEY
    private = tmp_path / "id_ed25519"
    private.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nxx\n-----END OPENSSH PRIVATE KEY-----\n")
    with pytest.raises(ProviderConfigError, match="not the private key"):
        read_ssh_public_key(str(private))
    with pytest.raises(ProviderConfigError, match="neither an SSH public key nor a readable file"):
        read_ssh_public_key(str(tmp_path / "missing.pub"))


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

    with LoopbackServer(Imds) as server:
        url = f"{server.url}/metadata/scheduledevents?api-version=2020-07-01"
        [notice] = parse_scheduled_events(imds_scheduled_events(url)(), noticed_at=NOW)
    assert seen == ["true"]
    assert notice.deadline == datetime(2026, 11, 29, 10, 0, 30, tzinfo=UTC)
