"""AWS provider: launch, idempotency, terminate, describe/list, states and the EventBridge-to-SQS
interruption path against moto's server on loopback; botocore's Stubber for the error codes and spot
request statuses moto cannot produce; a scripted loopback proxy for throttling."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from costopt.aws_clients import aws_client_config
from costopt.cloud import (
    ENDED_RETENTION,
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
from costopt.errors import BadRecord
from costopt.settings import Settings
from providers.aws import (
    DEFAULT_IMAGE,
    INTERRUPTION_DETAIL_TYPE,
    INTERRUPTION_EVENT_PATTERN,
    SPOT_NOTICE,
    TOKEN_TAG,
    AwsProvider,
    map_state,
    parse_interruption_event,
    setup_interruption_queue,
    user_data_script,
)
from tests.aws_support import MOTO_ACCOUNT, REGION, fake_session
from tests.net_support import LoopbackServer

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "aws"


class Recorder:
    """A ``(service, region)`` client factory on moto that records every API call's parameters."""

    def __init__(self, url: str, max_attempts: int = 2) -> None:
        self.url = url
        self.max_attempts = max_attempts
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, service: str, region: str) -> Any:
        client = fake_session().client(
            service, region_name=region, endpoint_url=self.url, config=aws_client_config(max_attempts=self.max_attempts)
        )
        client.meta.events.register("provide-client-params.*.*", self._record)
        return client

    def _record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.calls.append((model.name, copy.deepcopy(params)))

    def named(self, operation: str) -> list[dict[str, Any]]:
        return [params for name, params in self.calls if name == operation]


@pytest.fixture
def recorder(moto_url: str) -> Recorder:
    return Recorder(moto_url)


@pytest.fixture
def provider(recorder: Recorder, dl_ami: str) -> AwsProvider:
    return AwsProvider([REGION], ami_ids={REGION: dl_ami}, client_factory=recorder, queue_wait_seconds=0)


@pytest.fixture
def ec2(moto_url: str) -> Any:
    """A plain EC2 client on moto, to look behind the provider's back."""
    return fake_session().client("ec2", endpoint_url=moto_url)


@pytest.fixture
def job() -> str:
    """A job id of this test alone (moto's state is shared by the module)."""
    return f"job-{uuid.uuid4().hex[:10]}"


def spec_for(
    job: str, *, market: Market = Market.ON_DEMAND, zone: str = "us-east-1b", epoch: int = 1, **kw: Any
) -> LaunchSpec:
    defaults: dict[str, Any] = {
        "command": ("python3", "train.py", "--steps", "1000"),
        "env": {
            "COSTOPT_JOB_ID": job,
            "COSTOPT_CHECKPOINT_URI": f"s3://ckpt/{job}",
            "COSTOPT_EPOCH": str(epoch),
        },
        "tags": {"costopt:job": job, "costopt:epoch": str(epoch)},
    }
    defaults.update(kw)
    return LaunchSpec(offer=OfferKey(Cloud.AWS, REGION, zone, "g5.xlarge", market), **defaults)


def raw_instances(ec2: Any, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
    pages = ec2.get_paginator("describe_instances").paginate(Filters=filters)
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


def instances_tagged(ec2: Any, key: str, value: str) -> list[dict[str, Any]]:
    return raw_instances(ec2, [{"Name": f"tag:{key}", "Values": [value]}])


def aws_takes_back(instance_id: str, at: str = "2026-03-02 14:07:30") -> None:
    """What AWS does at a spot interruption, done inside moto's in-process backend (moto's API cannot):
    the instance terminates with state reason ``Server.SpotInstanceTermination``."""
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    instance = ec2_backends[MOTO_ACCOUNT][REGION].get_instance(instance_id)
    instance.terminate()
    instance.state_reason = StateReason(
        "Server.SpotInstanceTermination: Spot instance termination", "Server.SpotInstanceTermination"
    )
    instance._reason = f"Service initiated ({at} GMT)"


# --------------------------------------------------------------------------- launch


def test_the_provider_is_a_cloud_provider_named_aws(provider: AwsProvider) -> None:
    as_protocol: CloudProvider = provider
    assert as_protocol.name == "aws"


def test_launch_on_demand_runs_the_configured_ami_in_the_offer_zone_with_job_tags_and_no_market_options(
    provider: AwsProvider, recorder: Recorder, ec2: Any, dl_ami: str, job: str
) -> None:
    instance = provider.launch(spec_for(job), "tok-" + job)

    assert instance.state is InstanceState.PENDING
    assert instance.offer == OfferKey(Cloud.AWS, REGION, "us-east-1b", "g5.xlarge", Market.ON_DEMAND)
    assert instance.tags == {"costopt:job": job, "costopt:epoch": "1", TOKEN_TAG: "tok-" + job}
    assert instance.launched_at is not None and instance.launched_at.tzinfo is not None
    (sent,) = recorder.named("RunInstances")
    assert "InstanceMarketOptions" not in sent
    assert sent["ClientToken"] == "tok-" + job
    assert sent["Placement"] == {"AvailabilityZone": "us-east-1b"}
    assert (sent["MinCount"], sent["MaxCount"], sent["InstanceInitiatedShutdownBehavior"]) == (1, 1, "terminate")
    assert {s["ResourceType"] for s in sent["TagSpecifications"]} == {"instance", "volume"}
    (raw,) = instances_tagged(ec2, TOKEN_TAG, "tok-" + job)
    assert raw["ImageId"] == dl_ami
    assert raw["Placement"]["AvailabilityZone"] == "us-east-1b"
    assert "InstanceLifecycle" not in raw
    volumes = ec2.describe_volumes(Filters=[{"Name": "tag:costopt:job", "Values": [job]}])["Volumes"]
    assert len(volumes) == 1, "the root volume carries the job's tags too"


def test_launch_spot_asks_for_a_one_time_request_terminated_on_interruption(
    provider: AwsProvider, recorder: Recorder, ec2: Any, job: str
) -> None:
    instance = provider.launch(spec_for(job, market=Market.SPOT, zone="us-east-1c"), "tok-" + job)

    (sent,) = recorder.named("RunInstances")
    assert sent["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
    }
    assert instance.offer.market is Market.SPOT and instance.offer.zone == "us-east-1c"
    (raw,) = instances_tagged(ec2, "costopt:job", job)
    assert raw["InstanceLifecycle"] == "spot"
    assert provider.describe(instance.instance_id).offer.market is Market.SPOT


def test_a_regional_offer_sends_no_placement_and_reports_the_zone_ec2_chose(
    provider: AwsProvider, recorder: Recorder, job: str
) -> None:
    instance = provider.launch(spec_for(job, zone=""), "tok-" + job)

    (sent,) = recorder.named("RunInstances")
    assert "Placement" not in sent
    assert instance.offer.zone.startswith(REGION)


def test_user_data_exports_the_env_safely_quoted_and_execs_the_command(
    provider: AwsProvider, ec2: Any, job: str, tmp_path: Path
) -> None:
    """The user data EC2 stores, decoded and run here by bash: every value comes back byte for byte and
    nothing in a value is executed."""
    hostile = {
        "COSTOPT_JOB_ID": job,
        "QUOTES": 'it\'s "quoted" `here`',
        "SUBSHELL": f"$(touch {tmp_path / 'pwned'}); echo $HOME",
        "NEWLINE": "line one\nline two",
        "SPACES": "  a  b  ",
        "EMPTY": "",
    }
    printer = "import json, os, sys; print(json.dumps({k: os.environ[k] for k in sys.argv[1:]}))"
    spec = spec_for(job, env=hostile, command=(sys.executable, "-c", printer, *hostile))
    instance = provider.launch(spec, "tok-" + job)

    attr = ec2.describe_instance_attribute(InstanceId=instance.instance_id, Attribute="userData")
    script = base64.b64decode(attr["UserData"]["Value"]).decode()
    assert script == user_data_script(spec)
    assert script.startswith("#!/bin/bash\n")
    assert "export SUBSHELL='$(touch " in script  # single-quoted: bash will not expand it
    ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, check=True)
    assert json.loads(ran.stdout) == hostile
    assert not (tmp_path / "pwned").exists()


