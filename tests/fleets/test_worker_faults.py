"""A fleet worker killed with SIGKILL mid-round (its instance's process dies): its job loses at most the
steps since its last checkpoint, resumes elsewhere under a new epoch (the old copy can never write again),
and the fleet goes on with the others; a replacement instance is launched. Real service, real processes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from api.fleet_validate import LiveJob, LiveService, ValidationSetup
from costopt.agent import control
from costopt.db.engine import make_engine
from costopt.fleets.store import FleetRepository
from costopt.jobs.records import JobRepository
from costopt.settings import Settings
from providers.local import LocalProvider

RATES = {"k80": 20.0, "p100": 20.0, "v100": 20.0}
SETUP = ValidationSetup(jobs=2, round_s=4.0, per_label=1, checkpoints_per_job=10, dead_after_s=3.0, timeout_s=90)


@pytest.mark.slow
def test_a_worker_killed_mid_round_loses_only_steps_since_the_last_checkpoint(tmp_path: Path) -> None:
    jobs = [LiveJob(f"j{i}", "x", 0.0, 240, RATES) for i in range(2)]  # 12 s each, a checkpoint every 24 steps
    with LiveService(tmp_path, SETUP, Settings()) as svc:
        fleet_id = svc.lease("max_min_fairness", {"v100": 3})
        ids = [svc.submit(j, fleet_id) for j in jobs]
        deadline = time.monotonic() + 30
        while True:  # both stepping, past their first checkpoint
            doc = svc.fleet(fleet_id)
            if all(j["checkpoint_step"] >= 24 and j["holder"] for j in doc["jobs"]):
                break
            assert time.monotonic() < deadline, doc["jobs"]
            time.sleep(0.2)
        victim = doc["jobs"][0]
        (inst,) = [i for i in doc["instances"] if i["id"] == victim["holder"]]
        worker_pid = LocalProvider(svc.settings.local_provider_dir).status(inst["instance_id"]).pid
        assert worker_pid is not None
        os.kill(worker_pid, signal.SIGKILL)  # the worker only: its job dies with it (PR_SET_PDEATHSIG)
        assert svc.wait(fleet_id, 2, 60) == 2
        final = svc.fleet(fleet_id)
        svc.release(fleet_id)
    assert all(j["status"] == "done" for j in final["jobs"])
    lost = [i for i in final["instances"] if i["id"] == inst["id"]]
    # seen by the provider (the process ended) or by the silence of its worker, whichever comes first
    assert lost[0]["state"] == "lost" and lost[0]["end_reason"] in (
        "the instance is terminated",
        *(r for r in [lost[0]["end_reason"]] if "not synced" in r),
    )
    assert any(i["replaces"] == inst["id"] for i in final["instances"])
    engine = make_engine(svc.settings.database_url)
    try:
        records = JobRepository(engine)
        for job_id in ids:
            uri = str(records.get(job_id).spec["checkpoint_uri"])
            audit = control.audit_job(uri, 240)
            assert audit.finished and audit.lost_steps == 0 and audit.repeated_steps == 0, audit
            assert audit.wasted_steps <= 24 + 2  # at most the steps since the last checkpoint (and one in flight)
        victim_job = FleetRepository(engine).job(victim["job_id"])
        assert victim_job is not None and victim_job.epoch >= 2  # resumed under a new epoch
    finally:
        engine.dispose()
