"""The CloudProvider contracts of costopt/cloud.py, checked on every provider that can be built cheaply
here: sim, local (processes on this machine), AWS on moto's server, GCP and Azure through their real
clients against the local fakes. One test per contract, parametrized over the providers.

- launch by token: one instance per token, also for a restarted provider object;
- terminate: idempotent, an unknown id is not an error;
- list(tags): exact tags, only costopt's instances, every existing instance in any state (stopped ones
  too), ended ones never after ENDED_RETENTION, oldest launch first;
- output: the instance's console, the last lines with ``tail``; exit_code: None while the job runs, 0 once it
  finished (on the providers that know: sim and local).
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials

from costopt.agent import job_env
from costopt.cloud import (
    ACTIVE_STATES,
    ENDED_RETENTION,
    CloudProvider,
    Instance,
    InstanceState,
    Interruption,
    LaunchSpec,
    NotFoundError,
    tags_match,
)
from costopt.domain import Cloud, Market, OfferKey
from costopt.risk.hazard import HazardModel
from providers.aws import AwsProvider
from providers.azure import AzureProvider, vm_name
from providers.gcp import GcpProvider, instance_name, sanitize_label
from providers.local import LocalProvider
from providers.sim import SimCloud, SimConfig
from tests.aws_support import REGION, fake_session
from tests.price_support import step_prices
from tests.providers.azure_fake import FakeArm, make_provider
from tests.providers.gcp_fake import PROJECT, ZONE, FakeCompute

TAG_JOB = "costopt-job"
TAG_EPOCH = "costopt-epoch"
PROVIDERS = ("sim", "local", "aws", "gcp", "azure")
SIM_START = datetime(2026, 3, 2, tzinfo=UTC)
SLEEPER = "import time\nwhile True:\n    time.sleep(0.05)\n"
PRINTER = "import sys\nfor i in (1, 2, 3):\n    print('hello', i)\nprint('oops on stderr', file=sys.stderr)\n"


@dataclass
class Harness:
    """One provider under test, and what the test may do to its cloud behind its back."""

    provider: CloudProvider
    offer: OfferKey
    unknown_id: str
    """An id of the provider's format that no instance has."""
    restart: Callable[[], CloudProvider] | None = None
    """A fresh provider object on the same cloud (a restarted migrator); None: state lives in the object."""
    settle: Callable[[], None] = lambda: None
    """Let the cloud move on (boot) before states are checked."""
    age: Callable[[timedelta], None] | None = None
    """Move the provider's clock forward; None: its clock cannot be moved (ended instances vanish at once)."""
    stop: Callable[[str], None] | None = None
    """Stop an instance as its owner would (the cloud keeps it, with its disks); None: no such state."""
    foreign: Callable[[dict[str, str]], str] | None = None
    """Make an instance costopt did not launch, carrying these tags; returns its id."""
    console: Callable[[str], list[str]] = lambda instance_id: []
    """Let the instance launched with :meth:`console_spec` write its console (or write it as the cloud would);
    returns what must appear in its output, line by line, in order."""
    console_env: dict[str, str] | None = None
    console_command: tuple[str, ...] | None = None
    exits: bool = False
    """The provider knows the job's exit code (its console job finishes: TERMINATED with exit code 0)."""

    def spec(self, job: str, epoch: int) -> LaunchSpec:
        return LaunchSpec(
            offer=self.offer,
            command=(sys.executable, "-c", SLEEPER),
            env={"COSTOPT_JOB_ID": job, "COSTOPT_EPOCH": str(epoch), "COSTOPT_CHECKPOINT_URI": f"/tmp/ckpt/{job}"},
            tags={TAG_JOB: job, TAG_EPOCH: str(epoch)},
        )

    def console_spec(self, job: str) -> LaunchSpec:
        """A launch whose job writes to its console (and, on sim and local, finishes)."""
        base = self.spec(job, 1)
        return LaunchSpec(
            offer=base.offer,
            command=self.console_command or base.command,
            env={**base.env, **(self.console_env or {})},
            tags=base.tags,
        )


def _sim() -> Harness:
    offer = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)
    prices = step_prices([(offer, SIM_START - timedelta(days=1), 3.06)])
    cloud = SimCloud(prices, HazardModel(defaults=dict.fromkeys(Cloud, 0.0)), start=SIM_START, config=SimConfig())

    def settle() -> None:
        cloud.run_until(cloud.now() + timedelta(minutes=10))  # past the 3-minute boot

    def age(d: timedelta) -> None:
        cloud.clock.advance(d)

    return Harness(
        provider=cloud,
        offer=offer,
        unknown_id="sim-000000000000",
        settle=settle,
        age=age,
        console_env=job_env(100, steps_per_second=10.0),  # the simulated agent trains 10 s, then finishes
        console=lambda iid: ["boot: job", "start: epoch 1, from scratch", "done: step 100", "exit 0: finished"],
        exits=True,
    )