def test_the_image_is_the_specs_then_the_regions_then_the_dlami_ssm_reference(
    recorder: Recorder, dl_ami: str, job: str
) -> None:
    plain = AwsProvider([REGION], client_factory=recorder, queue_wait_seconds=0)
    plain.launch(spec_for(job), "tok-a-" + job)
    pinned = AwsProvider([REGION], ami_ids={REGION: dl_ami}, client_factory=recorder, queue_wait_seconds=0)
    pinned.launch(spec_for(job), "tok-b-" + job)
    pinned.launch(spec_for(job, image="ami-0123456789abcdef0"), "tok-c-" + job)

    images = [params["ImageId"] for params in recorder.named("RunInstances")]
    assert images == [DEFAULT_IMAGE, dl_ami, "ami-0123456789abcdef0"]
    assert DEFAULT_IMAGE.startswith("resolve:ssm:/aws/service/deeplearning/ami/x86_64/")


# --------------------------------------------------------------------------- idempotency


def test_moto_does_not_enforce_client_token_so_the_provider_must(ec2: Any, dl_ami: str, job: str) -> None:
    """Why the provider looks the token up itself: moto launches twice for one ClientToken."""
    for _ in range(2):
        ec2.run_instances(
            ImageId=dl_ami, InstanceType="g5.xlarge", MinCount=1, MaxCount=1, ClientToken="raw-" + job,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "probe", "Value": job}]}],
        )  # fmt: skip
    assert len(instances_tagged(ec2, "probe", job)) == 2


def test_a_second_launch_with_the_same_token_creates_no_second_instance(
    provider: AwsProvider, recorder: Recorder, ec2: Any, job: str
) -> None:
    token = "tok-" + job
    first = provider.launch(spec_for(job, market=Market.SPOT), token)
    again = provider.launch(spec_for(job, market=Market.SPOT), token)
    # A fresh provider (a restarted migrator) finds it by tag as well.
    restarted = AwsProvider([REGION], client_factory=recorder, queue_wait_seconds=0)
    third = restarted.launch(spec_for(job, market=Market.SPOT), token)

    assert first.instance_id == again.instance_id == third.instance_id
    assert len(recorder.named("RunInstances")) == 1
    assert len(instances_tagged(ec2, TOKEN_TAG, token)) == 1
    assert len(instances_tagged(ec2, "costopt:job", job)) == 1


def test_a_token_whose_instance_is_gone_returns_that_instance_instead_of_launching_anew(
    provider: AwsProvider, recorder: Recorder, ec2: Any, job: str
) -> None:
    """As EC2's own ClientToken does: a token launches at most once, even after termination."""
    token = "tok-" + job
    first = provider.launch(spec_for(job), token)
    provider.terminate(first.instance_id)

    again = provider.launch(spec_for(job), token)

    assert again.instance_id == first.instance_id
    assert again.state is InstanceState.TERMINATED
    assert len(recorder.named("RunInstances")) == 1
    assert len(instances_tagged(ec2, TOKEN_TAG, token)) == 1


