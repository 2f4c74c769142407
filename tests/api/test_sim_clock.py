"""The service's simulated time: the driver moves the simulated cloud's clock by wall time x scale (an
injected wall clock: no timed assertions), it is the service's clock over the simulated cloud, and the
wiring gives the simulated agents their throughput from the catalog and shares one simulated cloud per
price store."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol, cast

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine

from api.sim_clock import _DRIVERS_LOCK, HOLD_S, SimClockDriver, driver_for, service_clock, start_sim_clock
from api.wiring import build_catalog, build_cloud_provider, build_sim_throughput, build_store
from costopt.agent import control, job_env
from costopt.agent.contract import contract_env
from costopt.clock import ServiceClock, WallClock
from costopt.cloud import LaunchSpec
from costopt.domain import Cloud, Market, OfferKey
from costopt.risk.hazard import HazardModel
from costopt.settings import Settings
from costopt.simulated import SimEvent
from providers.sim import SimCloud
from tests.price_support import step_prices

START = datetime(2020, 3, 1, tzinfo=UTC)
OFFER = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)


class Wall:
    """Monotonic seconds moved by hand (or by ``step`` at every read)."""

    def __init__(self, step: float = 0.0) -> None:
        self.t = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def _cloud() -> SimCloud:
    prices = step_prices([(OFFER, START - timedelta(days=1), 3.06)])
    return SimCloud(prices, HazardModel(defaults=dict.fromkeys(Cloud, 0.0)), start=START)


def test_each_tick_moves_the_clock_by_the_wall_time_elapsed_times_the_scale(tmp_path: Path) -> None:
    cloud = _cloud()
    wall = Wall()
    driver = SimClockDriver(cloud, scale=600.0, max_tick=3600.0, wall=wall)  # no tick reaches the cap
    assert driver.advance() == START  # the first tick only takes the wall clock's reading
    wall.t += 1.5
    assert driver.advance() == START + timedelta(seconds=900)
    wall.t += 0.25
    assert driver.advance() == START + timedelta(seconds=1050)
    assert driver.advance() == START + timedelta(seconds=1050)  # no wall time, no simulated time


def test_a_job_progresses_as_the_driver_ticks(tmp_path: Path) -> None:
    cloud = _cloud()
    uri = str(tmp_path / "ckpt")
    spec = LaunchSpec(offer=OFFER, env={**contract_env("job-1", uri, 1), **job_env(3000, steps_per_second=1.0)})
    inst = cloud.launch(spec, "t1")
    wall = Wall()
    driver = SimClockDriver(cloud, scale=600.0, wall=wall)
    driver.advance()
    seen = []
    for _ in range(12):  # 12 wall seconds = 2 simulated hours
        wall.t += 1.0
        driver.advance()
        seen.append(control.progress(uri, 1).last_step)
    assert seen[0] == 1 and seen == sorted(seen) and seen[-1] == 3000  # booted by 10 min: its first step
    assert cloud.describe(inst.instance_id).exit_code == 0


def test_a_tick_moves_the_clock_in_slices_letting_the_clock_go_between_them() -> None:
    """A tick holds the cloud's lock for at most HOLD_S simulated seconds at a time (one ``run_to`` a slice):
    another thread's call to the cloud (the engine's describe, a migrator's launch) made while the tick runs
    can take the lock between two slices, not only after the whole tick (the soak: 2-6 s of wall time under
    one hold, the engine waiting)."""
    cloud = _cloud()
    wall = Wall()
    driver = SimClockDriver(cloud, scale=600.0, max_tick=3600.0, wall=wall)
    driver.advance()
    real_run_to = cloud.run_to
    moves: list[tuple[datetime, datetime]] = []
    seen_by_other: list[datetime] = []
    other = threading.Thread(target=lambda: seen_by_other.append(_locked_now(cloud)))

    def spied_run_to(at: datetime) -> list[SimEvent]:
        moves.append((cloud.now(), at))
        if len(moves) == 1:  # the other thread asks while the first slice holds the lock
            with cloud._lock:
                other.start()
                other.join(0.2)  # it waits for the lock (not a timing assertion: it must still be waiting)
                assert other.is_alive()
                return real_run_to(at)
        return real_run_to(at)

    cloud.run_to = spied_run_to  # type: ignore[method-assign]
    wall.t += 1.0  # 600 simulated seconds: 20 slices of 30
    assert driver.advance() == START + timedelta(seconds=600)
    other.join(5.0)
    assert not other.is_alive()
    assert len(moves) == int(600 // HOLD_S)
    assert all(timedelta(0) < to - at <= timedelta(seconds=HOLD_S) for at, to in moves)
    assert [to for _, to in moves] == sorted(to for _, to in moves) and moves[-1][1] == START + timedelta(seconds=600)
    # the other thread's call ran once the first slice let the lock go (each slice is one hold: run_to)
    assert seen_by_other[0] >= START + timedelta(seconds=HOLD_S)


def _locked_now(cloud: SimCloud) -> datetime:
    with cloud._lock:
        return cloud.now()


def test_the_thread_ticks_until_stopped_and_sleepers_wait_for_it() -> None:
    cloud = _cloud()
    # every tick reads 1 s of wall time for a 1 ms tick: uncapped here (the cap has its own tests)
    driver = SimClockDriver(cloud, scale=60.0, tick=0.001, max_tick=60.0, wall=Wall(step=1.0))
    driver.start()
    try:
        assert driver.running
        driver.sleep(600.0)  # returns once the thread moved the clock ten simulated minutes
        assert cloud.now() >= START + timedelta(seconds=600)
    finally:
        driver.stop()
    assert not driver.running
    assert cloud.now() == START + timedelta(seconds=60.0 * (driver.ticks - 1))
    before = cloud.now()
    driver.sleep(30.0)  # not running: the sleeper moves the clock itself
    assert cloud.now() == before + timedelta(seconds=30)


def test_sleepers_that_move_the_clock_themselves_side_by_side_never_fail() -> None:
    """A stopped driver's sleepers (the shutdown's: the work waiting on the clock goes on) each move the clock;
    another may move it past one's target between its read and its move (the soak's ``ClockError`` engine
    errors): that sleep is over, not failed."""
    cloud = _cloud()
    driver = SimClockDriver(cloud, scale=600.0, wall=Wall())  # never started: sleepers move the clock
    real_run_to = cloud.run_to
    calls: list[datetime] = []

    def raced_run_to(at: datetime) -> list[SimEvent]:
        calls.append(at)
        if len(calls) == 1:
            real_run_to(at + timedelta(seconds=5))  # the other sleeper, between this one's read and its move
        return real_run_to(at)

    cloud.run_to = raced_run_to  # type: ignore[method-assign]
    driver.sleep(30.0)  # raised ClockError: run_until(START + 30 s) is before now (START + 35 s)
    assert cloud.now() == START + timedelta(seconds=35)
    driver.sleep(10.0)  # an ordinary sleep after it
    assert cloud.now() == START + timedelta(seconds=45)


def test_a_late_tick_moves_the_clock_at_most_the_cap_and_the_driver_says_it_is_behind_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cloud = _cloud()
    wall = Wall()
    driver = SimClockDriver(cloud, scale=3600.0, tick=0.2, wall=wall)
    assert driver.max_tick == 3600.0  # the default: 5 nominal ticks of 0.2 s x 3600
    caplog.set_level(logging.WARNING, logger="costopt.sim_clock")
    driver.advance()
    wall.t += 1.0  # 5 nominal ticks late: still scale x wall
    assert driver.advance() == START + timedelta(hours=1) and driver.capped_ticks == 0
    wall.t += 40.0  # a tick 200 times late (50 agents on a loaded machine): 40 simulated hours uncapped
    assert driver.advance() == START + timedelta(hours=2)
    assert driver.lag == timedelta(hours=39) and driver.capped_ticks == 1
    wall.t += 0.2  # a tick on time moves as before
    assert driver.advance() == START + timedelta(hours=2, minutes=12)
    for _ in range(5):  # late again within the minute: counted, not logged
        wall.t += 10.0
        driver.advance()
    assert driver.now() == START + timedelta(hours=7, minutes=12)
    assert driver.lag == timedelta(hours=39 + 5 * 9) and driver.capped_ticks == 6
    behind = [r.getMessage() for r in caplog.records if "behind" in r.getMessage()]
    assert len(behind) == 1, behind
    assert "after 40.0 s of wall time" in behind[0] and "140400 simulated s behind" in behind[0]
    assert "slower than 3600x" in behind[0]
    wall.t += 20.0  # 70 s of wall time after the first line: the next capped tick says so again
    driver.advance()
    behind = [r.getMessage() for r in caplog.records if "behind" in r.getMessage()]
    assert len(behind) == 2 and "6 capped tick(s) since the last such line" in behind[1], behind


def test_the_cap_comes_from_the_settings_and_must_be_positive() -> None:
    cloud = _cloud()
    driver = SimClockDriver.from_settings(Settings(sim_max_tick=timedelta(minutes=3)), cloud)
    assert driver.max_tick == 180.0
    assert SimClockDriver.from_settings(Settings(sim_time_scale=600.0), cloud).max_tick == 600.0  # 10 minutes
    with pytest.raises(ValidationError, match="COSTOPT_SIM_MAX_TICK"):
        Settings(sim_max_tick=timedelta(0))
    with pytest.raises(ValueError, match="cap"):
        SimClockDriver(cloud, scale=600.0, max_tick=float("inf"))


def test_the_running_drivers_lag_is_a_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    import weakref

    import api.sim_clock
    from api.metrics import render

    drivers: weakref.WeakKeyDictionary[SimCloud, SimClockDriver] = weakref.WeakKeyDictionary()
    monkeypatch.setattr(api.sim_clock, "_DRIVERS", drivers)  # none of the other tests' services in this process
    cloud = _cloud()
    driver = SimClockDriver(cloud, scale=60.0, tick=0.001, max_tick=30.0, wall=Wall(step=1.0))
    assert b"costopt_sim_clock_lag_seconds" not in render()  # no driver runs
    with _DRIVERS_LOCK:
        drivers[cloud] = driver
    driver.start()
    try:
        driver.sleep(90.0)  # three ticks at least, each cut from 60 to 30 simulated seconds
        body = render().decode()
    finally:
        driver.stop()
    lag = next(line for line in body.splitlines() if line.startswith("costopt_sim_clock_lag_seconds "))
    capped = next(line for line in body.splitlines() if line.startswith("costopt_sim_clock_capped_ticks_total "))
    assert float(lag.split()[1]) >= 90.0 and float(capped.split()[1]) >= 3.0, (lag, capped)
    assert b"costopt_sim_clock_lag_seconds" not in render()  # stopped


def test_bad_scales_and_ticks_are_refused() -> None:
    with pytest.raises(ValueError, match="scale"):
        SimClockDriver(_cloud(), scale=0.0)
    with pytest.raises(ValueError, match="tick"):
        SimClockDriver(_cloud(), scale=600.0, tick=float("nan"))


def test_the_service_clock_is_the_driver_on_the_simulated_cloud_else_the_wall(tmp_path: Path) -> None:
    cloud = _cloud()
    settings = Settings(provider="sim", sim_time_scale=120.0)
    clock = service_clock(settings, {"sim": cloud})
    assert isinstance(clock, SimClockDriver) and isinstance(clock, ServiceClock)
    assert clock is driver_for(settings, cloud) and clock.scale == 120.0
    assert clock.now() == START
    assert isinstance(service_clock(Settings(provider="local"), {"sim": cloud}), WallClock)
    assert start_sim_clock(Settings(provider="local"), {"sim": cloud}) is None
    started = start_sim_clock(settings, {"sim": cloud})
    try:
        assert started is clock and started.running
    finally:
        assert started is not None
        started.stop()


def test_wiring_shares_one_simulated_cloud_per_store_starting_at_the_setting(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'costopt.db'}",
        availability_logs_dir=tmp_path / "no-logs",
        sim_start=datetime(2020, 2, 15, 6, tzinfo=UTC),
    )
    store = build_store(settings)
    sim = build_cloud_provider(settings, store)
    assert isinstance(sim, SimCloud) and sim.now() == datetime(2020, 2, 15, 6, tzinfo=UTC)
    assert build_cloud_provider(settings, store, name="sim") is sim
    assert build_cloud_provider(settings, build_store(settings)) is not sim  # another store, another cloud


class _RateFn(Protocol):
    def __call__(self, job_type: str, gpus: int, offer: OfferKey, precision: str = "fp32", /) -> float | None: ...


def test_the_throughput_comes_from_the_catalog_by_job_type_accelerator_and_gpus(shared_data: Path) -> None:
    settings = Settings(data_dir=shared_data)
    p3_8x = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.8xlarge", Market.ON_DEMAND)
    prices = step_prices(
        [(OFFER, START, 3.0), (p3_8x, START, 3.0)],
        {("aws", "p3.2xlarge"): ("v100", 1.0), ("aws", "p3.8xlarge"): ("v100", 4.0)},
    )
    # the returned function's precision defaults to fp32 (api.wiring), beyond ThroughputFn's 4 positional args
    rate = cast(_RateFn, build_sim_throughput(settings, prices))
    catalog = build_catalog(settings)
    job = "ResNet-50 (batch size 64)"
    one, four = catalog.get(job, "v100", 1), catalog.get(job, "v100", 4)
    assert one is not None and four is not None and one.steps_per_s != four.steps_per_s
    assert rate(job, 1, OFFER) == one.steps_per_s
    assert rate(job, 4, p3_8x) == four.steps_per_s
    amp = build_catalog(settings, precision="amp").get(job, "v100")  # FP16 tensor cores: its amp estimate
    assert amp is not None and amp.steps_per_s > one.steps_per_s
    assert rate(job, 1, OFFER, "amp") == amp.steps_per_s and rate(job, 1, OFFER, "fp32") == one.steps_per_s
    assert rate("No Such Model (batch size 1)", 1, OFFER) is None
    assert rate("", 1, OFFER) is None  # not a job type: unknown, the launch names the override
    unknown_shape = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "x9.large", Market.ON_DEMAND)
    assert rate(job, 1, unknown_shape) is None


def test_a_wall_clock_sleeps_on_the_wall() -> None:
    clock = WallClock()
    t0 = time.monotonic()
    clock.sleep(0.0)
    assert time.monotonic() >= t0 and clock.now().tzinfo is UTC
    with pytest.raises(ValueError):
        clock.sleep(-1.0)


def test_the_service_runs_its_simulated_clock_while_it_is_up(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app

    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'costopt.db'}",
        availability_logs_dir=tmp_path / "no-logs",
        seed_on_start=False,
        collectors_enabled=False,
        provider="sim",
        sim_time_scale=3600.0,
        sim_tick=timedelta(milliseconds=10),
    )
    app = create_app(settings)
    with TestClient(app):
        driver = app.state.sim_clock
        assert isinstance(driver, SimClockDriver) and driver.running and driver.scale == 3600.0
        cloud = driver.cloud
        assert cloud is app.state.providers["sim"]
        driver.sleep(7200.0)  # two simulated hours: returns once the thread has moved the clock that far
        assert cloud.now() >= settings.sim_start + timedelta(hours=2)
    assert not driver.running


def test_the_simulated_hardware_runs_at_the_catalog_without_what_jobs_learnt_on_it(
    engine: Engine, shared_data: Path
) -> None:
    """The simulated cloud's speed is the throughput file's and users' registrations, not the service's
    belief: measurements its running jobs took (``job:`` sources) move the planner's catalog, never the
    simulated GPUs (a restarted service used to load them, and its jobs then trained at another speed than
    in a process that had loaded the catalog before any was taken: the kill drill's ledger)."""
    from costopt.throughput.model import JobType
    from costopt.throughput.registry import Measurement, MeasurementRegistry, job_source

    settings = Settings(data_dir=shared_data)
    prices = step_prices([(OFFER, START, 3.0)], {("aws", "p3.2xlarge"): ("v100", 1.0)})
    job = "ResNet-50 (batch size 64)"
    truth = build_catalog(settings).get(job, "v100", 1)
    assert truth is not None
    registry = MeasurementRegistry(engine)
    registry.add(  # a running job on this cloud measured it slower (a window with a checkpoint's pause)
        Measurement(
            job_type=JobType.parse(job),
            accelerator="v100",
            gpu_count=1,
            steps_per_s=truth.steps_per_s * 0.5,
            provenance="user",
            source=job_source("job-0123456789abcdef", "fp32"),
            measured_at=START,
        )
    )
    own = "Custom Net (batch size 8)"
    registry.add(  # a user's registration of a job type the file does not know: the cloud runs it
        Measurement(
            job_type=JobType.parse(own),
            accelerator="v100",
            gpu_count=1,
            steps_per_s=3.25,
            provenance="user",
            source="user:alpha",
            measured_at=START,
        )
    )
    belief = build_catalog(settings, engine).get(job, "v100", 1)
    assert belief is not None and belief.steps_per_s < truth.steps_per_s  # the planner learnt it
    rate = cast(_RateFn, build_sim_throughput(settings, prices, engine))
    assert rate(job, 1, OFFER) == truth.steps_per_s
    assert rate(own, 1, OFFER) == pytest.approx(3.25)
