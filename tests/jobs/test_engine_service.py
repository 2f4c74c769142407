"""The job service's assembly (api/service.py) on both backends: one set of migrators shared by the engine,
the watcher and the reconciler, billed to the ledger at the store's prices; a job run through it end to
end on the local provider costs what its copies' intervals cost at those prices; the watcher recovers a
managed job on the job's own placements."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from api.service import build_job_service, managed_offers_for
from costopt.domain import Cloud, Market, OfferKey, PricePoint
from costopt.jobs.model import JobState
from costopt.jobs.records import NewJob
from costopt.ledger.model import micro_to_usd, usd_to_micro
from costopt.migration.records import JobStatus
from costopt.settings import Settings
from pricing.store import PriceStore
from providers.local import LocalProvider
from tests.jobs.engine_support import LOCAL_A, LOCAL_B, PRICES, FixedPlacements, train_command


def _service(engine, local: LocalProvider, tmp_path: Path, offers=(LOCAL_A, LOCAL_B)):
    store = PriceStore(engine, mirror_max_points=0)
    since = datetime.now(UTC) - timedelta(hours=1)
    store.write([PricePoint(k, since, p, "test") for k, p in PRICES.items()])
    settings = Settings(
        database_url="sqlite://",
        provider="local",
        checkpoint_root=str(tmp_path / "ckpt"),
        launch_attempts=2,
        engine_workers=2,
    )
    svc = build_job_service(settings, store, {Cloud.LOCAL: local}, placements=FixedPlacements(offers))
    for m in svc.migrators.values():  # poll like the drills do: this machine answers in milliseconds
        m.poll_seconds = 0.05
    return svc


def test_the_service_shares_one_set_of_migrators_and_bills_at_the_store_prices(engine, local, tmp_path: Path) -> None:
    svc = _service(engine, local, tmp_path)
    try:
        assert svc.engine.migrators == dict(svc.migration.migrators) and set(svc.migrators) == {"local"}
        assert svc.engine.ledger is svc.ledger and svc.engine.launch_attempts == 2
        job, _ = svc.repo.create(
            NewJob(team_id="t", spec={"command": train_command(50)}, steps_total=50, provider="local")
        )
        end = time.monotonic() + 60
        while not svc.repo.get(job.id).state.terminal:
            assert time.monotonic() < end, svc.repo.events(job.id)
            svc.engine.tick()
            time.sleep(0.05)
        done = svc.repo.get(job.id)
        assert done.state is JobState.SUCCEEDED, done.reason
        assert svc.engine.checkpoint_uri(done) == str(tmp_path / "ckpt" / job.id)
        (copy,) = svc.migrators["local"].copies(job.id)
        assert copy.ended_at is not None and copy.ledger_closed and copy.ledger_error is None
        micros = (copy.ended_at - copy.started_at) // timedelta(microseconds=1)
        expected = micro_to_usd(usd_to_micro(Decimal(micros).scaleb(-6) * Decimal(repr(PRICES[LOCAL_A])) / 3600))
        assert svc.cost(job.id) == expected > 0
        assert svc.engine.view(job.id).cost_so_far_usd == expected
    finally:
        svc.close()


def test_the_watcher_recovers_a_managed_job_on_its_own_placements(engine, local, tmp_path: Path) -> None:
    svc = _service(engine, local, tmp_path, offers=(LOCAL_B, LOCAL_A))
    try:
        job, _ = svc.repo.create(NewJob(team_id="t", spec={"command": ["true"]}, steps_total=5, provider="local"))
        watcher = svc.migration.watchers["local"]
        migrator = svc.migrators["local"]
        mj = migrator.register_job(job.id, ["true"], str(tmp_path / "c"))
        assert watcher.offers_for(mj) == []  # queued: the engine launches it, not the watcher
        svc.repo.transition(job.id, JobState.LAUNCHING, "test")
        svc.repo.transition(job.id, JobState.RUNNING, "test", offer=LOCAL_A)
        assert watcher.offers_for(mj) == [LOCAL_B, LOCAL_A]  # its ranked placements
        other = migrator.register_job("drill-job", ["true"], str(tmp_path / "d"))
        drill_offer = OfferKey(Cloud.LOCAL, "local", "drill", "cpu-drill", Market.ON_DEMAND)
        fallback = managed_offers_for(svc.repo, svc.engine, lambda j: [drill_offer])
        assert fallback(other) == [drill_offer]  # not a managed job: the drill's recovery offers
        assert migrator.job(job.id).status is JobStatus.PENDING
    finally:
        svc.close()
