"""Fleet workers on the clouds, end to end as far as this machine allows (no network, never a real cloud):
the round executor launches fleet instances through the real providers, AWS on moto's server on loopback
and GCP and Azure through their real SDK clients against the loopback fakes of ``gcp_fake.py`` and
``azure_fake.py``, and the boot script each cloud received (user data, ``startup-script`` metadata, custom
data) is read back from the fake and run here by bash, in an empty environment as cloud-init would:

- it runs the worker command (``python3 -m costopt.agent.worker``, the production default) with the
  service URL, fleet, worker id, token and poll interval, quoted safely, within the cloud's size limit;
- with ``python3`` pointed at this venv's Python, the worker it starts syncs with a loopback service
  (the real sync route under uvicorn) under its own id and token, and exits 0 when the fleet is released,
  the executor terminating its instance on the cloud;
- on AWS, that worker runs a round's lease (``examples/train.py``) to its last step (``slow``);
- a lost instance (its worker silent, or the spot instance taken back by the cloud) is terminated through
  the provider and replaced by a new instance with a new worker id and token; a launch cut short (the
  service died after the cloud accepted it) is found by its tags, terminated and launched again;
- a boot script the cloud would refuse (above its size limit), an offer outside the provider's regions
  and a loopback service URL a cloud instance cannot reach are refused before anything is sent; the
  instance waits, saying why, and the fleet's pass goes on.

Every test runs on both store backends."""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from sqlalchemy import Engine

import costopt.fleets.billing  # noqa: F401  (imported by build_fleet_executor: paid here, once, not by a test)
import providers.sim  # noqa: F401  (idem)
from api.fleet_service import build_fleet_executor, service_url_problem, worker_command, worker_env
from costopt.agent.worker import WorkerConfig
from costopt.aws_clients import aws_client_config
from costopt.cloud import CloudProvider, LaunchSpec
from costopt.domain import Cloud, Market, OfferKey
from costopt.fleets.executor import LAUNCH_RETRY_S, FleetExecutor
from costopt.fleets.model import InstanceState, NewFleet, NewInstance
from costopt.fleets.store import FleetRepository
from costopt.fleets.sync import WorkerRefused, WorkerSync, hash_token
from costopt.jobs.records import JobRepository
from costopt.settings import Settings
from providers.aws import MAX_USER_DATA_BYTES, AwsProvider
from providers.azure import MAX_CUSTOM_DATA_BYTES
from providers.gcp import MAX_METADATA_BYTES, GcpProvider
from tests.aws_support import MOTO_ACCOUNT, REGION, fake_session
from tests.providers.azure_fake import FakeArm, make_provider
from tests.providers.gcp_fake import PROJECT, ZONE, FakeCompute

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py

T0 = datetime(2026, 12, 2, 4, 0, tzinfo=UTC)
CLOUDS = ("aws", "gcp", "azure")
WORKER_VARS = (
    "COSTOPT_SERVICE_URL",
    "COSTOPT_FLEET_ID",
    "COSTOPT_WORKER_ID",
    "COSTOPT_WORKER_TOKEN",
    "COSTOPT_WORKER_GPUS",
    "COSTOPT_WORKER_POLL",
)


# --------------------------------------------------------------------------- the clouds behind their fakes


@dataclass
class FakeCloud:
    """One cloud's real provider on its loopback fake, and what the test reads behind the provider's back."""

    name: str
    provider: CloudProvider
    offer: OfferKey
    accelerator: str
    limit: int
    """The cloud's size limit of the boot script (bytes)."""
    boot_script: Callable[[str], str]
    """The boot script the fake stored for an instance id, decoded."""
    exists: Callable[[str], bool]
    """Whether the cloud still runs the instance (not terminated, not deleted)."""
    take_back: Callable[[str], None]
    """The cloud reclaims the spot instance (as it does at a preemption)."""
    launches: Callable[[], int]
    """Launch requests the fake received."""


@functools.cache
def _moto_client(url: str, service: str, region: str) -> Any:
    """One client per moto server, service and region for the module (a new client reloads its model)."""
    return fake_session().client(
        service, region_name=region, endpoint_url=url, config=aws_client_config(max_attempts=2)
    )


