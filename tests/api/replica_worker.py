"""One service replica for the replica test: the real scheduler (:func:`api.scheduler.build_scheduler`,
leased, aligned ticks) with every kind of scheduled job (a price collector through the real price job
over a store that does not store, the reconciler and the watcher through the real migration jobs, the
engine tick and the rebalancer through the real job-service jobs), whose work records
``(name, tick, pid)`` in ``replica_runs``.

Run: ``python -m tests.api.replica_worker <database url> <interval seconds>``; prints ``ready`` once
scheduled; stops on SIGTERM, or when its stdin closes (the test holds the other end: a killed pytest
leaves no replica behind).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, insert

from api.scheduler import JobServiceJobs, build_scheduler
from api.ticks import Every, current_tick
from costopt.db.engine import make_engine
from costopt.db.types import UtcDateTime
from costopt.jobs.leases import LeaseStore
from costopt.settings import Settings
from pricing.base import FetchResult, PriceHistoryView

RUNS = Table(
    "replica_runs",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(100), nullable=False),
    Column("tick", UtcDateTime(), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("at", UtcDateTime(), nullable=False),
)

SOURCE = "aws-spot"
"""The collector's name (a registered source, so its interval comes from the settings)."""


class Recorder:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.pid = os.getpid()

    def __call__(self, name: str) -> None:
        tick = current_tick()
        if tick is None:
            raise AssertionError(f"{name} ran outside a leased tick")
        with self.engine.begin() as conn:
            conn.execute(insert(RUNS).values(name=name, tick=tick, pid=self.pid, at=datetime.now(UTC)))


class Source:
    name = SOURCE

    def __init__(self, record: Recorder) -> None:
        self.record = record

    def fetch(self, history: PriceHistoryView) -> FetchResult:
        self.record(f"collect:{SOURCE}")
        return FetchResult(SOURCE)


class Store:
    """The price job's store, minus the storing: the job runs its real path (backoff check, ``run_source``,
    the source's ``fetch``, which records the tick) in a few milliseconds, so the replicas' ticks measure
    the scheduling, not the price store's writes."""

    def sources(self) -> list[object]:
        return []

    def instance_types(self) -> list[object]:
        return []

    def upsert_instance_types(self, types: object) -> None:
        return None

    def write(self, points: object) -> SimpleNamespace:
        return SimpleNamespace(inserted=0)

    def record_fetch(self, name: str, **kwargs: object) -> None:
        return None


class Migration:
    def __init__(self, record: Recorder, interval: timedelta) -> None:
        self.record = record
        self.reconcile_interval = interval
        self.watch_interval = interval * 2 / 3

    def reconcile(self) -> None:
        self.record("migration:reconcile")

    def watch(self) -> None:
        self.record("migration:watch")


class Rebalancer:
    def __init__(self, record: Recorder) -> None:
        self.record = record

    def run_once(self, *, dry_run: bool) -> None:
        assert not dry_run
        self.record("rebalance")


def intervals(base: float) -> dict[str, timedelta]:
    """Each job's interval for a base interval (seconds): they differ, as in the service."""
    b = timedelta(seconds=base)
    return {
        f"collect:{SOURCE}": b,
        "migration:reconcile": b,
        "migration:watch": b * 2 / 3,
        "engine": b * 5 / 6,
        "rebalance": b,
    }


def main(url: str, base: float) -> None:
    if os.environ.get("REPLICA_DEBUG"):
        import logging

        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(threadName)s %(name)s %(message)s")
    engine = make_engine(url)
    record = Recorder(engine)
    every = intervals(base)
    settings = Settings(database_url=url, aws_spot_interval=every[f"collect:{SOURCE}"])
    jobs = JobServiceJobs(
        engine_tick=lambda: record("engine"),
        rebalancer=Rebalancer(record),
        engine_interval=every["engine"],
        rebalance_schedule=Every(every["rebalance"]),
    )
    scheduler = build_scheduler(
        Store(),  # type: ignore[arg-type]
        [Source(record)],
        settings,
        migration=Migration(record, every["migration:reconcile"]),  # type: ignore[arg-type]
        job_service=jobs,
        leases=LeaseStore(engine),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def parent_gone() -> None:
        sys.stdin.read()  # returns at EOF: the parent closed the pipe, or died
        stop.set()

    threading.Thread(target=parent_gone, name="parent-watch", daemon=True).start()
    scheduler.start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    stop.wait()
    scheduler.shutdown(wait=True)
    engine.dispose()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
