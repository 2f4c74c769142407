"""GCP provider through the real google-cloud-compute REST clients (InstancesClient, ZoneOperationsClient,
ZonesClient) against the stateful loopback fake of the Compute Engine v1 REST API in ``gcp_fake.py``."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

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
    ProviderConfigError,
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
from tests.providers.gcp_fake import PROJECT, T0, ZONE, ZONE_B, FakeCompute


@pytest.fixture
def fake(fake_compute: FakeCompute) -> FakeCompute:
    return fake_compute


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
    settings = Settings(
        gcp_project=PROJECT,
        gcp_compute_endpoint=fake.url,
        gcp_zones=[ZONE],
        gcp_image="projects/my-images/global/images/family/trainer",
        gcp_network="global/networks/ml",
        gcp_subnetwork="regions/us-central1/subnetworks/ml-a",
        gcp_service_account_email="trainer@costopt-demo.iam.gserviceaccount.com",
        gcp_external_ip=False,
    )
    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    provider = GcpProvider.from_settings(settings, credentials=credentials, poll_interval_s=0.01)
    assert (provider.project, provider.zones) == (PROJECT, (ZONE,))
    assert provider.launch(spec(), "tok-settings").state is InstanceState.RUNNING
    body = fake.inserts[0]
    assert body["disks"][0]["initializeParams"]["sourceImage"] == "projects/my-images/global/images/family/trainer"
    assert body["networkInterfaces"] == [
        {"network": "global/networks/ml", "subnetwork": "regions/us-central1/subnetworks/ml-a"}
    ]  # no accessConfigs: no external IP
    assert body["serviceAccounts"][0]["email"] == "trainer@costopt-demo.iam.gserviceaccount.com"
    with pytest.raises(ProviderConfigError, match="COSTOPT_GCP_PROJECT"):
        GcpProvider.from_settings(Settings(gcp_project=None))


def test_without_zones_the_zones_of_the_regions_are_read_once_from_the_zones_api(fake: FakeCompute) -> None:
    settings = Settings(gcp_project=PROJECT, gcp_compute_endpoint=fake.url, gcp_regions=["us-central1"])
    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    provider = GcpProvider.from_settings(settings, credentials=credentials, poll_interval_s=0.01)
    assert provider.zones == () and provider.regions == ("us-central1",)

    inst = provider.launch(spec(zone=""), "tok-regional")  # a regional offer: the region's first zone that is UP
    assert inst.offer.zone == ZONE
    provider.interruptions(T0)
    polled = {p.split("/zones/")[1].split("/")[0] for m, p, _ in fake.requests if p.endswith("/operations")}
    assert polled == {"us-central1-a", "us-central1-b", "us-central1-c"}  # not the DOWN one, not europe
    assert fake.zone_lists == 1
    with pytest.raises(ProviderConfigError, match="COSTOPT_GCP_REGIONS"):
        provider.launch(spec(zone="europe-west4-a"), "tok-elsewhere")


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
    with pytest.raises(ProviderConfigError, match="no watched zone"):
        provider.launch(LaunchSpec(OfferKey(Cloud.GCP, "asia-east1", "", "g2-standard-4", Market.SPOT)), "t")
    with pytest.raises(ProviderConfigError, match="COSTOPT_GCP_ZONES"):
        provider.launch(spec(zone="us-central1-c"), "t")
    assert fake.inserts == [fake.inserts[0]]


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

    fake.instances[(ZONE, instance_name("tok-a"))]["status"] = "TERMINATED"  # GCP's word for stopped
    listed = {i.instance_id: i.state for i in provider.list({})}
    assert listed == {a.instance_id: InstanceState.STOPPED, b.instance_id: InstanceState.RUNNING}
    provider.terminate(a.instance_id)  # deleted: it no longer exists
    assert [i.instance_id for i in provider.list({})] == [b.instance_id]


def test_list_without_zones_uses_the_aggregated_list(fake: FakeCompute) -> None:
    make_provider(fake, zones=[ZONE_B]).launch(spec(zone=ZONE_B), "tok-agg")
    provider = make_provider(fake, zones=[])
    found = provider.list({"costopt:epoch": "3"})
    assert [i.offer.zone for i in found] == [ZONE_B]
    assert any(p.endswith("/aggregated/instances") for _, p, _ in fake.requests)
    assert make_provider(fake, zones=[], regions=["europe-west4"]).list({}) == []  # other regions left out
    assert fake.zone_lists == 0  # listing needs no zone discovery


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
        ("REPAIRING", False, InstanceState.PENDING),
        ("STOPPING", False, InstanceState.STOPPING),
        ("SUSPENDING", False, InstanceState.STOPPING),
        ("PENDING_STOP", False, InstanceState.STOPPING),
        ("DEPROVISIONING", False, InstanceState.STOPPING),
        ("STOPPING", True, InstanceState.PREEMPTED),
        ("TERMINATED", False, InstanceState.STOPPED),  # GCP's TERMINATED is a stopped VM, not a deleted one
        ("STOPPED", False, InstanceState.STOPPED),
        ("SUSPENDED", False, InstanceState.STOPPED),
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


def test_spot_vm_stopped_by_the_user_is_stopped_and_still_listed(fake: FakeCompute, provider: GcpProvider) -> None:
    inst = provider.launch(spec(), "tok-user")
    fake.instances[(ZONE, inst.instance_id.split("/")[1])]["status"] = "TERMINATED"
    stopped = provider.describe(inst.instance_id)
    assert (stopped.state, stopped.terminated_at) == (InstanceState.STOPPED, None)
    assert [i.state for i in provider.list({"costopt:job": "job-1"})] == [InstanceState.STOPPED]
    provider.terminate(inst.instance_id)  # a stopped VM can be deleted
    with pytest.raises(NotFoundError):
        provider.describe(inst.instance_id)


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