def test_tokens_are_matched_exactly_not_as_ec2_filter_wildcards(
    provider: AwsProvider, recorder: Recorder, job: str
) -> None:
    provider.launch(spec_for(job), f"tok-{job}-a")
    provider.launch(spec_for(job), f"tok-{job}-*")  # "*" would match the first one as a filter pattern

    assert len(recorder.named("RunInstances")) == 2


@pytest.mark.parametrize(
    ("token", "change", "why"),
    [
        ("x" * 65, {}, "1 to 64 ASCII"),
        ("", {}, "1 to 64 ASCII"),
        ("tökén", {}, "1 to 64 ASCII"),
        ("tok", {"tags": {"aws:cloudformation:stack-name": "x"}}, "reserved by AWS"),
        ("tok", {"tags": {TOKEN_TAG: "another"}}, "differs from the idempotency token"),
        ("tok", {"command": ()}, "command is empty"),
        ("tok", {"env": {"NOT-A-NAME": "1"}}, "not a shell identifier"),
        ("tok", {"env": {"BIG": "x" * 20_000}}, "above EC2's limit"),
    ],
)
def test_a_bad_token_or_spec_is_refused_before_anything_is_sent(
    provider: AwsProvider, recorder: Recorder, job: str, token: str, change: dict[str, Any], why: str
) -> None:
    spec = replace(spec_for(job), **change)
    with pytest.raises(ValueError, match=why):
        provider.launch(spec, token)
    assert recorder.calls == []


def test_an_offer_of_another_cloud_is_refused(provider: AwsProvider, recorder: Recorder, job: str) -> None:
    gcp = OfferKey(Cloud.GCP, "us-central1", "us-central1-a", "a2-highgpu-1g", Market.SPOT)
    spec = replace(spec_for(job), offer=gcp)
    with pytest.raises(ValueError, match="gcp"):
        provider.launch(spec, "tok")
    assert recorder.calls == []


# --------------------------------------------------------------------------- terminate, describe, list


def test_terminate_twice_is_fine_and_the_instance_ends_terminated(
    provider: AwsProvider, recorder: Recorder, job: str
) -> None:
    instance = provider.launch(spec_for(job), "tok-" + job)

    provider.terminate(instance.instance_id)
    provider.terminate(instance.instance_id)

    assert len(recorder.named("TerminateInstances")) == 1, "a terminated instance is not terminated again"
    gone = provider.describe(instance.instance_id)
    assert gone.state is InstanceState.TERMINATED
    assert gone.terminated_at is not None and gone.terminated_at.tzinfo is not None


def test_terminating_an_unknown_instance_is_not_an_error(provider: AwsProvider, recorder: Recorder) -> None:
    provider.terminate("i-0123456789abcdef0")
    assert recorder.named("TerminateInstances") == []


def test_terminate_refuses_an_instance_costopt_did_not_launch(provider: AwsProvider, ec2: Any, dl_ami: str) -> None:
    theirs = ec2.run_instances(ImageId=dl_ami, InstanceType="m5.large", MinCount=1, MaxCount=1)["Instances"][0]

    with pytest.raises(CloudError, match="refusing to terminate"):
        provider.terminate(theirs["InstanceId"])

    (raw,) = raw_instances(ec2, [{"Name": "instance-id", "Values": [theirs["InstanceId"]]}])
    assert raw["State"]["Name"] in ("pending", "running")


def test_describing_an_unknown_instance_raises_not_found(provider: AwsProvider) -> None:
    with pytest.raises(NotFoundError, match="i-0123456789abcdef0 not found in us-east-1"):
        provider.describe("i-0123456789abcdef0")


def test_describe_follows_the_instance_from_pending_to_running(provider: AwsProvider, job: str) -> None:
    instance = provider.launch(spec_for(job), "tok-" + job)
    now = provider.describe(instance.instance_id)
    assert now.state is InstanceState.RUNNING  # moto starts an instance at its first describe
    assert (now.instance_id, now.offer, now.tags) == (instance.instance_id, instance.offer, instance.tags)


def test_list_matches_every_tag_exactly_and_keeps_terminated_instances_for_the_retention_only(
    recorder: Recorder, ec2: Any, dl_ami: str, job: str
) -> None:
    now = [datetime.now(UTC)]
    provider = AwsProvider(
        [REGION], ami_ids={REGION: dl_ami}, client_factory=recorder, queue_wait_seconds=0, clock=lambda: now[0]
    )
    other = job + "-other"
    epoch1 = provider.launch(spec_for(job, epoch=1), f"tok-{job}-1")
    epoch2 = provider.launch(spec_for(job, epoch=2), f"tok-{job}-2")
    provider.launch(spec_for(other), f"tok-{other}")
    # Someone else's instance with the same job tag: never costopt's to list.
    ec2.run_instances(
        ImageId=dl_ami, InstanceType="m5.large", MinCount=1, MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "costopt:job", "Value": job}]}],
    )  # fmt: skip

    def ids(tags: Mapping[str, str]) -> set[str]:
        return {i.instance_id for i in provider.list(tags)}

    assert ids({"costopt:job": job}) == {epoch1.instance_id, epoch2.instance_id}
    assert ids({"costopt:job": job, "costopt:epoch": "2"}) == {epoch2.instance_id}
    assert ids({"costopt:job": job[:-2] + "*"}) == set(), "tag values are not wildcards"
    provider.terminate(epoch1.instance_id)
    states = {i.instance_id: i.state for i in provider.list({"costopt:job": job})}
    assert states == {epoch1.instance_id: InstanceState.TERMINATED, epoch2.instance_id: InstanceState.RUNNING}
    now[0] += ENDED_RETENTION + timedelta(minutes=1)
    assert ids({"costopt:job": job}) == {epoch2.instance_id}, "terminated over an hour ago: no longer listed"
    assert all(TOKEN_TAG in i.tags for i in provider.list({}))