def _local(tmp_path: Path) -> Harness:
    offset = [0.0]

    def clock() -> float:
        return time.time() + offset[0]

    def make() -> LocalProvider:
        return LocalProvider(tmp_path / "state", cwd=tmp_path, grace_seconds=5.0, clock=clock)

    def age(d: timedelta) -> None:
        offset[0] += d.total_seconds()

    provider = make()

    def console(instance_id: str) -> list[str]:
        provider.wait(instance_id, 20.0)
        return ["hello 1", "hello 2", "hello 3", "oops on stderr"]

    return Harness(
        provider=provider,
        offer=OfferKey(Cloud.LOCAL, "local", "", "cpu-1", Market.ON_DEMAND),
        unknown_id="local-000000000000",
        restart=make,
        age=age,
        console_command=(sys.executable, "-c", PRINTER),
        console=console,
        exits=True,
    )


def _aws(moto_url: str, dl_ami: str) -> Harness:
    now = [datetime.now(UTC)]

    def make() -> AwsProvider:
        return AwsProvider(
            [REGION],
            ami_ids={REGION: dl_ami},
            session=fake_session(),
            endpoint_url=moto_url,
            queue_wait_seconds=0,
            max_attempts=2,
            clock=lambda: now[0],
        )

    ec2 = fake_session().client("ec2", endpoint_url=moto_url)

    def age(d: timedelta) -> None:
        now[0] += d

    def foreign(tags: dict[str, str]) -> str:
        answer = ec2.run_instances(
            ImageId=dl_ami, InstanceType="m5.large", MinCount=1, MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
        )  # fmt: skip
        return str(answer["Instances"][0]["InstanceId"])

    def stop(instance_id: str) -> None:
        ec2.stop_instances(InstanceIds=[instance_id])

    return Harness(
        provider=make(),
        offer=OfferKey(Cloud.AWS, REGION, "us-east-1b", "g5.xlarge", Market.ON_DEMAND),
        unknown_id="i-0123456789abcdef0",
        restart=make,
        age=age,
        stop=stop,
        foreign=foreign,
        console=lambda iid: ["Linux version"],  # moto's EC2 answers a fixed sample console
    )


def _gcp(fake: FakeCompute) -> Harness:
    def make() -> GcpProvider:
        return GcpProvider(
            PROJECT,
            [ZONE],
            endpoint=fake.url,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            operation_timeout_s=5.0,
            poll_interval_s=0.01,
            request_timeout_s=5.0,
        )

    def stop(instance_id: str) -> None:
        zone, name = instance_id.split("/")
        fake.instances[(zone, name)]["status"] = "TERMINATED"  # GCP's word for a stopped VM

    def foreign(tags: dict[str, str]) -> str:
        labels = {sanitize_label(k, key=True): sanitize_label(v) for k, v in tags.items()}
        name = f"foreign-{uuid.uuid4().hex[:8]}"
        fake.add_instance(ZONE, name, status="RUNNING", labels=labels)
        return f"{ZONE}/{name}"

    def console(instance_id: str) -> list[str]:
        zone, name = instance_id.split("/")
        fake.serial[(zone, name)] = "boot\nhello 1\nhello 2\n"
        return ["boot", "hello 1", "hello 2"]

    return Harness(
        provider=make(),
        offer=OfferKey(Cloud.GCP, "us-central1", ZONE, "g2-standard-4", Market.ON_DEMAND),
        unknown_id=f"{ZONE}/{instance_name('never-launched')}",
        restart=make,
        stop=stop,
        foreign=foreign,
        console=console,
    )


def _azure(arm: FakeArm, ca_file: str) -> Harness:
    def make() -> AzureProvider:
        return make_provider(arm, ca_file)

    def stop(instance_id: str) -> None:
        arm.vms[instance_id]["_power"] = "PowerState/deallocated"

    def foreign(tags: dict[str, str]) -> str:
        name = f"foreign-{uuid.uuid4().hex[:8]}"
        arm.vms[name] = {
            "location": "eastus",
            "tags": dict(tags),
            "properties": {"hardwareProfile": {"vmSize": "Standard_NC6s_v3"}, "provisioningState": "Succeeded"},
            "_power": "PowerState/running",
            "_created": datetime.now(UTC).isoformat(),
        }
        return name

    def console(instance_id: str) -> list[str]:
        with arm.lock:
            arm.serial[instance_id] = "boot\nhello 1\nhello 2\n"
        return ["boot", "hello 1", "hello 2"]

    return Harness(
        provider=make(),
        offer=OfferKey(Cloud.AZURE, "eastus", "1", "Standard_NC6s_v3", Market.ON_DEMAND),
        unknown_id=vm_name("never-launched"),
        restart=make,
        stop=stop,
        foreign=foreign,
        console=console,
    )