def _aws(request: pytest.FixtureRequest) -> FakeCloud:
    url: str = request.getfixturevalue("moto_url")
    ami: str = request.getfixturevalue("dl_ami")
    ec2 = _moto_client(url, "ec2", REGION)

    def client(service: str, region: str) -> Any:
        return _moto_client(url, service, region)

    def raw(instance_id: str) -> dict[str, Any]:
        (reservation,) = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        found: dict[str, Any] = reservation["Instances"][0]
        return found

    def boot_script(instance_id: str) -> str:
        attr = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        return base64.b64decode(attr["UserData"]["Value"]).decode()

    def take_back(instance_id: str) -> None:
        from moto.ec2.models import ec2_backends
        from moto.ec2.models.instances import StateReason

        instance = ec2_backends[MOTO_ACCOUNT][REGION].get_instance(instance_id)
        instance.terminate()
        instance.state_reason = StateReason(
            "Server.SpotInstanceTermination: Spot instance termination", "Server.SpotInstanceTermination"
        )

    # moto's instances are shared by the module: count this test's launches from here
    before = {i["InstanceId"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}

    def launches() -> int:
        now = {i["InstanceId"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}
        return len(now - before)

    return FakeCloud(
        "aws",
        AwsProvider([REGION], ami_ids={REGION: ami}, client_factory=client, queue_wait_seconds=0),
        OfferKey(Cloud.AWS, REGION, "us-east-1a", "p3.2xlarge", Market.SPOT),
        "v100",
        MAX_USER_DATA_BYTES,
        boot_script,
        lambda iid: raw(iid)["State"]["Name"] not in ("shutting-down", "terminated"),
        take_back,
        launches,
    )


def _gcp(request: pytest.FixtureRequest) -> FakeCloud:
    fake: FakeCompute = request.getfixturevalue("fake_compute")
    provider = GcpProvider(
        project=PROJECT,
        zones=[ZONE],
        endpoint=fake.url,
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        image="projects/debian-cloud/global/images/family/debian-12",
        operation_timeout_s=2.0,
        poll_interval_s=0.01,
        request_timeout_s=5.0,
    )

    def key(instance_id: str) -> tuple[str, str]:
        zone, name = instance_id.split("/")
        return zone, name

    def boot_script(instance_id: str) -> str:
        items = fake.instances[key(instance_id)]["metadata"]["items"]
        return str({i["key"]: i["value"] for i in items}["startup-script"])

    return FakeCloud(
        "gcp",
        provider,
        OfferKey(Cloud.GCP, "us-central1", ZONE, "n1-standard-8+v100x1", Market.SPOT),
        "v100",
        MAX_METADATA_BYTES,
        boot_script,
        lambda iid: key(iid) in fake.instances,
        lambda iid: fake.preempt(*key(iid), at=T0),
        lambda: len(fake.inserts),
    )


def _azure(request: pytest.FixtureRequest) -> FakeCloud:
    arm: FakeArm = request.getfixturevalue("arm")
    ca_file: str = request.getfixturevalue("ca_file")

    def boot_script(instance_id: str) -> str:
        body = next(b for name, b in arm.puts if name == instance_id)
        return base64.b64decode(body["properties"]["osProfile"]["customData"]).decode()

    return FakeCloud(
        "azure",
        make_provider(arm, ca_file),
        OfferKey(Cloud.AZURE, "eastus", "1", "Standard_NC6s_v3", Market.SPOT),
        "v100",
        MAX_CUSTOM_DATA_BYTES,
        boot_script,
        lambda iid: iid in arm.vms,
        lambda iid: arm.evict(iid, deallocate=False),
        lambda: len(arm.puts),
    )


@pytest.fixture(params=CLOUDS)
def cloud(request: pytest.FixtureRequest) -> FakeCloud:
    return {"aws": _aws, "gcp": _gcp, "azure": _azure}[request.param](request)


# --------------------------------------------------------------------------- the service side


class Clock:
    def __init__(self, t: datetime | None = None) -> None:
        self.t = t

    def __call__(self) -> datetime:
        return self.t if self.t is not None else datetime.now(UTC)

    def advance(self, seconds: float) -> None:
        assert self.t is not None
        self.t += timedelta(seconds=seconds)


@dataclass
class Rig:
    cloud: FakeCloud
    clock: Clock
    repo: FleetRepository
    jobs: JobRepository
    executor: FleetExecutor
    fleet_id: str
    settings: Settings

    def tick(self) -> Any:
        return self.executor.tick()

    def only_instance(self, *states: InstanceState) -> Any:
        found = [i for i in self.repo.instances(self.fleet_id) if not states or i.state in states]
        assert len(found) == 1, found
        return found[0]


def make_rig(
    engine: Engine,
    cloud: FakeCloud,
    *,
    service_url: str = "http://costopt.example.com:8000",
    settings: Settings | None = None,
    clock: Clock | None = None,
    command: list[str] | None = None,
) -> Rig:
    """One fleet of one instance on ``cloud``; the executor built as the service builds it (the worker's
    command and variables from the settings, :func:`api.fleet_service.worker_command` and ``worker_env``)."""
    clock = clock or Clock(T0)
    settings = settings or Settings()
    repo = FleetRepository(engine, now=clock)
    jobs = JobRepository(engine, now=clock)
    fleet, _ = repo.create(
        NewFleet(
            team_id="team-a",
            policy="max_min_fairness",
            instances=(NewInstance(cloud.offer, cloud.accelerator, 1, cloud.name, Decimal("0.90")),),
            round_s=60.0,
        )
    )
    executor = FleetExecutor(
        repo,
        jobs,
        {cloud.name: cloud.provider},
        worker_command=lambda provider: command or worker_command(settings, provider),
        service_url=service_url,
        worker_env=worker_env(settings),
        dead_after_s=30,
        boot_timeout_s=600,
        full_every_s=0.0,
    )
    return Rig(cloud, clock, repo, jobs, executor, fleet.id, settings)


# --------------------------------------------------------------------------- running a boot script here


def shim_python(folder: Path, body: str) -> Path:
    """A folder holding a ``python3`` that runs ``body`` (a bash script's lines) instead of the image's."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "python3"
    exe.write_text(f"#!/bin/bash\n{body}\n")
    exe.chmod(0o755)
    return folder


def boot_env(bin_dir: Path, tmp: Path) -> dict[str, str]:
    """The environment a boot script gets here: nothing but a PATH (with ``bin_dir`` first) and a TMPDIR in
    the test's folder (cloud-init gives a root shell no more; the worker's default folder is under TMPDIR)."""
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "TMPDIR": str(tmp)}


def what_the_script_runs(script: str, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """Runs ``script`` with bash, its ``python3`` a probe that records its arguments and environment:
    what the instance's boot would start, and with what."""
    dump = tmp / "probe.json"
    probe = (
        f"import json, os, sys; json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(dump)!r}, 'w'))"
    )
    bin_dir = shim_python(tmp / "probe-bin", f'exec {shlex.quote(sys.executable)} -c {shlex.quote(probe)} "$@"')
    subprocess.run(["bash", "-c", script], env=boot_env(bin_dir, tmp), cwd=tmp, check=True, timeout=30)
    doc = json.loads(dump.read_text())
    return doc["argv"], doc["env"]


# --------------------------------------------------------------------------- the tests


def test_a_tick_launches_each_cloud_instance_with_a_boot_script_that_runs_the_worker_with_its_environment(
    engine: Engine, cloud: FakeCloud, tmp_path: Path
) -> None:
    rig = make_rig(engine, cloud, service_url="https://costopt.example.com/")
    report = rig.tick()
    inst = rig.only_instance()
    assert report.errors == [] and report.launched == [inst.id]
    assert inst.state is InstanceState.LAUNCHING and inst.instance_id is not None and cloud.launches() == 1

    script = cloud.boot_script(inst.instance_id)  # what the cloud stored, decoded
    assert script.startswith("#!/bin/bash\n") and len(script.encode()) <= cloud.limit
    assert script.rstrip().splitlines()[-1] == "exec python3 -m costopt.agent.worker"
    argv, env = what_the_script_runs(script, tmp_path)
    assert argv == ["-m", "costopt.agent.worker"]
    assert env["COSTOPT_SERVICE_URL"] == "https://costopt.example.com"
    assert env["COSTOPT_FLEET_ID"] == rig.fleet_id and env["COSTOPT_WORKER_ID"] == inst.id
    assert env["COSTOPT_WORKER_GPUS"] == "1" and env["COSTOPT_WORKER_POLL"] == "0.5"
    assert hash_token(env["COSTOPT_WORKER_TOKEN"]) == inst.token_hash  # the token the service will accept
    assert {k for k in env if k.startswith("COSTOPT_")} == set(WORKER_VARS)  # nothing else of the service's
    config = WorkerConfig.from_env(env)  # the worker reads it as it will on the instance
    assert (config.worker_id, config.gpus, config.poll_s) == (inst.id, 1, 0.5)

    # the token works once, for this worker only
    sync = WorkerSync(rig.repo, rig.jobs, poll_s=0.5)
    assert sync.sync(inst.id, env["COSTOPT_WORKER_TOKEN"], {"copies": []})["release"] is False
    with pytest.raises(WorkerRefused):
        sync.sync(inst.id, env["COSTOPT_WORKER_TOKEN"][:-1], {"copies": []})
    assert rig.only_instance().state is InstanceState.RUNNING
    assert rig.tick().launched == [] and cloud.launches() == 1  # launched once


def test_values_with_shell_syntax_reach_the_worker_byte_for_byte(
    engine: Engine, cloud: FakeCloud, tmp_path: Path
) -> None:
    """A configured worker command and a service URL with quotes, ``$(...)``, backquotes, ``;`` and spaces:
    each word comes back as it was and nothing of it is run."""
    pwned = tmp_path / "pwned"
    command = f"python3 -m costopt.agent.worker --label 'it'\"'\"'s $(touch {pwned}) `touch {pwned}`; rm -rf /'"
    url = f"http://svc.example.com:8000/a path/$(touch {pwned})?q='x'"
    rig = make_rig(engine, cloud, service_url=url, settings=Settings(fleet_worker_command=command))
    assert rig.tick().errors == []
    script = cloud.boot_script(rig.only_instance().instance_id)
    argv, env = what_the_script_runs(script, tmp_path)
    assert argv == ["-m", "costopt.agent.worker", "--label", f"it's $(touch {pwned}) `touch {pwned}`; rm -rf /"]
    assert env["COSTOPT_SERVICE_URL"] == url
    assert not pwned.exists()


class LoopbackService:
    """The workers' sync route (``api.routes.fleet_workers``, the service's own router, models and error
    handlers) under uvicorn on a loopback port, in a thread; its store is set per test."""

    def __init__(self) -> None:
        import uvicorn
        from fastapi import FastAPI

        from api.errors import install_error_handlers
        from api.routes import fleet_workers

        self.app = FastAPI()
        install_error_handlers(self.app)
        self.app.include_router(fleet_workers.router)
        self.app.state.settings = Settings()
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", access_log=False)
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        (sock,) = [s for server in self.server.servers for s in server.sockets]
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    def serve(self, repo: FleetRepository, jobs: JobRepository) -> None:
        self.app.state.jobs = jobs
        self.app.state.fleet_sync = WorkerSync(repo, jobs, poll_s=0.2)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def service() -> Iterator[LoopbackService]:
    svc = LoopbackService()
    try:
        yield svc
    finally:
        svc.close()


def wait_for(what: str, check: Callable[[], bool], proc: subprocess.Popen[str], timeout_s: float = 20.0) -> None:
    """Polls ``check`` (a guard against hanging, not a speed assertion); fails with the worker's output."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if proc.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(1)
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"{what}: not seen (worker exit {proc.returncode}); its output:\n{out}")
        time.sleep(0.02)


def test_the_boot_script_starts_a_worker_that_syncs_with_its_id_and_token_and_ends_with_its_fleet(
    engine: Engine, cloud: FakeCloud, service: LoopbackService, tmp_path: Path
) -> None:
    """The boot script as the cloud stored it, run here with ``python3`` being this venv's Python: the
    worker syncs with the loopback service (its instance turns running: its id and token were right), and
    when the fleet is released the executor terminates the instance on the cloud and the worker, told
    so at its next sync, exits 0, ending the script."""
    clock = Clock()  # the wall clock: the worker syncs in real time
    rig = make_rig(engine, cloud, service_url=service.url, settings=Settings(fleet_worker_poll=0.2), clock=clock)
    service.serve(rig.repo, rig.jobs)
    assert rig.tick().launched
    inst = rig.only_instance()
    assert inst.instance_id is not None
    script = cloud.boot_script(inst.instance_id)
    bin_dir = shim_python(tmp_path / "bin", f'exec {shlex.quote(sys.executable)} "$@"')
    proc = subprocess.Popen(
        ["bash", "-c", script],
        env=boot_env(bin_dir, tmp_path),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for("the worker's first sync", lambda: rig.only_instance().first_seen_at is not None, proc)
        assert rig.only_instance().state is InstanceState.RUNNING
        rig.repo.release(rig.fleet_id)
        report = rig.tick()  # nothing runs there: the instance is terminated on its cloud at once
        assert report.errors == [] and report.released == [inst.id]
        assert not cloud.exists(inst.instance_id)
        assert proc.wait(timeout=20) == 0  # the worker was told its instance left the fleet
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = proc.stdout.read() if proc.stdout else ""
    assert f"worker {inst.id} of fleet {rig.fleet_id} (1 GPUs) syncing with {service.url}" in out
    assert rig.only_instance().state is InstanceState.RELEASED
    assert cloud.launches() == 1


def exported(script: str) -> dict[str, str]:
    """The ``export NAME=value`` lines of a boot script, read as bash would (one-line values only; running
    the script is the first test's)."""
    out: dict[str, str] = {}
    for line in script.splitlines():
        if line.startswith("export "):
            ((name, value),) = [w.split("=", 1) for w in shlex.split(line.removeprefix("export "))]
            out[name] = value
    return out


@pytest.mark.parametrize("how", ["silent", "taken_back"])
def test_a_lost_instance_is_terminated_on_its_cloud_and_replaced_by_a_new_worker(
    engine: Engine, cloud: FakeCloud, tmp_path: Path, how: str
) -> None:
    """``silent``: the instance runs but its worker stopped syncing: after ``dead_after`` the executor
    terminates it through the provider (the fake cloud no longer runs it). ``taken_back``: the cloud
    reclaims the spot instance: the executor sees it ended through the provider at its next pass. Either
    way a replacement is launched at once, with a new worker id and token in its boot script."""
    rig = make_rig(engine, cloud)
    sync = WorkerSync(rig.repo, rig.jobs, poll_s=0.5)
    rig.tick()
    old = rig.only_instance()
    old_token = exported(cloud.boot_script(old.instance_id))["COSTOPT_WORKER_TOKEN"]
    sync.sync(old.id, old_token, {"copies": []})
    assert rig.only_instance().state is InstanceState.RUNNING and cloud.exists(old.instance_id)

    if how == "silent":
        rig.clock.advance(20)
        assert rig.tick().lost == []  # within dead_after, and its cloud still runs it
        rig.clock.advance(11)
    else:
        cloud.take_back(old.instance_id)
        rig.clock.advance(5)  # past dead_after / 10: the executor asks the provider
    report = rig.tick()
    assert report.errors == [] and report.lost == [old.id]
    assert not cloud.exists(old.instance_id)
    lost = rig.repo.instance(old.id)
    assert lost is not None and lost.state is InstanceState.LOST
    assert lost.end_reason is not None
    if how == "silent":
        assert "has not synced for 31 s" in lost.end_reason
    else:
        assert "preempted" in lost.end_reason or "no longer knows" in lost.end_reason

    new = rig.only_instance(InstanceState.LAUNCHING)
    assert report.launched == [new.id] and new.replaces == old.id and cloud.launches() == 2
    assert new.instance_id is not None and new.instance_id != old.instance_id and cloud.exists(new.instance_id)
    env = exported(cloud.boot_script(new.instance_id))
    assert env["COSTOPT_WORKER_ID"] == new.id and env["COSTOPT_WORKER_TOKEN"] != old_token
    with pytest.raises(WorkerRefused):
        sync.sync(new.id, old_token, {"copies": []})
    assert sync.sync(old.id, old_token, {"copies": []})["release"] is True  # the old worker is told to end
    assert sync.sync(new.id, env["COSTOPT_WORKER_TOKEN"], {"copies": []})["release"] is False
    assert rig.only_instance(InstanceState.RUNNING).id == new.id


class CrashAfterLaunch:
    """The cloud's provider, but the service dies right after the launch request succeeded: the executor
    never records the cloud's instance id (the launch is cut short between its two writes)."""

    def __init__(self, provider: CloudProvider) -> None:
        self.provider = provider
        self.name = provider.name
        self.crash = True

    def launch(self, spec: Any, idempotency_token: str) -> Any:
        launched = self.provider.launch(spec, idempotency_token)
        if self.crash:
            self.crash = False
            raise SystemExit("the service died")
        return launched

    def __getattr__(self, name: str) -> Any:
        return getattr(self.provider, name)


def test_a_launch_cut_short_is_found_by_its_tags_terminated_on_the_cloud_and_launched_again(
    engine: Engine, cloud: FakeCloud
) -> None:
    """The launch reached the cloud but its instance id was never recorded (and its worker's token is
    lost with the dead process): 60 s later the executor finds that instance by its tags (the fleet's and
    the fleet instance's: ``list``), terminates it on the cloud, and launches the fleet instance again with
    a new token in the same pass (one launch more on the cloud, none under the old token)."""
    crashing = CrashAfterLaunch(cloud.provider)
    rig = make_rig(engine, replace(cloud, provider=crashing))
    with pytest.raises(SystemExit):
        rig.tick()
    rig.executor = FleetExecutor(  # the restarted service's, on the plain provider
        rig.repo,
        rig.jobs,
        {cloud.name: cloud.provider},
        worker_command=lambda provider: worker_command(rig.settings, provider),
        service_url="http://costopt.example.com:8000",
        worker_env=worker_env(rig.settings),
        full_every_s=0.0,
    )
    inst = rig.only_instance()
    assert inst.state is InstanceState.LAUNCHING and inst.instance_id is None and inst.launch_token
    assert cloud.launches() == 1
    orphan = crashing.provider.launch(LaunchSpec(offer=inst.offer, command=["true"]), inst.launch_token)
    assert cloud.exists(orphan.instance_id) and cloud.launches() == 1  # found by its token, not launched again

    rig.clock.advance(30)
    assert rig.tick().launched == [] and cloud.exists(orphan.instance_id)  # it may still be in flight
    rig.clock.advance(31)
    report = rig.tick()
    assert not cloud.exists(orphan.instance_id)
    relaunched = rig.only_instance()
    assert relaunched.launch_token not in (None, inst.launch_token)
    assert report.launched == [inst.id] and relaunched.instance_id not in (None, orphan.instance_id)
    assert relaunched.token_hash != inst.token_hash and cloud.launches() == 2
    assert exported(cloud.boot_script(str(relaunched.instance_id)))["COSTOPT_WORKER_ID"] == inst.id


def test_a_boot_script_above_the_clouds_limit_is_refused_before_anything_is_sent(
    engine: Engine, cloud: FakeCloud
) -> None:
    """A worker command making the boot script larger than the cloud takes: no launch request, the
    instance waits (pending, the reason on it and in the report) and is retried later, never launched
    half-way (no launch cut short left to clean up, which would launch and terminate an instance)."""
    rig = make_rig(engine, cloud, command=["python3", "-m", "costopt.agent.worker", "--pad", "x" * cloud.limit])
    report = rig.tick()
    assert report.launched == [] and len(report.errors) == 1 and "launch failed" in report.errors[0]
    inst = rig.only_instance()
    assert inst.state is InstanceState.PENDING and inst.instance_id is None, inst
    assert inst.token_hash is None and inst.launch_token is None
    assert inst.end_reason is not None and f"limit of {cloud.limit}" in inst.end_reason
    assert cloud.launches() == 0
    assert rig.tick().errors == []  # not retried at once
    rig.clock.advance(LAUNCH_RETRY_S + 61)  # past the retry and the cut-short launch's 60 s: refused again
    report = rig.tick()
    assert len(report.errors) == 1 and f"limit of {cloud.limit}" in report.errors[0]
    assert rig.only_instance().state is InstanceState.PENDING and cloud.launches() == 0


ELSEWHERE = {
    "aws": OfferKey(Cloud.AWS, "eu-west-1", "eu-west-1a", "p3.2xlarge", Market.SPOT),
    "gcp": OfferKey(Cloud.GCP, "europe-west4", "europe-west4-a", "n1-standard-8+v100x1", Market.SPOT),
}


@pytest.mark.parametrize("cloud", list(ELSEWHERE), indirect=True)
def test_an_offer_outside_the_providers_regions_waits_and_the_fleet_goes_on(engine: Engine, cloud: FakeCloud) -> None:
    """The provider refuses the launch with ``ProviderConfigError`` (a ``ValueError``; nothing sent): the
    instance waits, saying which setting to change; the fleet's pass is not aborted."""
    rig = make_rig(engine, replace(cloud, offer=ELSEWHERE[cloud.name]))
    report = rig.tick()
    inst = rig.only_instance()
    assert inst.state is InstanceState.PENDING and inst.instance_id is None and cloud.launches() == 0
    setting = {"aws": "COSTOPT_AWS_REGIONS", "gcp": "COSTOPT_GCP_ZONES"}[cloud.name]
    assert inst.end_reason is not None and setting in inst.end_reason
    assert report.errors == [f"{inst.id}: {inst.end_reason}"]


def test_a_loopback_service_url_keeps_cloud_instances_from_booting_workers_that_never_sync(
    engine: Engine, cloud: FakeCloud
) -> None:
    """Built as the service builds it (:func:`api.fleet_service.build_fleet_executor`): with the default
    ``COSTOPT_SERVICE_URL`` (loopback) a cloud instance's worker could never sync, so nothing is launched
    and the instance says why; a routable URL launches."""
    clock = Clock(T0)
    jobs = JobRepository(engine, now=clock)
    service = SimpleNamespace(repo=jobs, clock=clock, ledger=None, providers={cloud.name: cloud.provider})
    repo = FleetRepository(engine, now=clock)
    fleet, _ = repo.create(
        NewFleet(
            team_id="team-a",
            policy="max_min_fairness",
            instances=(NewInstance(cloud.offer, cloud.accelerator, 1, cloud.name),),
            round_s=60.0,
        )
    )
    blocked = build_fleet_executor(Settings(), service)  # type: ignore[arg-type]
    report = blocked.tick()
    (inst,) = repo.instances(fleet.id)
    assert inst.state is InstanceState.PENDING and cloud.launches() == 0
    assert (
        inst.end_reason is not None and "COSTOPT_SERVICE_URL 'http://127.0.0.1:8000' is a loopback" in inst.end_reason
    )
    assert report.errors == [f"{inst.id}: {inst.end_reason}"]
    assert blocked.tick().errors == []  # said once

    routable = build_fleet_executor(Settings(service_url="https://costopt.example.com"), service)  # type: ignore[arg-type]
    assert routable.tick().launched == [inst.id] and cloud.launches() == 1
    launched = repo.instance(inst.id)
    assert launched is not None and launched.state is InstanceState.LAUNCHING
    assert launched.end_reason is None  # why it waited is gone with the launch


@pytest.mark.parametrize(
    ("url", "provider", "blocked"),
    [
        ("http://127.0.0.1:8000", "aws", True),
        ("http://localhost:8000", "gcp", True),
        ("http://[::1]:8000", "azure", True),
        ("http://127.8.9.10", "aws", True),
        ("http://api.localhost", "aws", True),
        ("costopt.example.com:8000", "aws", True),  # no scheme: not a URL urllib can post to
        ("http://127.0.0.1:8000", "local", False),
        ("http://127.0.0.1:8000", "sim", False),
        ("http://10.0.0.5:8000", "aws", False),
        ("https://costopt.example.com", "gcp", False),
    ],
)
def test_service_url_problem(url: str, provider: str, blocked: bool) -> None:
    assert (service_url_problem(Settings(service_url=url), provider) is not None) is blocked


def test_the_worker_variables_are_the_ones_the_worker_needs() -> None:
    from costopt.agent.worker import ENV_WORKER_POLL, WORKER_VARIABLES

    assert set(WORKER_VARIABLES) | {ENV_WORKER_POLL} == set(WORKER_VARS)
    assert os.path.basename(worker_command(Settings(), "aws")[0]) == "python3"


TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"


@pytest.mark.slow  # a real training process (numpy) besides the worker: 3-6 s at load 8-15
@pytest.mark.parametrize("cloud", ["aws"], indirect=True)
def test_a_worker_started_by_the_boot_script_runs_its_lease_to_the_end(
    engine: Engine, cloud: FakeCloud, service: LoopbackService, tmp_path: Path
) -> None:
    """The worker the EC2 user data started (in the boot script's bare environment) gets a round's lease,
    claims its epoch at the job's checkpoint location and runs ``examples/train.py`` (``python3`` found on
    the boot script's PATH, as on the image) to its last step: the job succeeds with exactly its steps,
    audited from the agent's log, none lost or repeated."""
    from costopt.agent import control
    from costopt.fleets.model import FLEET_PROVIDER, FleetJobStatus
    from costopt.fleets.store import NewFleetJob
    from costopt.jobs.model import JobState
    from costopt.jobs.records import NewJob

    rig = make_rig(engine, cloud, service_url=service.url, settings=Settings(fleet_worker_poll=0.2), clock=Clock())
    service.serve(rig.repo, rig.jobs)
    uri = f"file://{tmp_path}/ckpt/job-a"
    command = ["python3", str(TRAIN), "--steps", "30", "--checkpoint-every", "10", "--log-level", "WARNING"]
    spec = {"command": command, "checkpoint_uri": uri, "fleet_id": rig.fleet_id, "gpus": 1}
    job, _ = rig.jobs.insert(NewJob("team-a", spec, 30, FLEET_PROVIDER, job_id="job-a"))
    rig.repo.add_job(NewFleetJob("job-a", rig.fleet_id, "team-a", 1, {"v100": 30.0}, 30, job.created_at))
    rig.tick()
    inst = rig.only_instance()
    assert inst.instance_id is not None
    bin_dir = shim_python(tmp_path / "bin", f'exec {shlex.quote(sys.executable)} "$@"')
    proc = subprocess.Popen(
        ["bash", "-c", cloud.boot_script(inst.instance_id)],
        env=boot_env(bin_dir, tmp_path),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def finished() -> bool:
        rig.tick()  # the service's scheduler: the round starts once the worker synced
        fj = rig.repo.job("job-a")
        # the sync that reports the exit records the fleet job, then the job's row (the service thread's
        # next statement): wait for both, or a poll between the two sees the job still running
        return fj is not None and fj.status.finished and rig.jobs.get("job-a").state.terminal

    try:
        wait_for("the job's end", finished, proc, timeout_s=60)
        fj = rig.repo.job("job-a")
        assert fj is not None and fj.status is FleetJobStatus.DONE and fj.steps_done == 30, fj
        assert rig.jobs.get("job-a").state is JobState.SUCCEEDED
        rig.repo.release(rig.fleet_id)
        assert rig.tick().released == [inst.id] and not cloud.exists(inst.instance_id)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    audit = control.audit_job(uri, 30)
    assert audit.ok and audit.runs == 1 and audit.steps_done == 30, audit
