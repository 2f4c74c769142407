"""The simulated fleet worker on its own (no database): a spec carrying the worker's variables runs the real
worker's protocol over simulated agents, against a scripted service (the transport). Boot, heartbeats,
a lease started at its epoch with the job's throughput, progress read from the agent's log, a lease ended
(checkpoint, exit 75, acknowledged), a job the cloud cannot simulate, release (exit 0, instance ended)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from costopt.agent import control, job_env
from costopt.agent.contract import contract_env
from costopt.agent.worker import WorkerConfig
from costopt.cloud import InstanceState, LaunchSpec
from costopt.domain import Cloud, Market, OfferKey
from costopt.ledger import StepPrices
from costopt.risk.hazard import HazardModel
from costopt.simulated import WorkloadTiming
from providers.sim import SimCloud, SimConfig
from providers.sim_worker import SimWorker
from tests.price_support import step_prices

START = datetime(2020, 3, 1, tzinfo=UTC)
OFFER = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)
TIMING = WorkloadTiming(restore=timedelta(seconds=30), checkpoint=timedelta(seconds=20))
POLL = timedelta(seconds=60)


class Service:
    """A scripted service: records every sync and answers the desired state the test sets."""

    def __init__(self) -> None:
        self.reports: list[tuple[datetime, Mapping[str, Any]]] = []
        self.run: list[dict[str, Any]] = []
        self.release = False
        self.clock: SimCloud | None = None

    def transport(self, config: WorkerConfig) -> Any:
        def post(path: str, doc: Mapping[str, Any]) -> Mapping[str, Any]:
            assert path == f"/v1/fleet-workers/{config.worker_id}/sync" and config.token == "secret"
            assert self.clock is not None
            self.reports.append((self.clock.now(), doc))
            exited = [{"job_id": c["job_id"], "epoch": c["epoch"]} for c in doc["copies"] if c["state"] == "exited"]
            answer: dict[str, Any] = {"round": 1, "round_ends_at": None, "poll_s": 0.5, "waiting": 0}
            answer.update(run=self.run, ack=exited, release=self.release)
            return answer

        return post

    def copies(self, job_id: str) -> list[Mapping[str, Any]]:
        return [c for _, doc in self.reports for c in doc["copies"] if c["job_id"] == job_id]


def _prices() -> StepPrices:
    return step_prices([(OFFER, START - timedelta(days=1), 3.06)])


@pytest.fixture
def rig() -> tuple[SimCloud, Service, str]:
    cloud = SimCloud(_prices(), HazardModel(), start=START, config=SimConfig(timing=TIMING, worker_poll=POLL))
    service = Service()
    service.clock = cloud
    cloud.attach_fleet(service.transport)
    env = {
        "COSTOPT_SERVICE_URL": "http://svc",
        "COSTOPT_FLEET_ID": "fleet-1",
        "COSTOPT_WORKER_ID": "fi-1",
        "COSTOPT_WORKER_TOKEN": "secret",
        "COSTOPT_WORKER_GPUS": "1",
    }
    inst = cloud.launch(LaunchSpec(offer=OFFER, command=["python3", "-m", "costopt.agent.worker"], env=env), "t-1")
    return cloud, service, inst.instance_id


def _lease(uri: str, epoch: int = 1, steps: int = 3000, rate: float | None = 2.0) -> dict[str, Any]:
    env = {**contract_env("job-1", uri, epoch), **job_env(steps, steps_per_second=rate)}
    return {"job_id": "job-1", "epoch": epoch, "gpus": [0], "command": ["x"], "env": env, "checkpoint_uri": uri}


def test_the_worker_boots_heartbeats_runs_a_lease_stops_it_at_its_end_and_ends_when_released(
    rig: tuple[SimCloud, Service, str], tmp_path: Path
) -> None:
    cloud, service, iid = rig
    cloud.run_to(START + timedelta(minutes=2))
    assert service.reports == []  # booting (3 minutes)
    cloud.run_to(START + timedelta(minutes=6))
    times = [t for t, _ in service.reports]
    assert times == [START + timedelta(minutes=m) for m in (3, 4, 5, 6)]  # first sync at boot, then every poll
    uri = str(tmp_path / "job-1")
    service.run = [_lease(uri)]
    cloud.run_to(START + timedelta(minutes=16))
    assert control.current_epoch(uri) == 1  # claimed by the worker before the copy started
    running = service.copies("job-1")
    assert running and all(c["state"] == "running" for c in running)
    # progress is the agent's own log, flushed at each sync: 2 steps/s from the lease's start (7 min)
    last = running[-1]
    assert last["step"] == control.progress(uri, 1).last_step == 2 * (16 - 7) * 60
    # the lease ends: the copy checkpoints (20 s) and exits 75; the exit is reported at once, then dropped
    service.run = []
    cloud.run_to(START + timedelta(minutes=18))
    exited = [c for c in service.copies("job-1") if c["state"] == "exited"]
    assert len(exited) == 1 and exited[0]["exit_code"] == 75
    assert exited[0]["checkpoint_step"] == exited[0]["step"] == 2 * (17 - 7) * 60  # durable where it stopped
    assert exited[0]["ended_at"] == (START + timedelta(minutes=17, seconds=20)).timestamp()
    assert service.reports[-1][0] == START + timedelta(minutes=17, seconds=20)  # the exit's own sync
    cloud.run_to(START + timedelta(minutes=19))
    assert service.reports[-1][1]["copies"] == []  # acknowledged: not reported again at the next poll
    assert cloud.describe(iid).state is InstanceState.RUNNING  # the worker goes on without a job
    service.release = True
    cloud.run_to(START + timedelta(minutes=21))
    assert cloud.describe(iid).state is InstanceState.TERMINATED  # released: the worker ended (exit 0)
    console = cloud.output(iid)
    assert "worker up" in console and "[job-1 e1] exit 75" in console and "released by the service" in console


def test_a_lease_the_cloud_cannot_simulate_is_a_failed_copy_and_a_killed_worker_is_silent(
    rig: tuple[SimCloud, Service, str], tmp_path: Path
) -> None:
    cloud, service, iid = rig
    uri = str(tmp_path / "job-1")
    service.run = [_lease(uri, rate=None)]  # no throughput and no job type: the cloud cannot tell its speed
    cloud.run_to(START + timedelta(minutes=4))
    (failed,) = {(c["state"], c["exit_code"]) for c in service.copies("job-1")}
    assert failed == ("exited", 1)
    worker = cloud._instances[iid].agent
    assert isinstance(worker, SimWorker)
    n = len(service.reports)
    cloud.preempt(iid, notice=timedelta(0))
    cloud.run_to(START + timedelta(minutes=30))
    assert len(service.reports) == n and not worker.running  # gone with its instance, without a word