def test_a_stopped_instance_is_stopped_and_still_listed(provider: AwsProvider, ec2: Any, job: str) -> None:
    instance = provider.launch(spec_for(job), "tok-" + job)
    provider.describe(instance.instance_id)  # moto: pending -> running
    ec2.stop_instances(InstanceIds=[instance.instance_id])

    stopped = provider.describe(instance.instance_id)
    assert (stopped.state, stopped.terminated_at) == (InstanceState.STOPPED, None)
    assert [i.state for i in provider.list({"costopt:job": job})] == [InstanceState.STOPPED]
    provider.terminate(instance.instance_id)  # a stopped instance is terminated like any other
    assert provider.describe(instance.instance_id).state is InstanceState.TERMINATED


# --------------------------------------------------------------------------- state mapping


def _raw(state: str, reason: str = "", lifecycle: str | None = "spot", **extra: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "InstanceId": "i-0abc",
        "InstanceType": "p3.2xlarge",
        "State": {"Name": state},
        "StateReason": {"Code": reason, "Message": reason},
        "Placement": {"AvailabilityZone": "us-east-1a"},
        **extra,
    }
    if lifecycle:
        raw["InstanceLifecycle"] = lifecycle
    return raw


@pytest.mark.parametrize(
    ("raw", "request_status", "expected"),
    [
        (_raw("pending"), None, InstanceState.PENDING),
        (_raw("running"), None, InstanceState.RUNNING),
        (_raw("stopping", "Client.UserInitiatedShutdown"), None, InstanceState.STOPPING),
        (_raw("stopped", "Client.UserInitiatedShutdown", lifecycle=None), None, InstanceState.STOPPED),
        (_raw("stopped", "Client.UserInitiatedShutdown"), None, InstanceState.STOPPED),
        (_raw("shutting-down", "Client.UserInitiatedShutdown"), None, InstanceState.STOPPING),
        (_raw("terminated", "Client.UserInitiatedShutdown"), None, InstanceState.TERMINATED),
        (_raw("terminated", "Client.InstanceInitiatedShutdown", lifecycle=None), None, InstanceState.TERMINATED),
        (_raw("shutting-down", "Server.SpotInstanceTermination"), None, InstanceState.PREEMPTED),
        (_raw("terminated", "Server.SpotInstanceTermination"), None, InstanceState.PREEMPTED),
        (_raw("stopped", "Server.SpotInstanceShutdown"), None, InstanceState.PREEMPTED),
        (_raw("stopping", "Server.SpotInstanceShutdown"), None, InstanceState.PREEMPTED),
        (_raw("stopped"), "instance-stopped-no-capacity", InstanceState.PREEMPTED),
        (_raw("terminated"), "instance-terminated-by-price", InstanceState.PREEMPTED),
        (_raw("terminated"), "instance-terminated-no-capacity", InstanceState.PREEMPTED),
        (_raw("terminated"), "instance-terminated-by-user", InstanceState.TERMINATED),
        (_raw("running", "Server.SpotInstanceTermination"), None, InstanceState.RUNNING),
    ],
)
def test_ec2_states_map_to_instance_states_and_aws_reclaims_are_preempted(
    raw: dict[str, Any], request_status: str | None, expected: InstanceState
) -> None:
    assert map_state(raw, request_status) is expected


def test_an_unknown_ec2_state_is_an_error_not_a_guess() -> None:
    with pytest.raises(CloudError, match="unknown state 'hibernating'"):
        map_state(_raw("hibernating"))


def stubbed(service: str) -> tuple[Any, Stubber]:
    client = fake_session().client(service, region_name=REGION)
    stub = Stubber(client)
    stub.activate()
    return client, stub


def test_a_spot_request_status_decides_when_the_state_reason_does_not() -> None:
    ec2, stub = stubbed("ec2")
    gone = _raw(
        "terminated", SpotInstanceRequestId="sir-0abc", Tags=[{"Key": TOKEN_TAG, "Value": "t"}],
        LaunchTime=datetime(2026, 3, 2, 12, 0, tzinfo=UTC),
        StateTransitionReason="Service initiated (2026-03-02 14:07:30 GMT)",
    )  # fmt: skip
    stub.add_response("describe_instances", {"Reservations": [{"Instances": [gone]}]}, {"InstanceIds": ["i-0abc"]})
    stub.add_response(
        "describe_spot_instance_requests",
        {"SpotInstanceRequests": [{"InstanceId": "i-0abc", "Status": {"Code": "instance-terminated-no-capacity"}}]},
        {"SpotInstanceRequestIds": ["sir-0abc"]},
    )
    provider = AwsProvider([REGION], client_factory=lambda service, region: ec2)

    instance = provider.describe("i-0abc")

    stub.assert_no_pending_responses()
    assert instance.state is InstanceState.PREEMPTED
    assert instance.terminated_at == datetime(2026, 3, 2, 14, 7, 30, tzinfo=UTC)
    assert instance.offer == OfferKey(Cloud.AWS, REGION, "us-east-1a", "p3.2xlarge", Market.SPOT)


def test_an_unreadable_spot_request_leaves_the_state_reason_to_decide() -> None:
    ec2, stub = stubbed("ec2")
    gone = _raw("terminated", SpotInstanceRequestId="sir-0old", Tags=[{"Key": TOKEN_TAG, "Value": "t"}])
    stub.add_response("describe_instances", {"Reservations": [{"Instances": [gone]}]}, {"InstanceIds": ["i-0abc"]})
    stub.add_client_error("describe_spot_instance_requests", service_error_code="InvalidSpotInstanceRequestID.NotFound")

    instance = AwsProvider([REGION], client_factory=lambda service, region: ec2).describe("i-0abc")

    stub.assert_no_pending_responses()
    assert instance.state is InstanceState.TERMINATED


