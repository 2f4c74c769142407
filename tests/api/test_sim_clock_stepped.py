"""The stepped simulated clock (``COSTOPT_SIM_CLOCK=stepped``, issue 14's kill drill): it moves a step only
once every scheduled job due at the current simulated time, and the work it handed to thread pools, has run
or waits on the clock, however long that takes in wall time; the work runs one piece at a time, in turn."""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from api.scheduler import OnServiceClock
from api.sim_clock import SimClockDriver, SteppedClockDriver, make_driver
from api.ticks import Every
from costopt import clock as service_clock
from costopt.domain import Cloud, Market, OfferKey
from costopt.risk.hazard import HazardModel
from costopt.settings import Settings
from providers.sim import SimCloud
from tests.price_support import step_prices

START = datetime(2020, 3, 1, tzinfo=UTC)
OFFER = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)


def _cloud() -> SimCloud:
    prices = step_prices([(OFFER, START - timedelta(days=1), 3.06)])
    return SimCloud(prices, HazardModel(defaults=dict.fromkeys(Cloud, 0.0)), start=START)


def _run_until(driver: SteppedClockDriver, done: threading.Event, timeout_s: float = 20.0) -> None:
    driver.start()
    try:
        assert done.wait(timeout_s), "the stepped clock did not get there"
    finally:
        driver.stop()
    assert service_clock.current_lockstep() is None  # stopped: no longer the process's lockstep clock


def test_the_clock_moves_only_once_the_due_job_and_the_work_it_handed_to_a_pool_ran_or_wait() -> None:
    cloud = _cloud()
    driver = SteppedClockDriver(cloud, step=30.0)
    seen: list[tuple[str, datetime]] = []
    pool = ThreadPoolExecutor(2)
    done = threading.Event()

    def task() -> None:
        seen.append(("task starts", cloud.now()))
        time.sleep(0.3)  # wall time: a wall clock at 600x would have moved 180 simulated s meanwhile
        seen.append(("task sleeps 45 s", cloud.now()))
        driver.sleep(45)  # gives up its turn: the clock moves on, step by step
        seen.append(("task wakes", cloud.now()))

    def work() -> None:
        seen.append(("job", cloud.now()))
        if len(seen) == 1:
            service_clock.submit(pool, task, capacity=2)
        if cloud.now() >= START + timedelta(minutes=3):
            done.set()

    driver.add_job("job", OnServiceClock(Every(timedelta(minutes=1)), driver.now, work))
    _run_until(driver, done)
    pool.shutdown()
    t = START
    assert seen[:5] == [
        ("job", t),
        ("task starts", t),
        ("task sleeps 45 s", t),  # 0.3 s of wall time later: the same simulated time
        ("task wakes", t + timedelta(seconds=60)),  # the first step at or past 45 s (steps of 30 s: 0, 30, 60)
        ("job", t + timedelta(seconds=60)),  # the next minute's run, after the sleepers (class doc)
    ]
    assert [at for what, at in seen if what == "job"][:4] == [t + timedelta(minutes=m) for m in range(4)]
    assert driver.steps >= 6


def test_work_handed_to_a_pool_runs_one_piece_at_a_time_in_submission_order_and_join_waits_for_it() -> None:
    cloud = _cloud()
    driver = SteppedClockDriver(cloud, step=10.0)
    order: list[str] = []
    running = [0, 0]  # now, most at once
    lock = threading.Lock()
    done = threading.Event()

    def piece(name: str, sleep_s: float) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running)
        order.append(f"{name}@{(cloud.now() - START).total_seconds():g}")
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        if sleep_s:
            driver.sleep(sleep_s)  # its turn given up while it sleeps: the others go on
            order.append(f"{name} woke@{(cloud.now() - START).total_seconds():g}")

    def work() -> None:
        with ThreadPoolExecutor(2) as pool:  # capacity 2: the third waits for a thread, as in the pool
            futures = [
                service_clock.submit(pool, functools.partial(piece, n, s), capacity=2)
                for n, s in (("a", 15.0), ("b", 0.0), ("c", 0.0))
            ]
            service_clock.join(futures)
        order.append(f"joined@{(cloud.now() - START).total_seconds():g}")
        done.set()

    driver.add_job("job", OnServiceClock(Every(timedelta(hours=1)), driver.now, work))
    _run_until(driver, done)
    assert order == ["a@0", "b@0", "c@0", "a woke@20", "joined@20"]
    assert running[1] == 1  # never two pieces at once


def test_the_migration_jobs_share_a_group_and_never_run_at_once() -> None:
    cloud = _cloud()
    driver = SteppedClockDriver(cloud, step=30.0)
    log: list[str] = []
    done = threading.Event()

    def watch() -> None:
        log.append(f"watch@{(cloud.now() - START).total_seconds():g}")
        if len(log) == 1:
            driver.sleep(100)  # e.g. a recovery waiting for its copy (it holds MigrationJobs.lock)
        log.append("watch ends")

    def reconcile() -> None:
        log.append(f"reconcile@{(cloud.now() - START).total_seconds():g}")
        if cloud.now() >= START + timedelta(seconds=150):
            done.set()

    every = Every(timedelta(seconds=30))
    driver.add_job("watch", OnServiceClock(every, driver.now, watch), group="migration")
    driver.add_job("reconcile", OnServiceClock(every, driver.now, reconcile), group="migration")
    _run_until(driver, done)
    # reconcile waits while the first watch sleeps (0 -> 120): it runs at 120 after the next watch, not at 0..90
    assert log[:5] == ["watch@0", "watch ends", "watch@120", "watch ends", "reconcile@120"]
    assert "reconcile@0" not in log and "reconcile@30" not in log


def test_a_clock_off_the_steps_grid_moves_to_its_next_point_before_the_first_step() -> None:
    cloud = _cloud()
    cloud.run_to(START + timedelta(seconds=7, microseconds=250))  # e.g. submissions took a little simulated time
    driver = SteppedClockDriver(cloud, step=30.0)
    runs: list[datetime] = []
    done = threading.Event()

    def work() -> None:
        runs.append(cloud.now())
        if len(runs) == 3:
            done.set()

    driver.add_job("job", OnServiceClock(Every(timedelta(seconds=30)), driver.now, work))
    _run_until(driver, done)
    assert runs[:3] == [START + timedelta(seconds=s) for s in (30, 60, 90)]  # on the grid, as from START
    assert driver.next_step(START) == START + timedelta(seconds=30)
    assert driver.next_step(START + timedelta(seconds=29)) == START + timedelta(seconds=30)


def test_the_setting_picks_the_driver_and_the_step_must_be_positive() -> None:
    cloud = _cloud()
    assert type(make_driver(Settings(), cloud)) is SimClockDriver  # make run's: wall time x scale
    stepped = make_driver(Settings(sim_clock="stepped", sim_step=timedelta(seconds=45)), cloud)
    assert isinstance(stepped, SteppedClockDriver) and stepped.step == 45.0
    with pytest.raises(ValueError, match="COSTOPT_SIM_STEP"):
        Settings(sim_step=timedelta(0))
    with pytest.raises(ValueError, match="step"):
        SteppedClockDriver(cloud, step=0.0)


def test_without_a_lockstep_clock_submit_and_join_are_the_pools_own() -> None:
    assert service_clock.current_lockstep() is None
    with ThreadPoolExecutor(1) as pool:
        futures = [service_clock.submit(pool, lambda: 7, capacity=1)]
        service_clock.join(futures)
    assert futures[0].result() == 7