@pytest.fixture(params=PROVIDERS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    name: str = request.param
    if name == "sim":
        h = _sim()
    elif name == "local":
        h = _local(tmp_path)
    elif name == "aws":
        h = _aws(request.getfixturevalue("moto_url"), request.getfixturevalue("dl_ami"))
    elif name == "gcp":
        h = _gcp(request.getfixturevalue("fake_compute"))
    else:
        h = _azure(request.getfixturevalue("arm"), request.getfixturevalue("ca_file"))
    yield h
    if isinstance(h.provider, LocalProvider):  # no process outlives its test
        for inst in h.provider.list({}):
            h.provider.terminate(inst.instance_id)
        h.provider.close()


@pytest.fixture
def job() -> str:
    """A job id of this test alone (moto's state is shared by the module)."""
    return f"job-{uuid.uuid4().hex[:10]}"


def ids(instances: list[Instance]) -> list[str]:
    return [i.instance_id for i in instances]


def gone(provider: CloudProvider, instance_id: str) -> bool:
    """The instance ended (terminated), is going (stopping) or the cloud forgot it."""
    try:
        return provider.describe(instance_id).state in (InstanceState.TERMINATED, InstanceState.STOPPING)
    except NotFoundError:
        return True


# --------------------------------------------------------------------------- launch by token


def test_one_token_launches_one_instance_even_from_a_restarted_provider(harness: Harness, job: str) -> None:
    provider = harness.provider
    first = provider.launch(harness.spec(job, 1), f"{job}:1")
    again = provider.launch(harness.spec(job, 1), f"{job}:1")
    assert again.instance_id == first.instance_id
    if harness.restart is not None:
        assert harness.restart().launch(harness.spec(job, 1), f"{job}:1").instance_id == first.instance_id
    harness.settle()
    assert ids(provider.list({TAG_JOB: job})) == [first.instance_id]
    assert provider.describe(first.instance_id).instance_id == first.instance_id
    other = provider.launch(harness.spec(job, 1), f"{job}:1:retry")
    assert other.instance_id != first.instance_id
    assert set(ids(provider.list({TAG_JOB: job}))) == {first.instance_id, other.instance_id}


# --------------------------------------------------------------------------- terminate


def test_terminate_is_idempotent_and_an_unknown_id_is_not_an_error(harness: Harness, job: str) -> None:
    provider = harness.provider
    inst = provider.launch(harness.spec(job, 1), f"{job}:1")
    harness.settle()
    provider.terminate(inst.instance_id)
    provider.terminate(inst.instance_id)
    if harness.restart is not None:
        harness.restart().terminate(inst.instance_id)
    provider.terminate(harness.unknown_id)
    assert gone(provider, inst.instance_id)
    with pytest.raises(NotFoundError):
        provider.describe(harness.unknown_id)


# --------------------------------------------------------------------------- list


def test_list_returns_costopts_instances_with_exactly_the_tags_asked_oldest_first(harness: Harness, job: str) -> None:
    provider = harness.provider
    a = provider.launch(harness.spec(job, 1), f"{job}:1")
    b = provider.launch(harness.spec(job, 2), f"{job}:2")
    c = provider.launch(harness.spec(job + "-other", 1), f"{job}-other:1")
    theirs = harness.foreign({TAG_JOB: job, TAG_EPOCH: "1"}) if harness.foreign is not None else None
    harness.settle()

    mine = provider.list({TAG_JOB: job})
    assert set(ids(mine)) == {a.instance_id, b.instance_id}, "only costopt's, only the job's"
    assert all(i.state in ACTIVE_STATES for i in mine)
    assert all(tags_match(i.tags, {TAG_JOB: job}) for i in mine)
    launched = [i.launched_at for i in mine]
    assert None not in launched and launched == sorted(launched), "oldest launch first"  # type: ignore[type-var]
    assert ids(provider.list({TAG_JOB: job, TAG_EPOCH: "2"})) == [b.instance_id]
    assert provider.list({TAG_JOB: job[:-1] + "*"}) == [], "tag values are not wildcards"
    assert provider.list({TAG_JOB: job, "no-such-tag": "x"}) == []
    everything = set(ids(provider.list({})))
    assert {a.instance_id, b.instance_id, c.instance_id} <= everything
    assert theirs is None or theirs not in everything, "an instance costopt did not launch is never listed"


def test_an_ended_instance_is_never_listed_once_the_retention_is_over(harness: Harness, job: str) -> None:
    provider = harness.provider
    keep = provider.launch(harness.spec(job, 1), f"{job}:1")
    end = provider.launch(harness.spec(job, 2), f"{job}:2")
    harness.settle()
    provider.terminate(end.instance_id)

    listed = {i.instance_id: i.state for i in provider.list({TAG_JOB: job})}
    assert listed.get(keep.instance_id) in ACTIVE_STATES
    assert listed.get(end.instance_id, InstanceState.TERMINATED) in (InstanceState.TERMINATED, InstanceState.STOPPING)
    if harness.age is not None:
        harness.age(ENDED_RETENTION + timedelta(minutes=1))
    assert ids(provider.list({TAG_JOB: job})) == [keep.instance_id]


def test_a_stopped_instance_still_exists_so_it_is_listed_as_stopped(harness: Harness, job: str) -> None:
    if harness.stop is None:
        pytest.skip("this provider's instances are never stopped, only ended")
    provider = harness.provider
    inst = provider.launch(harness.spec(job, 1), f"{job}:1")
    provider.describe(inst.instance_id)  # moto: pending -> running at the first describe
    harness.stop(inst.instance_id)

    assert provider.describe(inst.instance_id).state is InstanceState.STOPPED
    assert [(i.instance_id, i.state) for i in provider.list({TAG_JOB: job})] == [
        (inst.instance_id, InstanceState.STOPPED)
    ]
    if harness.age is not None:
        harness.age(ENDED_RETENTION * 10)
        assert ids(provider.list({TAG_JOB: job})) == [inst.instance_id], "stopped is not ended: no retention"
    provider.terminate(inst.instance_id)
    assert gone(provider, inst.instance_id)


def test_describe_after_launch_keeps_offer_and_tags(harness: Harness, job: str) -> None:
    provider = harness.provider
    inst = provider.launch(harness.spec(job, 3), f"{job}:3")
    harness.settle()
    now = provider.describe(inst.instance_id)
    assert (now.offer.cloud, now.offer.region, now.offer.instance_type, now.offer.market) == (
        harness.offer.cloud,
        harness.offer.region,
        harness.offer.instance_type,
        harness.offer.market,
    )
    assert tags_match(now.tags, {TAG_JOB: job, TAG_EPOCH: "3"})
    assert now.state in ACTIVE_STATES


# --------------------------------------------------------------------------- output, exit code


def test_output_is_the_instances_console_and_tail_keeps_its_last_lines(harness: Harness, job: str) -> None:
    provider = harness.provider
    inst = provider.launch(harness.console_spec(job), f"{job}:1")
    harness.settle()
    expected = harness.console(inst.instance_id)
    assert expected, "the harness names what the console must show"  # else the loop below checks nothing
    text = provider.output(inst.instance_id)
    lines = text.splitlines()
    at = 0
    for want in expected:
        found = [i for i in range(at, len(lines)) if want in lines[i]]
        assert found, f"{want!r} not in the output after line {at}: {lines}"
        at = found[0] + 1
    assert text.endswith("\n")
    assert provider.output(inst.instance_id, tail=2) == "".join(line + "\n" for line in lines[-2:])
    assert provider.output(inst.instance_id, tail=0) == ""
    with pytest.raises(ValueError):
        provider.output(inst.instance_id, tail=-1)
    with pytest.raises(NotFoundError):
        provider.output(harness.unknown_id)
    if harness.exits:
        done = provider.describe(inst.instance_id)
        assert done.state is InstanceState.TERMINATED and done.exit_code == 0


def test_a_running_instance_has_no_exit_code(harness: Harness, job: str) -> None:
    provider = harness.provider
    inst = provider.launch(harness.spec(job, 1), f"{job}:1")
    assert inst.exit_code is None
    harness.settle()
    running = provider.describe(inst.instance_id)
    assert running.state in ACTIVE_STATES and running.exit_code is None


# --------------------------------------------------------------------------- acknowledge


def test_acknowledging_interruptions_is_safe_and_changes_nothing_else(harness: Harness, job: str) -> None:
    provider = harness.provider
    inst = provider.launch(harness.spec(job, 1), f"{job}:1")
    harness.settle()
    since = datetime(2020, 1, 1, tzinfo=UTC)
    events = provider.interruptions(since)
    stranger = Interruption(harness.unknown_id, since, None, "notice", receipt="from-another-provider")

    provider.acknowledge([])
    provider.acknowledge([*events, stranger])
    provider.acknowledge([*events, stranger])  # idempotent

    assert provider.describe(inst.instance_id).state in ACTIVE_STATES
