"""Where the service recovers a job whose copy was lost, and the migration jobs it schedules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.recovery import recovery_offers
from api.scheduler import RECONCILE_JOB_ID, WATCH_JOB_ID, build_migration_jobs
from api.wiring import build_store, seed_catalog
from costopt.domain import Cloud, Market, OfferKey, PricePoint
from costopt.migration.records import JobRecord, JobStatus
from costopt.migration.unavailable import REASON_CAPACITY, REASON_PREEMPTED, REASON_QUOTA
from costopt.settings import Settings
from pricing.store import PriceStore

T0 = datetime(2026, 3, 2, 12, tzinfo=UTC)
LOST = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)


def _settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings(database_url=f"sqlite:///{tmp_path / 'svc.db'}", clock="replay", seed_on_start=False, **kw)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> PriceStore:
    settings = _settings(tmp_path)
    st = build_store(settings)
    seed_catalog(st, settings)
    prices = {
        LOST: 0.90,
        OfferKey(Cloud.AWS, "us-east-1", "us-east-1b", "p3.2xlarge", Market.SPOT): 0.80,
        OfferKey(Cloud.AWS, "us-west-2", "us-west-2a", "p3.2xlarge", Market.SPOT): 0.85,
        OfferKey(Cloud.AWS, "us-east-1", "", "p3.2xlarge", Market.ON_DEMAND): 3.06,
        OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.8xlarge", Market.SPOT): 1.00,  # 4 GPUs: not alike
        OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p2.xlarge", Market.SPOT): 0.30,  # a K80: not alike
        OfferKey(Cloud.AZURE, "eastus", "", "Standard_NC6s_v3", Market.SPOT): 0.50,  # another cloud
    }
    st.write([PricePoint(k, T0 - timedelta(hours=1), p, "test", observed_at=T0) for k, p in prices.items()])
    return st


def job_on(offer: OfferKey | None) -> JobRecord:
    return JobRecord("job-1", "aws", ("python", "train.py"), {}, "/tmp/ckpt", 3, "i-1", offer, JobStatus.RECOVERING, "")


def test_a_job_is_recovered_on_the_same_gpu_cheapest_spot_first_and_its_lost_offer_last(
    store: PriceStore, tmp_path: Path
) -> None:
    got = recovery_offers(store, _settings(tmp_path), job_on(LOST))
    assert got == [
        OfferKey(Cloud.AWS, "us-east-1", "us-east-1b", "p3.2xlarge", Market.SPOT),
        OfferKey(Cloud.AWS, "us-west-2", "us-west-2a", "p3.2xlarge", Market.SPOT),
        OfferKey(Cloud.AWS, "us-east-1", "", "p3.2xlarge", Market.ON_DEMAND),
        LOST,
    ]
    assert recovery_offers(store, _settings(tmp_path), job_on(LOST), limit=2) == [got[0], LOST]


def test_an_offer_without_a_price_is_recovered_in_place_and_no_offer_gives_none(
    store: PriceStore, tmp_path: Path
) -> None:
    here = OfferKey(Cloud.LOCAL, "local", "local-a", "cpu-1", Market.SPOT)
    assert recovery_offers(store, _settings(tmp_path), job_on(here)) == [here]
    assert recovery_offers(store, _settings(tmp_path), job_on(None)) == []


def test_the_migration_jobs_bill_to_the_ledger_and_keep_the_settings_ttls(store: PriceStore, tmp_path: Path) -> None:
    settings = _settings(
        tmp_path,
        provider="local",
        local_provider_dir=tmp_path / "local",
        unavailable_ttl_preempted=timedelta(minutes=7),
        unavailable_ttl_capacity=timedelta(minutes=8),
        unavailable_ttl_quota=timedelta(minutes=9),
        reconcile_interval=timedelta(minutes=2),
    )
    jobs = build_migration_jobs(settings, store)
    assert list(jobs.providers) == ["local"]
    migrator = jobs.migrators["local"]
    assert migrator.ledger is not None and migrator.unavailable is jobs.unavailable
    assert (
        jobs.unavailable.ttl[REASON_PREEMPTED],
        jobs.unavailable.ttl[REASON_CAPACITY],
        jobs.unavailable.ttl[REASON_QUOTA],
    ) == (timedelta(minutes=7), timedelta(minutes=8), timedelta(minutes=9))
    assert jobs.reconcile_interval == timedelta(minutes=2)


def test_the_service_schedules_the_migration_jobs_only_when_enabled(tmp_path: Path) -> None:
    base = {"provider": "local", "local_provider_dir": tmp_path / "local", "collectors_enabled": False}
    with TestClient(create_app(_settings(tmp_path, migration_jobs_enabled=True, **base))) as client:
        scheduler = client.app.state.scheduler  # type: ignore[attr-defined]
        ids = {j.id for j in scheduler.get_jobs()}
        assert {RECONCILE_JOB_ID, WATCH_JOB_ID} <= ids and not any(i.startswith("collect:") for i in ids)
        assert client.get("/livez").status_code == 200
    assert Settings().migration_jobs_enabled  # on by default (make run runs jobs)
    with TestClient(create_app(_settings(tmp_path, migration_jobs_enabled=False, **base))) as client:
        assert client.app.state.scheduler is None  # type: ignore[attr-defined]


def test_on_the_simulated_cloud_a_checkpoint_request_may_wait_one_tick_of_the_clock_driver(
    store: PriceStore, tmp_path: Path
) -> None:
    # The agents see a request at the start of the next tick, which may move the clock up to the cap
    # (COSTOPT_SIM_MAX_TICK): a timeout shorter than a tick rolled every move back on a loaded machine.
    from providers.sim import SimCloud

    def timeouts(**kw: object) -> tuple[float, float]:
        settings = _settings(tmp_path, provider="sim", sim_time_scale=600.0, sim_tick=timedelta(seconds=0.2), **kw)
        migrator = build_migration_jobs(settings, store).migrators["sim"]
        return migrator.checkpoint_timeout, migrator.verify_timeout

    own = SimCloud(prices=None, start=T0).migrator_timeouts()  # type: ignore[arg-type]  # no price read
    assert own["checkpoint_timeout"] == 420.0  # boot 3 min + restore 2 + checkpoint 1 + 1 min
    assert timeouts() == (420.0 + 5 * 0.2 * 600.0, own["verify_timeout"])  # the default cap: 5 nominal ticks
    assert timeouts(sim_max_tick=timedelta(minutes=2)) == (420.0 + 120.0, own["verify_timeout"])


def test_the_services_watchers_recover_side_by_side(store: PriceStore, tmp_path: Path) -> None:
    base = {"provider": "local", "local_provider_dir": tmp_path / "local"}
    assert build_migration_jobs(_settings(tmp_path, **base), store).watchers["local"].workers == 8
    jobs = build_migration_jobs(_settings(tmp_path, recovery_workers=3, **base), store)
    assert jobs.watchers["local"].workers == 3
    assert jobs.watchers["local"].cap == 3  # the cap counts the recoveries active in the database