def test_a_spot_instance_aws_took_back_is_preempted_and_reported_by_interruptions(
    provider: AwsProvider, job: str
) -> None:
    taken = provider.launch(spec_for(job, market=Market.SPOT), f"tok-{job}-spot")
    mine = provider.launch(spec_for(job, market=Market.SPOT), f"tok-{job}-mine")
    aws_takes_back(taken.instance_id, at="2026-03-02 14:07:30")
    provider.terminate(mine.instance_id)  # terminated by costopt: not a preemption

    assert provider.describe(taken.instance_id).state is InstanceState.PREEMPTED
    assert provider.describe(mine.instance_id).state is InstanceState.TERMINATED
    seen = provider.interruptions(datetime(2026, 3, 2, 14, 0, tzinfo=UTC))
    preempted = [i for i in seen if i.instance_id in (taken.instance_id, mine.instance_id)]
    assert [(i.instance_id, i.kind, i.deadline) for i in preempted] == [(taken.instance_id, "preempted", None)]
    assert preempted[0].noticed_at == datetime(2026, 3, 2, 14, 7, 30, tzinfo=UTC)
    later = provider.interruptions(datetime(2026, 3, 2, 15, 0, tzinfo=UTC))
    assert taken.instance_id not in {i.instance_id for i in later}, "a preemption before `since` is not news"


# --------------------------------------------------------------------------- EventBridge to SQS


@pytest.fixture
def queue(moto_url: str) -> str:
    """The interruption path of the region, made by the operator helper (a queue of this test alone)."""
    made = setup_interruption_queue(
        REGION, session=fake_session(), endpoint_url=moto_url, queue_name=f"interruptions-{uuid.uuid4().hex[:8]}"
    )
    return made.queue_url


def queued(moto_url: str, queue_url: str) -> int:
    sqs = fake_session().client("sqs", endpoint_url=moto_url)
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attrs = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def reader(moto_url: str, queue_url: str, **kw: Any) -> AwsProvider:
    return AwsProvider(
        [REGION], session=fake_session(), endpoint_url=moto_url, interruption_queue_urls={REGION: queue_url},
        queue_wait_seconds=0, max_attempts=2, **kw,
    )  # fmt: skip


def notices(provider: AwsProvider, since: datetime) -> list[Any]:
    """The queue's notices (other tests of the module leave preempted instances in moto)."""
    return [i for i in provider.interruptions(since) if i.kind == "notice"]


def test_setup_makes_the_rule_the_queue_policy_and_the_target_and_can_run_again(moto_url: str) -> None:
    first = setup_interruption_queue(REGION, session=fake_session(), endpoint_url=moto_url, queue_name="setup-q")
    again = setup_interruption_queue(REGION, session=fake_session(), endpoint_url=moto_url, queue_name="setup-q")

    assert again == first
    events = fake_session().client("events", endpoint_url=moto_url)
    rule = events.describe_rule(Name="costopt-spot-interruptions")
    assert json.loads(rule["EventPattern"]) == INTERRUPTION_EVENT_PATTERN
    assert rule["State"] == "ENABLED"
    targets = events.list_targets_by_rule(Rule="costopt-spot-interruptions")["Targets"]
    assert [t["Arn"] for t in targets] == [first.queue_arn]
    sqs = fake_session().client("sqs", endpoint_url=moto_url)
    attrs = sqs.get_queue_attributes(QueueUrl=first.queue_url, AttributeNames=["All"])["Attributes"]
    (statement,) = json.loads(attrs["Policy"])["Statement"]
    assert statement["Principal"] == {"Service": "events.amazonaws.com"}
    assert statement["Action"] == "sqs:SendMessage"
    assert statement["Condition"] == {"ArnEquals": {"aws:SourceArn": first.rule_arn}}
    assert attrs["MessageRetentionPeriod"] == "3600"


def test_a_warning_routed_by_eventbridge_is_returned_with_a_two_minute_deadline_and_deleted_once_acknowledged(
    moto_url: str, queue: str
) -> None:
    """moto routes events.put_events through the helper's rule to the SQS target, as EventBridge does."""
    warned_at = datetime(2026, 3, 2, 14, 5, 30, tzinfo=UTC)
    answer = fake_session().client("events", endpoint_url=moto_url).put_events(
        Entries=[{
            "Source": "aws.ec2", "DetailType": INTERRUPTION_DETAIL_TYPE, "Time": warned_at,
            "Resources": [f"arn:aws:ec2:{REGION}b:instance/i-0feedface0000001"],
            "Detail": json.dumps({"instance-id": "i-0feedface0000001", "instance-action": "terminate"}),
        }]
    )  # fmt: skip
    assert answer["FailedEntryCount"] == 0
    assert queued(moto_url, queue) == 1

    provider = reader(moto_url, queue)
    (notice,) = notices(provider, warned_at - timedelta(minutes=10))

    assert (notice.instance_id, notice.kind, notice.noticed_at) == ("i-0feedface0000001", "notice", warned_at)
    assert notice.deadline == warned_at + timedelta(minutes=2) == warned_at + SPOT_NOTICE
    assert queued(moto_url, queue) == 1, "a notice stays queued (hidden) until acknowledged"
    assert notices(provider, warned_at - timedelta(minutes=10)) == []  # hidden while in flight
    provider.acknowledge([notice])
    assert queued(moto_url, queue) == 0, "an acknowledged notice is deleted"


