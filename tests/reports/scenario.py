"""A known price path and three jobs billed through the migrator's real ledger path (``migration_copies``
-> ``sync_ledger`` -> ``SqlLedger``), with every figure computed by hand in the docstrings below.

T = 2020-03-01 23:00 UTC (midnight is T+1h). Prices (USD per instance-hour):

- A  aws us-east-1/us-east-1a p3.2xlarge spot: 1.00 from T-1h, 3.00 from T+2h (a price change mid-interval);
- B  aws us-west-2/us-west-2a p3.2xlarge spot: 1.20 from T-1h, 0.90 from T+2h;
- OD aws us-east-1 p3.2xlarge on-demand: 3.06 from T-1h.

Each job's quote lists A at 1.00 USD/h and B at 1.20 USD/h, both 10 steps/s: its static-spot baseline is
A. The on-demand baseline is OD at 10 steps/s (:class:`FixedBaselines`).

**Job J** (team vision, succeeded, 122 400 steps): e1 on A [T, T+2h05) (restart memo to T+0:06), moved to
B: e2 [T+2h, T+3h06) (egress 2 GB x 0.02, restart to T+2h06; e1 overlaps [T+2h, T+2h05)), preempted at
T+3h06 with 30 min of work lost (the engine's event: 0.45); e3 on B [T+3h10, T+4h16) (restart to T+3h16).

- actual: e1 1h x 1.00 + 1h x 1.00 + 5 min x 3.00 = 2.25; e2 66 min x 0.90 = 0.99; e3 66 min x 0.90 = 0.99;
  egress 0.04; total **4.27**.
- work: (114 + 30 + 60) min x 10 steps/s = 122 400 steps; boot (e1's restart) 6 min: a baseline run is
  6 + 204 = 210 min = 3.5 h from T.
- on-demand: 3.5 h x 3.06 = **10.71**; static spot on A: 2 h x 1.00 + 1.5 h x 3.00 = **6.50**.
- savings 10.71 - 4.27 = **6.44** (rate 0.6013); vs static 6.50 - 4.27 = **2.23** (0.3431).
- memo: move 0.04 + 0.25 (overlap at 3.00) + 0.09 (e2 restart) = **0.38**; preemption 0.45 + 0.09 (e3
  restart) = **0.54**; boot 0.10. The move paid: staying on A over [T+2h06, T+3h06) = 3.00 > 0.99 + 0.04 +
  0.25 = 1.28.

**Job K** (team nlp, succeeded, 70 800 steps): e1 on A [T+1h, T+2h30) (restart to T+1h06), preempted with
20 min lost (event: 20 min x 3.00 = 1.00); e2 on A [T+2h35, T+3h35) (restart to T+2h41).

- actual: 1h x 1.00 + 30 min x 3.00 = 2.50, + 1 h x 3.00 = 3.00: **5.50**.
- work (64 + 54) min = 70 800 steps; baseline run 6 + 118 = 124 min from T+1h.
- static spot: 1 h x 1.00 + 64 min x 3.00 = **4.20**: K cost **1.30** more, all of it its preemption
  (lost work 1.00 + e2's restart 6 min x 3.00 = 0.30).
- on-demand: 124 min x 3.06 = **6.324**; savings 0.824.

**Job L** (team vision, running, 18 000 steps done): e1 on B from T+3h, still open; the report's ``now``
is T+4h: 1 h x 0.90 = **0.90** so far. Work 18 000 steps = 30 min, boot 0 (no restart memo yet): on-demand
30 min x 3.06 = 1.53; static on A 30 min x 3.00 = 1.50.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, insert

from costopt.db.migration_schema import migrations
from costopt.domain import Cloud, Market, OfferKey
from costopt.jobs.model import JobState
from costopt.jobs.records import JobRecord, JobRepository, NewJob
from costopt.jobs.teams import TeamRepository
from costopt.ledger.prices import StepPrices
from costopt.ledger.sql import SqlLedger
from costopt.migration.ledger_sync import sync_ledger, write_copy_end, write_copy_start, write_verified
from costopt.migration.records import CopyEnd, CopyStart, EndReason
from costopt.planning.model import EgressRates
from costopt.reports.baselines import BaselineChoice, static_spot_from_quote
from costopt.reports.model import NoBaseline
from tests.reports.prices import steps

T = datetime(2020, 3, 1, 23, tzinfo=UTC)
NOW = T + timedelta(hours=4)
A = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
B = OfferKey(Cloud.AWS, "us-west-2", "us-west-2a", "p3.2xlarge", Market.SPOT)
OD = OfferKey(Cloud.AWS, "us-east-1", "", "p3.2xlarge", Market.ON_DEMAND)
EGRESS = EgressRates(inter_region={Cloud.AWS: 0.02}, internet={Cloud.AWS: 0.09})


def h(hours: float) -> datetime:
    return T + timedelta(hours=hours)


def m(minutes: float) -> datetime:
    return T + timedelta(minutes=minutes)


PRICES: StepPrices = steps({A: [(h(-1), 1.0), (h(2), 3.0)], B: [(h(-1), 1.2), (h(2), 0.9)], OD: [(h(-1), 3.06)]})


def quote() -> dict[str, Any]:
    def cand(offer: OfferKey, usd: float) -> dict[str, Any]:
        doc = {**offer.to_doc(), "accelerator": "V100", "gpu_count": 1}
        return {
            "offer": doc,
            "usd_per_hour": usd,
            "steps_per_s": 10.0,
            "expected_hours": 3.0,
            "expected_cost_usd": str(Decimal(repr(usd)) * 3),
        }

    return {**cand(A, 1.0), "as_of": "2020-03-01T23:00:00Z", "candidates": [cand(A, 1.0), cand(B, 1.2)]}


class FixedBaselines:
    """On-demand: OD at 10 steps/s for every job; static spot: from the quote (the real rule)."""

    def on_demand(self, job: JobRecord) -> BaselineChoice | NoBaseline:
        return BaselineChoice(OD, 10.0, "test reference: aws/us-east-1/p3.2xlarge")

    def static_spot(self, job: JobRecord) -> BaselineChoice | NoBaseline:
        return static_spot_from_quote(job)


@dataclass(frozen=True)
class Scenario:
    engine: Engine
    ledger: SqlLedger
    vision: str
    nlp: str
    j: str
    k: str
    l: str  # noqa: E741


def _migration(engine: Engine, mid: int, job_id: str, kind: str, from_epoch: int, at: datetime) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(migrations).values(
                id=mid,
                job_id=job_id,
                kind=kind,
                state="done",
                from_epoch=from_epoch,
                to_epoch=from_epoch + 1,
                offers=json.dumps([]),
                created_at=at,
                updated_at=at,
            )
        )


def _copy(
    engine: Engine,
    job_id: str,
    epoch: int,
    offer: OfferKey,
    start: datetime,
    verified: datetime,
    end: datetime | None,
    reason: EndReason | None,
    mid: int,
    **kw: Any,
) -> None:
    inst = f"i-{job_id}-{epoch}"
    with engine.begin() as conn:
        write_copy_start(conn, "sim", CopyStart(job_id, epoch, inst, offer, start, migration_id=mid, **kw), start)
        write_verified(conn, "sim", job_id, inst, verified, verified)
        if end is not None and reason is not None:
            write_copy_end(conn, "sim", CopyEnd(job_id, epoch, inst, None, None, end, reason), end)


def _job(repo: JobRepository, team: str, job_id: str, steps_total: int, state: JobState, steps_done: int) -> None:
    repo.create(
        NewJob(
            team,
            {"steps": steps_total, "gpus": 1, "job_type": "ResNet-50"},
            steps_total,
            "sim",
            name=job_id,
            quote=quote(),
            job_id=job_id,
        )
    )
    repo.transition(job_id, JobState.LAUNCHING, "test")
    repo.transition(job_id, JobState.RUNNING, "test")
    repo.update(job_id, steps_done=steps_done)
    if state is not JobState.RUNNING:
        repo.transition(job_id, state, "test")


def build(engine: Engine) -> Scenario:
    teams = TeamRepository(engine)
    vision, nlp = teams.create_team("vision").id, teams.create_team("nlp").id
    repo = JobRepository(engine, now=lambda: T)
    _job(repo, vision, "job-j", 122_400, JobState.SUCCEEDED, 122_400)
    _job(repo, nlp, "job-k", 70_800, JobState.SUCCEEDED, 70_800)
    _job(repo, vision, "job-l", 100_000, JobState.RUNNING, 18_000)

    _migration(engine, 1, "job-j", "recover", 0, T)
    _copy(engine, "job-j", 1, A, T, m(6), m(125), EndReason.MOVED, 1)
    _migration(engine, 2, "job-j", "move", 1, h(2))
    _copy(engine, "job-j", 2, B, h(2), m(126), m(186), EndReason.PREEMPTED, 2, source_offer=A, egress_gb=Decimal(2))
    _migration(engine, 3, "job-j", "recover", 2, m(186))
    _copy(engine, "job-j", 3, B, m(190), m(196), m(256), EndReason.FINISHED, 3)
    repo.add_event("job-j", "move", "moved to B", cost_usd=Decimal("0.38"), at=m(126))
    repo.add_event("job-j", "preemption", "30 min lost", cost_usd=Decimal("0.45"), at=m(190))

    _migration(engine, 4, "job-k", "recover", 0, h(1))
    _copy(engine, "job-k", 1, A, h(1), m(66), m(150), EndReason.PREEMPTED, 4)
    _migration(engine, 5, "job-k", "recover", 1, m(150))
    _copy(engine, "job-k", 2, A, m(155), m(161), m(215), EndReason.FINISHED, 5)
    repo.add_event("job-k", "preemption", "20 min lost", cost_usd=Decimal("1.00"), at=m(155))

    _migration(engine, 6, "job-l", "recover", 0, h(3))
    _copy(engine, "job-l", 1, B, h(3), h(3), None, None, 6)

    ledger = SqlLedger(engine, PRICES)
    assert sync_ledger(engine, ledger, egress=EGRESS).pending == 0
    return Scenario(engine, ledger, vision, nlp, "job-j", "job-k", "job-l")
