"""What the engine tests share: local offers with flat prices, a fixed Placements, and a harness running
jobs through the real migrator, ledger and local provider (jobs are real processes of this machine)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from costopt.domain import Cloud, Market, OfferKey
from costopt.jobs.engine import JobEngine
from costopt.jobs.placement import Placement
from costopt.jobs.records import JobRecord, JobRepository, NewJob
from costopt.ledger.prices import PriceStep
from costopt.ledger.sql import SqlLedger
from costopt.migration.machine import Migrator
from costopt.migration.unavailable import UnavailableOffers
from providers.local import LocalProvider

LOCAL_A = OfferKey(Cloud.LOCAL, "local", "a", "cpu-small", Market.SPOT)
LOCAL_B = OfferKey(Cloud.LOCAL, "local", "b", "cpu-large", Market.ON_DEMAND)
PRICES = {LOCAL_A: 3.6, LOCAL_B: 7.2}  # USD per instance-hour: 0.001 and 0.002 USD per second
STEPS_PER_S = {LOCAL_A: 50.0, LOCAL_B: 80.0}
_SINCE = datetime(2000, 1, 1, tzinfo=UTC)
TRAIN = "examples/train.py"


class FlatPrices:
    """One price per offer since 2000 (a :class:`~costopt.ledger.prices.PriceSteps`)."""

    def steps(self, key: OfferKey, start: datetime, end: datetime) -> Sequence[PriceStep]:
        return [PriceStep(_SINCE, PRICES[key])] if key in PRICES else []


def placement(offer: OfferKey, steps: float = 100.0) -> Placement:
    sps = STEPS_PER_S[offer]
    hours = steps / sps / 3600
    return Placement(offer, PRICES[offer], sps, hours, Decimal(repr(round(hours * PRICES[offer], 6))))


class FixedPlacements:
    """Placements from a fixed list, in its order (what D1's planner-backed one answers, minus planning)."""

    def __init__(self, offers: Sequence[OfferKey]) -> None:
        self.offers = list(offers)
        self.ranks = 0

    def rank(
        self,
        job: JobRecord,
        *,
        remaining_steps: float,
        at: datetime,
        exclude: Collection[OfferKey] = (),
        top: int = 10,
    ) -> Sequence[Placement]:
        assert at.tzinfo is not None
        self.ranks += 1
        return [placement(o, remaining_steps) for o in self.offers if o not in exclude][:top]

    def at_offer(self, job: JobRecord, offer: OfferKey, *, remaining_steps: float, at: datetime) -> Placement | None:
        return placement(offer, remaining_steps) if offer in PRICES else None


def train_command(steps: int, *, every: int = 10, step_seconds: float = 0.01) -> list[str]:
    return [
        sys.executable,
        TRAIN,
        "--steps",
        str(steps),
        "--checkpoint-every",
        str(every),
        "--step-seconds",
        str(step_seconds),
    ]


class Harness:
    """Repository, ledger, migrator and engine over one database and one local provider."""

    def __init__(
        self,
        db: Engine,
        local: LocalProvider,
        tmp: Path,
        *,
        offers: Sequence[OfferKey] = (LOCAL_A, LOCAL_B),
        workers: int = 2,
        hook: Callable[[str], None] | None = None,
        **engine_kw: Any,
    ) -> None:
        self.db = db
        self.local = local
        self.tmp = tmp
        self.repo = JobRepository(db)
        self.ledger = SqlLedger(db, FlatPrices())
        self.unavailable = UnavailableOffers(db)
        self.migrator = Migrator(
            db,
            local,
            poll_seconds=0.05,
            checkpoint_timeout=30.0,
            verify_timeout=30.0,
            backoff_base=0.0,
            ledger=self.ledger,
            unavailable=self.unavailable,
            hook=hook or (lambda point: None),
        )
        self.placements = FixedPlacements(offers)
        kw: dict[str, Any] = {"retry_base": 0.0, "cancel_timeout": 20.0, **engine_kw}
        self.engine = JobEngine(
            self.repo,
            {"local": self.migrator},
            self.placements,
            lambda: datetime.now(UTC),
            tmp / "checkpoints",
            workers=workers,
            **kw,
        )

    def submit(self, command: Sequence[str], steps: int, **spec: Any) -> JobRecord:
        job, _ = self.repo.create(
            NewJob(team_id="team-a", spec={"command": list(command), **spec}, steps_total=steps, provider="local")
        )
        return job

    def run_until(
        self,
        job_id: str,
        done: Callable[[JobRecord], bool],
        *,
        timeout: float = 60.0,
        also: Callable[[], Any] = lambda: None,
    ) -> JobRecord:
        """Tick (and ``also``) until ``done(job)`` or fail after ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while True:
            self.engine.tick()
            also()
            job = self.repo.get(job_id)
            if done(job):
                return job
            if time.monotonic() > end:
                events = [(e.kind, e.to_state, e.reason) for e in self.repo.events(job_id)]
                raise AssertionError(f"job {job_id} is {job.state.value} after {timeout} s; events: {events}")
            time.sleep(0.05)

    def states(self, job_id: str) -> list[str]:
        """The job's states in order, from its events."""
        return [e.to_state for e in self.repo.events(job_id) if e.kind == "state" and e.to_state]

    def close(self) -> None:
        self.engine.close()