def test_the_documented_event_json_sent_straight_to_sqs_is_read_the_same(moto_url: str, queue: str) -> None:
    body = (FIXTURES / "spot_interruption_warning.json").read_text().replace("INSTANCE_ID", "i-0feedface0000002")
    fake_session().client("sqs", endpoint_url=moto_url).send_message(QueueUrl=queue, MessageBody=body)

    provider = reader(moto_url, queue)
    (notice,) = notices(provider, datetime(2026, 3, 2, 14, 0, tzinfo=UTC))

    assert notice.instance_id == "i-0feedface0000002"
    assert notice.deadline == datetime(2026, 3, 2, 14, 7, 30, tzinfo=UTC)
    provider.acknowledge([notice])
    assert queued(moto_url, queue) == 0


def test_malformed_and_foreign_messages_are_logged_deleted_and_never_raise(
    moto_url: str, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    good = json.loads((FIXTURES / "spot_interruption_warning.json").read_text().replace("INSTANCE_ID", "i-0good"))
    bad_bodies = [
        "not json at all",
        "[1, 2, 3]",
        json.dumps({**good, "detail-type": "EC2 Instance Rebalance Recommendation"}),
        json.dumps({**good, "detail": {"instance-action": "terminate"}}),
        json.dumps({**good, "time": "yesterday"}),
        json.dumps({**good, "detail": "i-0good"}),
    ]
    sqs = fake_session().client("sqs", endpoint_url=moto_url)
    for body in [*bad_bodies, json.dumps(good)]:
        sqs.send_message(QueueUrl=queue, MessageBody=body)

    with caplog.at_level(logging.WARNING, logger="costopt.providers.aws"):
        read = notices(reader(moto_url, queue), datetime(2026, 3, 2, tzinfo=UTC))

    assert [n.instance_id for n in read] == ["i-0good"]
    assert queued(moto_url, queue) == 1, "the bad ones are deleted at once, the notice once acknowledged"
    dropped = [r for r in caplog.records if "dropping message" in r.getMessage()]
    assert len(dropped) == len(bad_bodies)


def test_a_notice_is_judged_by_its_deadline_so_a_late_delivery_is_kept_and_a_stale_one_dropped(
    moto_url: str, queue: str
) -> None:
    since = datetime(2026, 3, 2, 15, 0, tzinfo=UTC)
    template = (FIXTURES / "spot_interruption_warning.json").read_text()
    sqs = fake_session().client("sqs", endpoint_url=moto_url)
    for instance_id, at in (("i-0late", since - timedelta(seconds=30)), ("i-0stale", since - timedelta(minutes=10))):
        event = json.loads(template.replace("INSTANCE_ID", instance_id))
        event["time"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
        sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(event))

    provider = reader(moto_url, queue)
    read = notices(provider, since)

    assert [n.instance_id for n in read] == ["i-0late"]
    assert queued(moto_url, queue) == 1, "the stale one is deleted at once"
    provider.acknowledge(read)
    assert queued(moto_url, queue) == 0


def send_notice(moto_url: str, queue_url: str, instance_id: str, at: datetime) -> None:
    event = json.loads((FIXTURES / "spot_interruption_warning.json").read_text().replace("INSTANCE_ID", instance_id))
    event["time"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    fake_session().client("sqs", endpoint_url=moto_url).send_message(QueueUrl=queue_url, MessageBody=json.dumps(event))


def test_a_notice_not_acknowledged_comes_again_after_the_visibility_timeout_and_not_after_its_ack(
    moto_url: str, queue: str
) -> None:
    from providers.aws import _decode_receipt

    at = datetime(2026, 3, 2, 14, 0, tzinfo=UTC)
    send_notice(moto_url, queue, "i-0crash", at)
    provider = reader(moto_url, queue, notice_visibility_seconds=600)
    seen: list[Any] = []

    def watcher_that_dies() -> None:
        read = notices(provider, at)
        assert [n.instance_id for n in read] == ["i-0crash"]
        seen.extend(read)
        raise RuntimeError("the watcher died between reading the notice and acting on it")

    with pytest.raises(RuntimeError, match="died"):
        watcher_that_dies()
    assert queued(moto_url, queue) == 1
    assert notices(provider, at) == []  # hidden for the visibility timeout (600 s: no load makes it lapse here)
    # the visibility timeout lapses (ended now through SQS itself rather than by sleeping, so a loaded machine
    # cannot make the hidden read above come too late)
    decoded = _decode_receipt(seen[0].receipt)
    assert decoded is not None and decoded[0] == REGION
    sqs = fake_session().client("sqs", endpoint_url=moto_url)
    sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=decoded[1], VisibilityTimeout=0)

    (again,) = notices(reader(moto_url, queue, notice_visibility_seconds=600), at)  # a restarted watcher
    assert (again.instance_id, again.noticed_at) == ("i-0crash", at)
    provider.acknowledge([again])  # acted on: gone for good
    assert queued(moto_url, queue) == 0  # deleted, not merely hidden (hidden ones count as not visible)
    assert notices(provider, at) == []


def test_acknowledging_ignores_events_without_a_receipt_and_other_regions_and_a_failed_delete_is_logged(
    moto_url: str, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    at = datetime(2026, 3, 2, 14, 0, tzinfo=UTC)
    send_notice(moto_url, queue, "i-0ack", at)
    provider = reader(moto_url, queue)
    (notice,) = notices(provider, at)
    assert notice.receipt is not None and notice == replace(notice, receipt=None)  # not part of equality

    foreign = [
        replace(notice, receipt=None),
        replace(notice, receipt="sqs:eu-west-1:someone-elses"),
        replace(notice, receipt="opaque-from-another-provider"),
    ]
    provider.acknowledge(foreign)
    assert queued(moto_url, queue) == 1
    with caplog.at_level(logging.WARNING, logger="costopt.providers.aws"):
        provider.acknowledge([replace(notice, receipt=f"sqs:{REGION}:not-a-receipt-handle")])
    assert queued(moto_url, queue) == 1
    assert any("not deleted" in r.getMessage() or "cannot delete" in r.getMessage() for r in caplog.records)
    provider.acknowledge([notice, notice])  # twice in one call, then again: idempotent
    provider.acknowledge([notice])
    assert queued(moto_url, queue) == 0


def test_a_missing_queue_is_a_not_found_error_that_says_how_to_create_it(moto_url: str) -> None:
    missing = f"{moto_url}/{MOTO_ACCOUNT}/no-such-queue"
    with pytest.raises(NotFoundError, match="setup_interruption_queue"):
        reader(moto_url, missing).interruptions(datetime(2026, 3, 2, tzinfo=UTC))


def test_an_sns_envelope_is_unwrapped_and_other_bodies_are_bad_records() -> None:
    event = json.loads((FIXTURES / "spot_interruption_warning.json").read_text().replace("INSTANCE_ID", "i-0sns"))
    wrapped = json.dumps({"Type": "Notification", "Message": json.dumps(event)})
    assert parse_interruption_event(wrapped).instance_id == "i-0sns"
    with pytest.raises(BadRecord, match="not a JSON object"):
        parse_interruption_event('"just a string"')


# --------------------------------------------------------------------------- error translation


def _stubbed_provider(stub_errors: Mapping[str, tuple[str, str]]) -> tuple[AwsProvider, Stubber]:
    """A provider on a stubbed EC2 client: no instance for the token, then the given error per operation."""
    ec2, stub = stubbed("ec2")
    stub.add_response("describe_instances", {"Reservations": []})
    for operation, (code, message) in stub_errors.items():
        stub.add_client_error(operation, service_error_code=code, service_message=message, http_status_code=400)
    return AwsProvider([REGION], client_factory=lambda service, region: ec2), stub


@pytest.mark.parametrize(
    ("code", "error", "advice"),
    [
        ("InsufficientInstanceCapacity", CapacityError, "try another zone"),
        ("SpotMaxPriceTooLow", CapacityError, "try another zone"),
        ("InsufficientCapacity", CapacityError, "try another zone"),
        ("InstanceLimitExceeded", QuotaError, "Service Quotas"),
        ("VcpuLimitExceeded", QuotaError, "Service Quotas"),
        ("MaxSpotInstanceCountExceeded", QuotaError, "Service Quotas"),
        ("AuthFailure", AuthError, "IAM policy"),
        ("UnauthorizedOperation", AuthError, "decode-authorization-message"),
        ("IdempotentParameterMismatch", CloudError, "fresh token"),
        ("InvalidAMIID.NotFound", CloudError, "ami_ids"),
    ],
)
def test_launch_errors_become_the_projects_typed_errors_with_advice(
    code: str, error: type[CloudError], advice: str
) -> None:
    provider, stub = _stubbed_provider({"run_instances": (code, f"{code} from the stub")})

    with pytest.raises(error, match=advice) as caught:
        provider.launch(spec_for("job-x", market=Market.SPOT), "tok-x")

    stub.assert_no_pending_responses()
    assert type(caught.value) is error
    assert code in str(caught.value) and "g5.xlarge spot in us-east-1/us-east-1b" in str(caught.value)


def test_an_instance_gone_between_describe_and_terminate_is_not_an_error() -> None:
    ec2, stub = stubbed("ec2")
    alive = _raw("running", Tags=[{"Key": TOKEN_TAG, "Value": "t"}])
    stub.add_response("describe_instances", {"Reservations": [{"Instances": [alive]}]})
    stub.add_client_error("terminate_instances", service_error_code="InvalidInstanceID.NotFound", http_status_code=400)

    AwsProvider([REGION], client_factory=lambda service, region: ec2).terminate("i-0abc")

    stub.assert_no_pending_responses()


def test_refused_credentials_on_describe_are_an_auth_error() -> None:
    ec2, stub = stubbed("ec2")
    stub.add_client_error("describe_instances", service_error_code="AuthFailure", http_status_code=401)
    with pytest.raises(AuthError, match="AuthFailure"):
        AwsProvider([REGION], client_factory=lambda service, region: ec2).describe("i-0abc")


def test_missing_credentials_are_an_auth_error_before_anything_is_sent(moto_url: str) -> None:
    provider = AwsProvider([REGION], session=boto3.Session(region_name=REGION), endpoint_url=moto_url, max_attempts=1)
    with pytest.raises(AuthError, match="NoCredentialsError"):
        provider.launch(spec_for("job-y"), "tok-y")


# --------------------------------------------------------------------------- retries and settings

EC2_THROTTLED = (
    "<?xml version='1.0' encoding='UTF-8'?><Response><Errors><Error><Code>RequestLimitExceeded</Code>"
    "<Message>Request limit exceeded.</Message></Error></Errors>"
    "<RequestID>00000000-0000-0000-0000-000000000001</RequestID></Response>"
)


class ThrottlingProxy:
    """A loopback endpoint answering the first ``throttles`` requests with EC2's throttling error and
    forwarding the rest to ``upstream``."""

    def __init__(self, upstream: str, throttles: int) -> None:
        self.throttles = throttles
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.requests += 1
                if owner.requests <= owner.throttles:
                    self._answer(503, "text/xml", EC2_THROTTLED.encode())
                    return
                host, port = upstream.removeprefix("http://").split(":")
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
                conn.request("POST", self.path, body=body, headers={k: v for k, v in self.headers.items()})
                resp = conn.getresponse()
                payload = resp.read()
                conn.close()
                self._answer(resp.status, resp.getheader("Content-Type", "text/xml"), payload)

            def _answer(self, status: int, content_type: str, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.http = LoopbackServer(Handler, poll_interval=0.05)
        self.url = self.http.url

    def close(self) -> None:
        self.http.close()


@pytest.fixture
def throttled(moto_url: str) -> Iterator[ThrottlingProxy]:
    proxy = ThrottlingProxy(moto_url, throttles=1)
    yield proxy
    proxy.close()


def test_throttling_is_retried_by_botocore_standard_mode(throttled: ThrottlingProxy) -> None:
    provider = AwsProvider([REGION], session=fake_session(), endpoint_url=throttled.url, max_attempts=3)
    assert provider.list({"costopt:job": "nobody"}) == []
    assert throttled.requests == 2


def test_throttling_past_the_attempts_is_a_cloud_error_naming_the_code(throttled: ThrottlingProxy) -> None:
    provider = AwsProvider([REGION], session=fake_session(), endpoint_url=throttled.url, max_attempts=1)
    with pytest.raises(CloudError, match="RequestLimitExceeded"):
        provider.list({"costopt:job": "nobody"})


def test_settings_give_regions_endpoint_and_timeout_and_clients_use_standard_retries() -> None:
    settings = Settings(aws_regions=["eu-west-1", "us-west-2"], aws_endpoint_url="http://127.0.0.1:9", http_timeout_s=7)
    provider = AwsProvider.from_settings(settings, session=fake_session(), max_attempts=4)

    assert provider.regions == ("eu-west-1", "us-west-2")
    assert provider.default_image == DEFAULT_IMAGE, "no image set: the DLAMI SSM parameter"
    client = provider._client("ec2", "eu-west-1")
    assert client.meta.config.retries == {"mode": "standard", "total_max_attempts": 4}
    assert client.meta.config.read_timeout == 7
    assert client.meta.endpoint_url == "http://127.0.0.1:9"
    with pytest.raises(ValueError, match="at least one region"):
        AwsProvider([])


def test_settings_give_images_network_identity_and_queues_of_each_launch(
    moto_url: str, dl_ami: str, recorder: Recorder, job: str
) -> None:
    queue = setup_interruption_queue(REGION, session=fake_session(), endpoint_url=moto_url, queue_name="q-" + job)
    ec2 = fake_session().client("ec2", endpoint_url=moto_url)
    vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    subnet_b = ec2.create_subnet(VpcId=vpc, CidrBlock="172.31.200.0/24", AvailabilityZone="us-east-1b")["Subnet"]
    group = ec2.create_security_group(GroupName="g-" + job, Description="costopt test", VpcId=vpc)["GroupId"]
    ec2.create_key_pair(KeyName="k-" + job)
    iam = fake_session().client("iam", endpoint_url=moto_url)
    profile = iam.create_instance_profile(InstanceProfileName="p-" + job)["InstanceProfile"]["Arn"]
    settings = Settings(
        aws_regions=[REGION],
        aws_ami_ids=f"{REGION}={dl_ami}",
        aws_interruption_queue_urls={REGION: queue.queue_url},
        aws_instance_profile=profile,
        aws_security_group_ids=f"{REGION}={group}",
        aws_subnet_ids=f"us-east-1b={subnet_b['SubnetId']}",
        aws_key_name="k-" + job,
    )
    provider = AwsProvider.from_settings(settings, client_factory=recorder, queue_wait_seconds=0)
    assert provider.interruption_queue_urls == {REGION: queue.queue_url}

    instance = provider.launch(spec_for(job, zone="us-east-1b"), "tok-" + job)

    (sent,) = recorder.named("RunInstances")
    assert sent["ImageId"] == dl_ami
    assert sent["SubnetId"] == subnet_b["SubnetId"]
    assert sent["SecurityGroupIds"] == [group]
    assert sent["KeyName"] == "k-" + job
    assert sent["IamInstanceProfile"] == {"Arn": profile}
    (raw,) = instances_tagged(ec2, TOKEN_TAG, "tok-" + job)
    assert (raw["SubnetId"], raw["KeyName"]) == (subnet_b["SubnetId"], "k-" + job)
    assert [g["GroupId"] for g in raw["SecurityGroups"]] == [group]
    assert raw["IamInstanceProfile"]["Arn"] == profile
    assert instance.offer.zone == "us-east-1b"


def test_an_offer_outside_the_regions_is_refused_before_anything_is_sent(
    provider: AwsProvider, recorder: Recorder, job: str
) -> None:
    elsewhere = replace(spec_for(job), offer=OfferKey(Cloud.AWS, "eu-west-1", "", "g5.xlarge", Market.SPOT))
    with pytest.raises(ProviderConfigError, match="COSTOPT_AWS_REGIONS"):
        provider.launch(elsewhere, "tok-" + job)
    assert recorder.calls == []


@pytest.mark.parametrize(
    ("settings", "variable"),
    [
        ({"aws_regions": []}, "COSTOPT_AWS_REGIONS"),
        ({"aws_interruption_queue_urls": "eu-west-1=https://sqs/q"}, "COSTOPT_AWS_INTERRUPTION_QUEUE_URLS"),
        ({"aws_security_group_ids": "eu-west-1=sg-1"}, "COSTOPT_AWS_SECURITY_GROUP_IDS"),
        ({"aws_ami_ids": "eu-west-1=ami-1"}, "COSTOPT_AWS_AMI_IDS"),
        ({"aws_subnet_ids": "eu-west-1a=subnet-1"}, "COSTOPT_AWS_SUBNET_IDS"),
    ],
)
def test_settings_that_cannot_work_name_the_variable_to_fix(settings: dict[str, Any], variable: str) -> None:
    with pytest.raises(ProviderConfigError, match=variable):
        AwsProvider.from_settings(Settings(**{"aws_regions": [REGION], **settings}), session=fake_session())
