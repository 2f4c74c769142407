"""A fleet on the service as ``make run`` configures it: the simulated cloud (``COSTOPT_PROVIDER=sim``), its
clock moved by the service's driver faster than real time (``COSTOPT_SIM_TIME_SCALE``), the service's own
round executor ticking every ``COSTOPT_FLEET_TICK`` wall seconds in a thread, as the scheduler runs it. A team
leases a fleet over REST (``POST /v1/fleets``) and submits jobs into it (``POST /v1/jobs`` with ``fleet_id``);
its instances run simulated workers: the jobs finish with exactly their steps, each job's cost is its
ledger lines, and the fleet's cost is its jobs' plus its idle time (both backends).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from api.fleet_service import fleets_job
from api.sim_clock import SimClockDriver
from costopt.agent import control
from costopt.fleets.executor import FleetExecutor
from providers.sim import SimCloud
from tests.api.jobs_helpers import JOB_TYPE, Service, service

V100 = {"cloud": "aws", "region": "us-east-1", "zone": "us-east-1a", "instance_type": "p3.2xlarge", "market": "spot"}
K80 = {"cloud": "aws", "region": "us-east-1", "zone": "us-east-1b", "instance_type": "p2.xlarge", "market": "spot"}
SCALE = 600.0  # simulated seconds per wall second (make run's default)


@pytest.fixture
def svc(engine: Engine, tmp_path: Path) -> Iterator[Service]:
    yield from service(engine, tmp_path, sim_time_scale=SCALE, fleet_tick=0.5)


class Loops:
    """The service's two loops of a fleet: the simulated clock's driver and the executor's tick (the
    ``fleets`` scheduled job), each in its thread, on the service's own objects."""

    def __init__(self, sim: SimCloud, executor: FleetExecutor, tick_s: float) -> None:
        self.driver = SimClockDriver(sim, scale=SCALE, tick=0.05)
        self.executor = executor
        self.tick_s = tick_s
        self.stop = threading.Event()
        self.failures: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name="fleets", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                fleets_job(self.executor)
            except BaseException as exc:
                self.failures.append(exc)
            self.stop.wait(self.tick_s)

    def __enter__(self) -> Loops:
        self.driver.start()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.driver.stop()


@pytest.mark.slow  # wall-clock bound: ~50 simulated minutes at 600x, plus the release
def test_a_fleet_leased_over_rest_on_the_simulated_cloud_runs_its_jobs_to_the_end(svc: Service) -> None:
    settings = svc.app.state.settings
    assert settings.provider == "sim"
    sim = svc.app.state.providers["sim"]
    assert isinstance(sim, SimCloud) and sim.fleet_transport is not None  # the service attached its workers
    body = {
        "name": "lab",
        "policy": "max_min_fairness_perf",
        "instances": [{"offer": V100, "count": 2}, {"offer": K80}],
    }
    r = svc.client.post("/v1/fleets", json=body, headers=svc.alpha)
    assert r.status_code == 201, r.text
    fleet = r.json()
    assert {i["provider"] for i in fleet["instances"]} == {"sim"}

    def submit(steps: int) -> str:
        r = svc.client.post(
            "/v1/jobs",
            json={"job_type": JOB_TYPE, "steps": steps, "command": ["python", "train.py"], "fleet_id": fleet["id"]},
            headers=svc.alpha,
        )
        assert r.status_code == 201, r.text
        job_id: str = r.json()["id"]
        return job_id

    jobs = {submit(500): 500}
    shown = svc.client.get(f"/v1/fleets/{fleet['id']}", headers=svc.alpha).json()
    v100_rate = shown["jobs"][0]["throughput"]["v100"]  # the catalog's ResNet-50 throughput on a V100
    for minutes in (12, 8, 10):  # training time on a V100 alone
        steps = int(v100_rate * 60 * minutes)
        jobs[submit(steps)] = steps
    start = time.monotonic()
    with Loops(sim, svc.app.state.fleet_executor, settings.fleet_tick) as loops:
        while True:
            doc = svc.client.get(f"/v1/fleets/{fleet['id']}", headers=svc.alpha).json()
            if all(j["status"] in ("done", "failed", "cancelled") for j in doc["jobs"]):
                break
            assert not loops.failures, loops.failures
            assert time.monotonic() - start < 90, ([(j["status"], j["steps_done"]) for j in doc["jobs"]], sim.now())
            time.sleep(0.25)
        doc = svc.client.get(f"/v1/fleets/{fleet['id']}", headers=svc.alpha).json()
        assert svc.client.post(f"/v1/fleets/{fleet['id']}/release", headers=svc.alpha).status_code == 202
        deadline = time.monotonic() + 30
        while True:  # released: every instance ends, every round is billed
            doc = svc.client.get(f"/v1/fleets/{fleet['id']}", headers=svc.alpha).json()
            if all(i["state"] in ("released", "lost") for i in doc["instances"]):
                break
            assert time.monotonic() < deadline, doc["instances"]
            time.sleep(0.1)
    wall = time.monotonic() - start
    fleets_job(svc.app.state.fleet_executor)  # bills what ended since the last pass
    doc = svc.client.get(f"/v1/fleets/{fleet['id']}", headers=svc.alpha).json()
    # every instance's money is final: billed to its end (released or lost)
    assert all(i["ended_at"] and i["billed_to"] == i["ended_at"] for i in doc["instances"]), doc["instances"]
    assert wall < 60
    assert doc["round"] is not None and doc["round"]["number"] >= 2
    costs = Decimal(0)
    for job_id, steps in jobs.items():
        job = svc.client.get(f"/v1/jobs/{job_id}", headers=svc.alpha).json()
        assert job["state"] == "succeeded" and job["steps_done"] == steps and job["provider"] == "fleet"
        audit = control.audit_job(svc.jobs.get(job_id).spec["checkpoint_uri"], steps)
        assert audit.finished and audit.steps_done == steps and audit.lost_steps == 0 and audit.repeated_steps == 0
        assert Decimal(job["cost_so_far_usd"]) > 0
        costs += Decimal(job["cost_so_far_usd"])
    fj: dict[str, Any] = {j["job_id"]: j for j in doc["jobs"]}
    assert {fj[j]["status"] for j in jobs} == {"done"}
    # the allocation integral: the policy's time fractions since arrival, folded in at each boundary and,
    # for a job's last round, up to its finish: every job ran, so every one has leases and allocation counted
    credited = [j for j in jobs if fj[j]["received_s"]]
    assert credited == list(jobs), [fj[j] for j in jobs]
    for j in credited:
        life = (
            datetime.fromisoformat(fj[j]["finished_at"]) - datetime.fromisoformat(fj[j]["arrived_at"])
        ).total_seconds()
        assert fj[j]["owed_at"] is not None and set(fj[j]["owed_s"]) <= {"v100", "k80"}
        assert 0 < sum(fj[j]["owed_s"].values()) <= life + doc["round_s"], (fj[j], life)
    assert Decimal(doc["cost_so_far_usd"]) == costs + Decimal(doc["idle_cost_usd"]) > 0
