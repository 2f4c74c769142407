"""The offline database's read cache (``costopt.db.readcache``): what a tracked in-memory database serves from
memory is what a plain one reads, so a run through the service's path gives the same record either way."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, create_engine, event, insert, select, text, update
from sqlalchemy.pool import StaticPool

from costopt.db.readcache import WriteTracker, cached, is_tracked, track
from costopt.db.unavailable_schema import unavailable_offers
from costopt.domain import Cloud, Market, OfferKey
from costopt.jobs.offline import ALWAYS_MOVE, OfflineJob, OfflineRun, memory_database, run_offline
from costopt.migration.unavailable import REASON_PREEMPTED, UnavailableOffers
from costopt.risk.hazard import HazardModel
from providers.sim import SimCloud
from tests.jobs.test_offline import Cheapest
from tests.price_support import step_prices

T0 = datetime(2020, 3, 2, tzinfo=UTC)
A = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
B = OfferKey(Cloud.AWS, "us-east-1", "us-east-1b", "p3.2xlarge", Market.SPOT)


class CheapestSpot(Cheapest):
    """A and B (spot), cheapest first."""

    def rank(self, job: Any, *, remaining_steps: float, at: datetime, exclude: Any = (), top: int = 10) -> Any:
        out = [p for o in (A, B) if o not in exclude and (p := self._one(o, remaining_steps, at)) is not None]
        return sorted(out, key=lambda p: p.usd_per_hour)[:top]


def _plain_database() -> Engine:
    """memory_database() without the tracker: every read goes to SQLite."""
    import costopt.db.schema  # noqa: F401
    from costopt.db.metadata import metadata

    db = create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})

    @event.listens_for(db, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute("PRAGMA foreign_keys=ON")

    metadata.create_all(db)
    return db


def _run(db: Engine) -> OfflineRun:
    day_before = T0 - timedelta(days=1)
    prices = step_prices(
        [
            (A, day_before, 1.0),
            (A, T0 + timedelta(hours=30), 3.0),
            (B, day_before, 2.0),
            (B, T0 + timedelta(hours=60), 0.5),
        ]
    )
    hazards = HazardModel(defaults=dict.fromkeys(Cloud, 0.15))  # a preemption every ~7 hours
    cloud = SimCloud(prices, hazards, start=T0, seed=7)
    spec = {"command": ["train"], "throughput": {"v100": 10.0}, "checkpoint_gb": 1.0}
    jobs = [OfflineJob(1_800_000, spec, name="job")]  # 50 hours (one job: two would race on random ids)
    return run_offline(
        cloud,
        prices,
        CheapestSpot(prices),
        jobs,
        until=T0 + timedelta(days=6),
        rule=ALWAYS_MOVE,
        rebalance_every=timedelta(hours=12),
        db=db,
    )


def _ids_out(text: str | None) -> str | None:
    """Instance and job ids are random: masked."""
    return None if text is None else re.sub(r"\b(sim|job)-[0-9a-f]+", r"\1-*", text)


def _record(run: OfflineRun) -> list[Any]:
    out: list[Any] = []
    for job in run.jobs:
        out.append((job.name, job.state, job.steps_done, job.offer, job.finished_at))
        out.append(
            [(e.kind, e.at, e.from_state, e.to_state, _ids_out(e.reason), e.cost_usd) for e in run.events[job.id]]
        )
        out.append([(c.epoch, c.offer, c.started_at, c.ended_at, c.end_reason) for c in run.copies[job.id]])
        out.append(run.costs[job.id].total_usd)
    return out


def test_a_run_on_the_tracked_database_is_the_run_on_a_plain_one() -> None:
    tracked, plain = memory_database(), _plain_database()
    assert is_tracked(tracked) and not is_tracked(plain)
    got, want = _run(tracked), _run(plain)
    assert sum(1 for j in got.jobs for e in got.events[j.id] if e.kind == "preemption") >= 3  # recoveries ran
    assert sum(1 for j in got.jobs for e in got.events[j.id] if e.kind == "move") >= 1  # and moves
    assert _record(got) == _record(want)


def test_a_read_is_served_again_until_a_table_it_reads_is_written() -> None:
    tracker = WriteTracker()
    db = create_engine(
        "sqlite://",
        poolclass=StaticPool,
        connect_args={"check_same_thread": False, "factory": tracker.sqlite_factory()},
    )
    unavailable_offers.create(db)
    track(db, tracker)
    reads: list[int] = []

    def count() -> int:
        reads.append(1)
        with db.connect() as conn:
            return len(conn.execute(select(unavailable_offers)).all())

    def read() -> int:
        return cached(db, "n", ("unavailable_offers",), count)

    row = {"cloud": "aws", "region": "r", "zone": "z", "instance_type": "t", "market": "spot", "reason": "x"}
    row |= {"since": T0, "until": T0 + timedelta(hours=1), "detail": ""}
    assert (read(), read(), len(reads)) == (0, 0, 1)  # the second read came from memory
    with db.begin() as conn:
        conn.execute(insert(unavailable_offers), row)
    assert (read(), len(reads)) == (1, 2)  # an insert into the table: read again
    with db.begin() as conn:
        conn.execute(update(unavailable_offers).values(detail="y"))
    assert (read(), len(reads)) == (1, 3)
    with db.connect() as conn:  # a write rolled back: what was read meanwhile is stale
        conn.execute(insert(unavailable_offers), {**row, "zone": "z2"})
        assert read() == 2
        conn.rollback()
    assert (read(), len(reads)) == (1, 5)
    with db.begin() as conn:  # a delete, or a statement it cannot attribute, counts for every table
        conn.execute(text("DELETE FROM unavailable_offers"))
    assert (read(), len(reads)) == (0, 6)
    assert cached(db, "other", ("jobs",), lambda: 5) == 5


def test_the_unavailable_cache_answers_as_the_sql_queries_on_a_tracked_database() -> None:
    dbs = memory_database(), _plain_database()
    clock = [T0]
    marks = [
        (A, REASON_PREEMPTED, T0),
        (B, "capacity", T0 + timedelta(minutes=10)),
        (A, REASON_PREEMPTED, T0 + timedelta(minutes=50)),  # extends A
        (B, "quota", T0 + timedelta(minutes=5)),  # extends B past A
    ]
    views = [UnavailableOffers(db, clock=lambda: clock[0]) for db in dbs]
    for offer, reason, at in marks:
        for u in views:
            u.mark(offer, reason, at=at, detail=f"{reason} at {at:%H:%M}")
    for minutes in (0, 9, 30, 70, 200, 400):
        at = T0 + timedelta(minutes=minutes)
        got, want = (u.active(at=at) for u in views)
        assert got == want
        assert views[0].filter([A, B], at=at) == views[1].filter([A, B], at=at)
