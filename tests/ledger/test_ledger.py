"""The ledger on both backends (and in memory): hand-computed figures across price changes, clipping to a
period, open intervals, idempotent recording, charges, and Decimal exactness."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pandas as pd
import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.engine import Connection

from costopt.db.ledger_schema import ledger_charges, ledger_intervals, ledger_segments
from costopt.domain import Cloud, Market, OfferKey, PricePoint
from costopt.ledger import (
    ChargeKind,
    ChargeRecord,
    IntervalRecord,
    InvalidLedgerRecord,
    LedgerConflict,
    LedgerError,
    MemoryLedger,
    NoPriceInEffect,
    StepPrices,
    StorePriceView,
)
from costopt.ledger.book import Ledger
from costopt.ledger.sql import SqlLedger
from pricing.store import PriceStore

T0 = datetime(2020, 3, 2, tzinfo=UTC)
K = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.8xlarge", Market.SPOT)
K2 = OfferKey(Cloud.AZURE, "eastus", "", "Standard_NC6s_v2", Market.SPOT)
SHAPES = {("aws", "p3.8xlarge"): ("v100", 4.0), ("azure", "Standard_NC6s_v2"): ("p100", 1.0)}


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def history(points: list[tuple[OfferKey, float, float]]) -> pd.DataFrame:
    rows = [
        {
            "cloud": k.cloud.value,
            "region": k.region,
            "zone": k.zone,
            "instance_type": k.instance_type,
            "market": k.market.value,
            "valid_from": at(h),
            "usd_per_hour": p,
        }
        for k, h, p in points
    ]
    return pd.DataFrame(rows)


# K: $1.20 from 00:00, $0.90 from 01:30, $2.00 from 03:00. K2: $0.10 from 00:00, $0.20 from 01:00.
POINTS = [(K, 0.0, 1.20), (K, 1.5, 0.90), (K, 3.0, 2.00), (K2, 0.0, 0.10), (K2, 1.0, 0.20)]
PRICES = StepPrices.from_history(history(POINTS), SHAPES)


def rec(key: str, start: float, end: float | None, *, offer: OfferKey = K, **kw: object) -> IntervalRecord:
    fields: dict[str, object] = {"job_id": "job-1", "instance_id": f"i-{key}", "offer": offer, "team": "vision"}
    fields.update(kw)
    return IntervalRecord(
        interval_key=key,
        started_at=at(start),
        ended_at=None if end is None else at(end),
        **fields,  # type: ignore[arg-type]
    )


def both(engine: Engine) -> list[Ledger]:
    return [SqlLedger(engine, PRICES), MemoryLedger(PRICES)]


def test_an_interval_is_integrated_across_price_changes(engine: Engine) -> None:
    # 00:30-01:30 at 1.20 (1.20) + 01:30-03:00 at 0.90 (1.35) + 03:00-03:15 at 2.00 (0.50) = 3.05
    for ledger in both(engine):
        line = ledger.record_interval(rec("a", 0.5, 3.25))
        assert line.amount_usd == Decimal("3.05")
        assert [(s.usd_per_hour, s.amount_micro_usd) for s in line.segments] == [
            (Decimal("1.2"), 1_200_000),
            (Decimal("0.9"), 1_350_000),
            (Decimal("2.0"), 500_000),
        ]
        assert [s.starts_at for s in line.segments] == [at(0.5), at(1.5), at(3.0)]
        report = ledger.costs(job_id="job-1")
        assert report.total_usd == Decimal("3.05")
        assert report.total_micro_usd == sum(s.amount_micro_usd for s in line.segments)


def test_a_share_of_the_instance_is_billed_by_its_share(engine: Engine) -> None:
    # one GPU of the 4 of a p3.8xlarge: 3.05 / 4 = 0.7625
    for ledger in both(engine):
        line = ledger.record_interval(rec("a", 0.5, 3.25, share=Decimal("0.25")))
        assert line.amount_usd == Decimal("0.7625")
        assert ledger.costs().by("instance_type") == {"p3.8xlarge": Decimal("0.7625")}


def test_a_period_clips_intervals_and_integrates_within_it(engine: Engine) -> None:
    for ledger in both(engine):
        ledger.record_interval(rec("a", 0.5, 3.25))
        ledger.record_interval(rec("b", 0.0, 2.0, offer=K2, job_id="job-2"))
        # [01:00, 02:00): a: 0.5 h x 1.20 + 0.5 h x 0.90 = 1.05; b: 1 h x 0.20 = 0.20
        report = ledger.costs(start=at(1.0), end=at(2.0))
        assert report.total_usd == Decimal("1.25")
        assert [(ln.record.interval_key, ln.amount_usd) for ln in report.lines] == [
            ("a", Decimal("1.05")),
            ("b", Decimal("0.2")),
        ]
        assert [ln.hours for ln in report.lines] == [1.0, 1.0]
        assert ledger.costs(job_id="job-2", start=at(1.0), end=at(2.0)).total_usd == Decimal("0.2")
        assert ledger.costs(team="vision").total_usd == Decimal("3.05") + Decimal("0.3")
        assert ledger.costs(team="nobody").total_usd == 0
        # a period after everything holds nothing
        assert ledger.costs(start=at(5.0), end=at(6.0)).lines == ()


def test_an_open_interval_is_costed_up_to_a_given_time(engine: Engine) -> None:
    for ledger in both(engine):
        line = ledger.record_interval(rec("a", 2.0, None))
        assert line.amount_micro_usd is None
        # 02:00-03:00 at 0.90 + 03:00-03:30 at 2.00 = 1.90
        report = ledger.costs(job_id="job-1", as_of=at(3.5))
        assert report.total_usd == Decimal("1.9")
        assert report.lines[0].open
        # as_of defaults to the period's end
        assert ledger.costs(end=at(2.5)).total_usd == Decimal("0.45")
        with pytest.raises(LedgerError, match="open"):
            ledger.costs()


def test_recording_twice_does_not_count_twice(engine: Engine) -> None:
    for ledger in both(engine):
        first = ledger.record_interval(rec("a", 0.5, 3.25))
        again = ledger.record_interval(rec("a", 0.5, 3.25, end_reason="other reason"))
        assert again.amount_micro_usd == first.amount_micro_usd
        assert again.record.end_reason is None  # the first reason stays
        assert ledger.costs().total_usd == Decimal("3.05")
        assert len(ledger.costs().lines) == 1
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ledger_intervals)).scalar_one() == 1
        assert conn.execute(select(func.count()).select_from(ledger_segments)).scalar_one() == 3


def test_an_open_interval_is_closed_once_and_a_late_open_changes_nothing(engine: Engine) -> None:
    for ledger in both(engine):
        ledger.record_interval(rec("a", 0.5, None))
        closed = ledger.record_interval(rec("a", 0.5, 3.25, end_reason="done"))
        assert closed.amount_usd == Decimal("3.05")
        assert closed.record.end_reason == "done"
        replay = ledger.record_interval(rec("a", 0.5, None))
        assert replay.record.ended_at == at(3.25)
        assert ledger.costs().total_usd == Decimal("3.05")
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ledger_segments)).scalar_one() == 3


def test_an_open_interval_opened_again_is_read_back_and_other_facts_are_a_conflict(engine: Engine) -> None:
    """An open interval is inserted without a read first: a key already taken falls back to the read and
    the merge (the same facts: the stored line; other facts: a conflict)."""
    for ledger in both(engine):
        first = ledger.record_interval(rec("a", 0.5, None))
        again = ledger.record_interval(rec("a", 0.5, None))
        assert again == first
        with pytest.raises(LedgerConflict):
            ledger.record_interval(rec("a", 0.5, None, offer=K2))
        assert len(ledger.costs(job_id="job-1", as_of=at(3.0)).lines) == 1


def test_the_close_of_an_open_interval_with_other_facts_is_a_conflict_and_writes_nothing(engine: Engine) -> None:
    """The close of a stored open line is one statement by its key (no read first): its facts are compared
    in the same transaction, which a conflict rolls back."""
    for ledger in both(engine):
        ledger.record_interval(rec("a", 0.5, None))
        with pytest.raises(LedgerConflict):
            ledger.record_interval(rec("a", 0.5, 3.25, offer=K2))
        with pytest.raises(LedgerConflict):
            ledger.record_interval(rec("a", 0.25, 3.25))
        (line,) = ledger.costs(job_id="job-1", as_of=at(3.0)).lines
        assert line.open
        closed = ledger.record_interval(rec("a", 0.5, 3.25, end_reason="done"))
        assert closed.amount_usd == Decimal("3.05") and closed.record.end_reason == "done"
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ledger_segments)).scalar_one() == 3


@pytest.mark.parametrize(
    "change",
    [
        {"end": 3.0},
        {"offer": K2},
        {"start": 0.25},
        {"instance_id": "i-other"},
        {"share": Decimal("0.5")},
        {"job_id": "job-9"},
    ],
)
def test_the_same_key_with_other_facts_is_a_conflict(engine: Engine, change: dict[str, object]) -> None:
    base = {"start": 0.5, "end": 3.25}
    for ledger in both(engine):
        ledger.record_interval(rec("a", 0.5, 3.25))
        fields = {**base, **change}
        start, end = fields.pop("start"), fields.pop("end")
        with pytest.raises(LedgerConflict):
            ledger.record_interval(rec("a", start, end, **fields))  # type: ignore[arg-type]
        assert ledger.costs().total_usd == Decimal("3.05")


def test_money_is_exact_decimal_never_float(engine: Engine) -> None:
    # 1 h at 0.10 + 1 h at 0.20 is exactly 0.30 (floats give 0.30000000000000004)
    assert 0.1 + 0.2 != 0.3
    for ledger in both(engine):
        line = ledger.record_interval(rec("x", 0.0, 2.0, offer=K2))
        assert line.amount_usd == Decimal("0.3")
        assert isinstance(line.amount_usd, Decimal)
        # 7 s at 0.90/h = 0.00175 USD exactly = 1750 micro-dollars
        short = ledger.record_interval(rec("y", 2.0, 2.0 + 7 / 3600))
        assert short.amount_micro_usd == 1750
        # 1 s at 2.00/h = 555.55... micro-dollars, rounded half-even once
        tiny = ledger.record_interval(rec("z", 3.0, 3.0 + 1 / 3600))
        assert tiny.amount_micro_usd == 556
        report = ledger.costs()
        assert report.total_micro_usd == 300_000 + 1750 + 556
        assert report.total_usd == Decimal("0.302306")
        assert isinstance(report.by("cloud")["azure"], Decimal)
    with engine.connect() as conn:
        prices = conn.execute(select(ledger_segments.c.usd_per_hour)).scalars().all()
    assert prices and all(isinstance(p, Decimal) for p in prices)
    assert sorted(prices) == [Decimal("0.1"), Decimal("0.2"), Decimal("0.9"), Decimal("2.0")]


def test_a_price_not_in_effect_is_never_billed(engine: Engine) -> None:
    for ledger in both(engine):
        with pytest.raises(NoPriceInEffect, match="no price"):
            ledger.record_interval(rec("early", -1.0, 1.0))
        with pytest.raises(NoPriceInEffect):
            ledger.record_interval(rec("unknown", 0.0, 1.0, offer=OfferKey(Cloud.GCP, "r", "", "t", Market.SPOT)))
        assert ledger.costs().lines == ()


def test_charges_are_additive_or_memo_and_recorded_once(engine: Engine) -> None:
    for ledger in both(engine):
        ledger.record_interval(rec("a", 0.5, 3.25))
        egress = ChargeRecord(
            "move-1:egress",
            "job-1",
            ChargeKind.EGRESS,
            at(3.25),
            team="vision",
            quantity=Decimal("0.2"),
            unit="GB",
            rate_usd=Decimal("0.09"),
            offer=K,
        )
        lost = ChargeRecord(
            "pre-1:lost",
            "job-1",
            ChargeKind.LOST_WORK,
            at(2.0),
            team="vision",
            offer=K,
            span=(at(1.0), at(2.0)),
            share=Decimal("0.25"),
        )
        assert ledger.record_charge(egress).amount_usd == Decimal("0.018")
        # 0.5 h x 1.20 + 0.5 h x 0.90 = 1.05, a quarter of it
        assert ledger.record_charge(lost).amount_usd == Decimal("0.2625")
        assert ledger.record_charge(egress).amount_usd == Decimal("0.018")  # idempotent
        report = ledger.costs()
        assert report.total_usd == Decimal("3.05") + Decimal("0.018")  # memo lines are not added
        assert report.memo_usd(ChargeKind.LOST_WORK) == Decimal("0.2625")
        assert report.memo_usd(ChargeKind.EGRESS) == Decimal("0.018")
        # a charge belongs to the period of its time
        assert ledger.costs(start=at(0.0), end=at(3.0)).additive_micro_usd == 0
        with pytest.raises(LedgerConflict):
            ledger.record_charge(
                ChargeRecord("move-1:egress", "job-1", ChargeKind.EGRESS, at(3.25), amount_usd=Decimal("1"))
            )
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ledger_charges)).scalar_one() == 2


def test_invalid_records_are_refused() -> None:
    with pytest.raises(InvalidLedgerRecord):
        rec("a", 2.0, 1.0)
    with pytest.raises(InvalidLedgerRecord):
        IntervalRecord("a", "j", "i", K, datetime(2020, 3, 2))  # naive
    with pytest.raises(InvalidLedgerRecord):
        rec("a", 0.0, 1.0, share=Decimal("1.5"))
    with pytest.raises(InvalidLedgerRecord):
        rec("a", 0.0, 1.0, share=0.25)
    with pytest.raises(InvalidLedgerRecord):
        ChargeRecord("c", "j", ChargeKind.EGRESS, at(0))  # nothing to value
    with pytest.raises(InvalidLedgerRecord):
        ChargeRecord("c", "j", ChargeKind.EGRESS, at(0), amount_usd=0.5)  # type: ignore[arg-type]


def test_concurrent_writers_store_an_interval_once(engine: Engine) -> None:
    ledger = SqlLedger(engine, PRICES)
    errors: list[BaseException] = []

    def write(record: Callable[[], IntervalRecord]) -> None:
        try:
            ledger.record_interval(record())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(lambda: rec("a", 0.5, 3.25),)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert ledger.costs().total_usd == Decimal("3.05")
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ledger_segments)).scalar_one() == 3


def test_the_price_store_itself_can_price_the_ledger(engine: Engine) -> None:
    store = PriceStore(engine)
    store.write([PricePoint(k, at(h), p, "test") for k, h, p in POINTS])
    ledger = SqlLedger(engine, StorePriceView(store))
    assert ledger.record_interval(rec("a", 0.5, 3.25)).amount_usd == Decimal("3.05")
    assert ledger.costs(start=at(1.0), end=at(2.0)).total_usd == Decimal("1.05")


def test_costs_group_by_every_attribute_with_additive_charges_and_without_memo_charges() -> None:
    ledger = MemoryLedger(PRICES)
    ledger.record_interval(rec("a", 0.0, 1.0, team="vision", provider="aws"))  # K at $1.20 for 1 h
    ledger.record_interval(rec("b", 0.0, 1.0, offer=K2, job_id="job-2", team="nlp", provider="azure"))  # $0.10
    egress = ChargeRecord(
        "m:egress", "job-2", ChargeKind.EGRESS, at(0.5), team="nlp", quantity=Decimal("0.2"), rate_usd=Decimal("0.09")
    )
    ledger.record_charge(egress)  # $0.018, no offer: counted under ""
    memo = ChargeRecord(
        "p:lost", "job-1", ChargeKind.LOST_WORK, at(1.0), team="vision", offer=K, span=(at(0.0), at(1.0))
    )
    assert ledger.record_charge(memo).amount_usd == Decimal("1.2")  # a memo: never added to the totals
    report = ledger.costs(start=at(0), end=at(2))
    d = Decimal
    assert report.total_usd == d("1.318")
    assert report.by("job_id") == {"job-1": d("1.2"), "job-2": d("0.118")}
    assert report.by("team") == {"nlp": d("0.118"), "vision": d("1.2")}
    assert report.by("provider") == {"": d("0.018"), "aws": d("1.2"), "azure": d("0.1")}
    assert report.by("cloud") == {"": d("0.018"), "aws": d("1.2"), "azure": d("0.1")}
    assert report.by("region") == {"": d("0.018"), "eastus": d("0.1"), "us-east-1": d("1.2")}
    assert report.by("zone") == {"": d("0.118"), "us-east-1a": d("1.2")}  # K2 has no zone
    assert report.by("instance_type") == {"": d("0.018"), "Standard_NC6s_v2": d("0.1"), "p3.8xlarge": d("1.2")}
    assert report.by("market") == {"": d("0.018"), "spot": d("1.3")}
    assert list(report.by("team")) == ["nlp", "vision"]  # sorted
    with pytest.raises(LedgerError, match="cannot group by 'gpu'; choose from job_id, team"):
        report.by("gpu")


def test_period_bounds_of_charges_and_an_open_shared_interval() -> None:
    ledger = MemoryLedger(PRICES)
    ledger.record_interval(rec("o", 0.0, None, share=Decimal("0.25")))  # open, a quarter of K at $1.20/h
    for key, hours in (("c-start", 1.0), ("c-mid", 1.5), ("c-asof", 2.0), ("c-end", 3.0)):
        ledger.record_charge(ChargeRecord(key, "job-1", ChargeKind.EGRESS, at(hours), amount_usd=Decimal("0.01")))
    report = ledger.costs(start=at(1.0), end=at(3.0), as_of=at(2.0))
    assert (report.start, report.end, report.as_of) == (at(1.0), at(3.0), at(2.0))
    # at start: in; at as_of: in; at the period end: out (half-open period, charges up to as_of)
    assert [c.record.charge_key for c in report.charges] == ["c-start", "c-mid", "c-asof"]
    # 1:00-1:30 at $1.20 and 1:30-2:00 at $0.90, each x 0.25 -> 0.15 + 0.1125
    assert report.instances_micro_usd == 262_500 and report.lines[0].open
    assert report.total_usd == Decimal("0.2925")
    assert ledger.costs(start=at(1.0), end=at(3.0)).charges[-1].record.charge_key == "c-asof"  # as_of: the end
    empty = ledger.costs(start=at(1.0), end=at(1.0))  # an empty period is a period
    assert empty.total_micro_usd == 0 and empty.lines == () and empty.charges == ()
    with pytest.raises(LedgerError, match="the period ends"):
        ledger.costs(start=at(1.0), end=at(0.5))


def test_costs_of_a_set_of_jobs_read_only_their_lines(engine: Engine) -> None:
    # a fleet's page: its jobs' and its own (idle) lines, not the team's whole history
    for ledger in both(engine):
        ledger.record_interval(rec("a", 0.5, 3.25))  # job-1: 3.05
        ledger.record_interval(rec("b", 0.0, 2.0, offer=K2, job_id="job-2"))  # 0.30
        ledger.record_interval(rec("c", 0.0, 1.0, offer=K2, job_id="fleet-1"))  # 0.10
        ledger.record_charge(
            ChargeRecord(
                "move-2:egress",
                "job-2",
                ChargeKind.EGRESS,
                at(1.0),
                team="vision",
                quantity=Decimal("1"),
                unit="GB",
                rate_usd=Decimal("0.09"),
                offer=K2,
            )
        )
        picked = ledger.costs(team="vision", job_ids=["job-2", "fleet-1", "job-9"])
        assert picked.by("job_id") == {"job-2": Decimal("0.39"), "fleet-1": Decimal("0.1")}
        assert picked.total_usd == ledger.costs(job_id="job-2").total_usd + ledger.costs(job_id="fleet-1").total_usd
        assert ledger.costs(job_ids=[]).lines == () and ledger.costs(job_ids=[]).total_usd == 0
        assert ledger.costs(job_id="job-1", job_ids=["job-2"]).total_usd == 0  # both filters hold
        assert ledger.costs(team="other", job_ids=["job-2"]).total_usd == 0


def test_what_a_caller_writes_with_a_line_commits_with_it_alone_when_stored_and_never_on_a_conflict(
    engine: Engine,
) -> None:
    """``then=``: run in the transaction that wrote the line (its failure rolls the line back), in one of its
    own when the line was stored already, not at all when the call raises."""
    ledger = SqlLedger(engine, PRICES)
    ran: list[str] = []

    def then(what: str, fail: bool = False) -> Callable[[Connection], None]:
        def run(conn: Connection) -> None:
            assert conn.in_transaction()
            ran.append(what)
            if fail:
                raise RuntimeError(what)

        return run

    with pytest.raises(RuntimeError):
        ledger.record_interval(rec("a", 0.5, None), then=then("open", fail=True))
    assert ledger.costs(job_id="job-1", as_of=at(3.0)).lines == ()  # rolled back with it
    ledger.record_interval(rec("a", 0.5, None), then=then("open"))
    ledger.record_interval(rec("a", 0.5, None), then=then("stored"))
    with pytest.raises(RuntimeError):
        ledger.record_interval(rec("a", 0.5, 3.25), then=then("close", fail=True))
    assert ledger.costs(job_id="job-1", as_of=at(3.0)).lines[0].open
    ledger.record_interval(rec("a", 0.5, 3.25), then=then("close"))
    with pytest.raises(LedgerConflict):
        ledger.record_interval(rec("a", 0.5, 3.0), then=then("conflict"))
    assert ran == ["open", "open", "stored", "close", "close"]
