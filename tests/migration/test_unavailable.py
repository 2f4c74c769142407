"""The unavailable-offers cache: TTL per reason, idempotent marks that only extend, persisted on both backends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import Engine

from costopt.cloud import AuthError, CapacityError, Instance, LaunchSpec, QuotaError
from costopt.domain import Cloud, Market, OfferKey
from costopt.migration.records import State
from costopt.migration.unavailable import (
    DEFAULT_TTL,
    UnavailableEntry,
    UnavailableOffers,
    reason_for_launch_error,
)
from providers.local import LocalProvider
from tests.migration.test_machine import (
    ENDLESS,
    OFFER_A,
    OFFER_B,
    OFFERS,
    FlakyProvider,
    assert_one_copy,
    make_migrator,
)

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
A = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
B = OfferKey(Cloud.GCP, "us-central1", "", "a2-highgpu-1g", Market.SPOT)
C = OfferKey(Cloud.AZURE, "eastus", "", "Standard_NC6s_v3", Market.ON_DEMAND)


def test_default_ttls_are_the_documented_ones() -> None:
    assert DEFAULT_TTL["preempted"] == timedelta(hours=1)
    assert DEFAULT_TTL["capacity"] == timedelta(minutes=30)
    assert DEFAULT_TTL["quota"] == timedelta(hours=6)


def test_an_offer_is_unavailable_for_its_reasons_ttl_then_available_again(engine: Engine) -> None:
    cache = UnavailableOffers(engine)
    cache.mark(A, "capacity", at=T0, detail="InsufficientInstanceCapacity")
    cache.mark(B, "quota", at=T0)

    assert not cache.is_unavailable(A, at=T0 - timedelta(seconds=1))  # not before it was marked
    assert cache.is_unavailable(A, at=T0)
    assert cache.is_unavailable(A, at=T0 + timedelta(minutes=29, seconds=59))
    assert not cache.is_unavailable(A, at=T0 + timedelta(minutes=30))  # until is exclusive
    assert cache.is_unavailable(B, at=T0 + timedelta(hours=5, minutes=59))
    assert not cache.is_unavailable(B, at=T0 + timedelta(hours=6))
    assert not cache.is_unavailable(C, at=T0)


def test_ttl_is_configurable_per_reason_and_unknown_reasons_use_other(engine: Engine) -> None:
    cache = UnavailableOffers(engine, ttl={"capacity": timedelta(minutes=5), "other": timedelta(minutes=2)})
    cache.mark(A, "capacity", at=T0)
    cache.mark(B, "maintenance", at=T0)
    cache.mark(C, "preempted", at=T0)  # keeps its default
    assert not cache.is_unavailable(A, at=T0 + timedelta(minutes=5))
    assert cache.is_unavailable(B, at=T0 + timedelta(minutes=1))
    assert not cache.is_unavailable(B, at=T0 + timedelta(minutes=2))
    assert cache.is_unavailable(C, at=T0 + timedelta(minutes=59))


def test_a_non_positive_ttl_is_refused() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        UnavailableOffers(None, ttl={"capacity": timedelta(0)})  # type: ignore[arg-type]


def test_mark_is_idempotent_and_only_extends(engine: Engine) -> None:
    cache = UnavailableOffers(engine)
    cache.mark(A, "quota", at=T0, detail="vCPU limit")
    cache.mark(A, "quota", at=T0, detail="vCPU limit")
    assert cache.active(at=T0) == [UnavailableEntry(A, "quota", T0, T0 + timedelta(hours=6), "vCPU limit")]

    # A shorter-lived mark never shortens an active entry.
    cache.mark(A, "capacity", at=T0 + timedelta(minutes=10))
    assert cache.active(at=T0 + timedelta(minutes=10)) == [
        UnavailableEntry(A, "quota", T0, T0 + timedelta(hours=6), "vCPU limit")
    ]

    # A later mark that expires later extends it and keeps since.
    t1 = T0 + timedelta(hours=5)
    cache.mark(A, "quota", at=t1, detail="again")
    assert cache.active(at=t1) == [UnavailableEntry(A, "quota", T0, t1 + timedelta(hours=6), "again")]


def test_a_mark_after_expiry_starts_a_new_entry(engine: Engine) -> None:
    cache = UnavailableOffers(engine)
    cache.mark(A, "capacity", at=T0)
    t1 = T0 + timedelta(hours=2)
    cache.mark(A, "preempted", at=t1)
    assert cache.active(at=t1) == [UnavailableEntry(A, "preempted", t1, t1 + timedelta(hours=1), "")]
    assert not cache.is_unavailable(A, at=T0 + timedelta(minutes=45))  # the gap between the two entries


def test_filter_keeps_order_and_drops_only_active_entries(engine: Engine) -> None:
    cache = UnavailableOffers(engine)
    cache.mark(B, "preempted", at=T0)
    cache.mark(C, "capacity", at=T0 - timedelta(hours=1))  # expired by T0
    assert cache.filter([C, B, A], at=T0) == [C, A]
    assert cache.filter([], at=T0) == []
    assert cache.filter([C, B, A], at=T0 + timedelta(hours=1)) == [C, B, A]


def test_active_lists_soonest_expiry_first(engine: Engine) -> None:
    cache = UnavailableOffers(engine)
    cache.mark(A, "quota", at=T0)
    cache.mark(B, "capacity", at=T0)
    cache.mark(C, "preempted", at=T0)
    assert [e.offer for e in cache.active(at=T0)] == [B, C, A]


def test_the_clock_is_used_when_no_time_is_given(engine: Engine) -> None:
    now = [T0]
    cache = UnavailableOffers(engine, clock=lambda: now[0])
    cache.mark(A, "capacity")
    assert cache.is_unavailable(A)
    now[0] = T0 + timedelta(minutes=31)
    assert not cache.is_unavailable(A)
    assert cache.filter([A]) == [A]


def test_entries_survive_a_new_instance_and_are_shared(engine: Engine) -> None:
    UnavailableOffers(engine).mark(A, "preempted", at=T0, detail="spot interruption")
    other = UnavailableOffers(engine)  # another process on the same database
    assert other.is_unavailable(A, at=T0 + timedelta(minutes=1))
    (entry,) = other.active(at=T0)
    assert entry.since.tzinfo is not None and entry.since.utcoffset() == timedelta(0)
    assert entry.detail == "spot interruption"


def test_purge_deletes_only_expired_entries(engine: Engine) -> None:
    cache = UnavailableOffers(engine)
    cache.mark(A, "capacity", at=T0)
    cache.mark(B, "quota", at=T0)
    assert cache.purge(at=T0 + timedelta(hours=1)) == 1
    assert [e.offer for e in cache.active(at=T0)] == [B]


def test_naive_times_and_bad_reasons_are_refused(engine: Engine) -> None:
    cache = UnavailableOffers(engine)
    with pytest.raises(ValueError, match="tz-aware"):
        cache.mark(A, "capacity", at=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="reason"):
        cache.mark(A, "")
    with pytest.raises(ValueError, match="reason"):
        cache.mark(A, "x" * 33)


def test_launch_errors_map_to_reasons() -> None:
    assert reason_for_launch_error(CapacityError("no spot capacity")) == "capacity"
    assert reason_for_launch_error(QuotaError("vCPU quota")) == "quota"
    assert reason_for_launch_error(AuthError("no creds")) is None
    assert reason_for_launch_error(RuntimeError("bug")) is None


def test_drop_from_removes_the_unavailable_offers_rows_of_an_offer_frame(engine: Engine) -> None:
    cache = UnavailableOffers(engine)
    cache.mark(B, "preempted", at=T0)
    frame = pd.DataFrame(
        [(o.cloud.value, o.region, o.zone, o.instance_type, o.market.value, 1.0) for o in (A, B, C)],
        columns=["cloud", "region", "zone", "instance_type", "market", "usd_per_hour"],
    )
    kept = cache.drop_from(frame, at=T0 + timedelta(minutes=5))
    assert kept["instance_type"].tolist() == [A.instance_type, C.instance_type]
    assert kept.index.tolist() == [0, 2]
    assert cache.drop_from(frame, at=T0 + timedelta(hours=2)) is frame  # nothing unavailable then
    with pytest.raises(ValueError, match="lacks columns"):
        cache.drop_from(frame.drop(columns=["zone"]), at=T0)


def test_plans_leave_out_unavailable_offers_at_the_offer_frame(engine: Engine) -> None:
    from api.planning import offers_at
    from costopt.domain import PricePoint
    from costopt.settings import Settings
    from pricing.store import PriceStore

    store = PriceStore(engine)
    store.write([PricePoint(o, T0, 1.5, "test", observed_at=T0) for o in (A, B, C)])
    cache = UnavailableOffers(engine)
    cache.mark(A, "capacity", at=T0)
    at = T0 + timedelta(minutes=10)
    _, everything = offers_at(store, Settings(), at, None)
    _, planned = offers_at(store, Settings(), at, None, unavailable=cache)
    assert len(everything) == 3
    assert sorted(planned["instance_type"]) == sorted([B.instance_type, C.instance_type])
    _, later = offers_at(store, Settings(), T0 + timedelta(hours=1), None, unavailable=cache)
    assert len(later) == 3  # the capacity mark expired after 30 min


# -- the migrator: marks refused offers, skips marked ones ---------------------------------------------


class QuotaProvider(FlakyProvider):
    """Launches on the failing offers raise QuotaError."""

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        if spec.offer in self.failing:
            self.launch_calls.append((spec.offer, idempotency_token))
            raise QuotaError(f"vCPU quota exhausted for {spec.offer.zone}")
        return super().launch(spec, idempotency_token)


def test_the_migrator_marks_refused_offers_and_skips_marked_ones_until_all_are(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    cache = UnavailableOffers(engine)
    mig = make_migrator(engine, local, unavailable=cache)
    mig.register_job("job-1", ENDLESS, str(tmp_path / "ckpt" / "job-1"))
    assert mig.start("job-1", [OFFER_A]).state is State.DONE

    flaky = FlakyProvider(local, failing={OFFER_A})
    rec = make_migrator(engine, flaky, unavailable=cache, sleep=lambda s: None).move("job-1", OFFERS)
    assert rec.state is State.DONE and mig.job("job-1").offer == OFFER_B
    (entry,) = cache.active()
    assert (entry.offer, entry.reason) == (OFFER_A, "capacity") and "CapacityError" in entry.detail

    watching = FlakyProvider(local, failing=set())
    rec = make_migrator(engine, watching, unavailable=cache).move("job-1", OFFERS)
    assert rec.state is State.DONE, rec.reason
    assert [o for o, _ in watching.launch_calls] == [OFFER_B]  # A was skipped, not tried
    assert "skipped 1 offer(s) marked unavailable" in rec.reason

    cache.mark(OFFER_B, "quota")
    rec = make_migrator(engine, watching, unavailable=cache).move("job-1", OFFERS)
    assert rec.state is State.DONE, rec.reason
    assert "all 2 candidate offer(s) are marked unavailable" in rec.reason and "trying them anyway" in rec.reason
    assert watching.launch_calls[-1][0] == OFFER_A  # in the order given
    assert_one_copy(mig, local)


def test_a_recovery_tries_marked_offers_last_and_a_preempted_copy_marks_its_offer(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    cache = UnavailableOffers(engine)
    mig = make_migrator(engine, local, unavailable=cache)
    mig.register_job("job-1", ENDLESS, str(tmp_path / "ckpt" / "job-1"))
    assert mig.start("job-1", [OFFER_A]).state is State.DONE
    current = mig.job("job-1").instance_id
    assert current is not None
    local.preempt(current, notice_seconds=0)
    assert mig.reconcile().marked_for_recovery == ("job-1",)
    assert [(e.offer, e.reason) for e in cache.active()] == [(OFFER_A, "preempted")]

    quota = QuotaProvider(local, failing={OFFER_B})
    rec = make_migrator(engine, quota, unavailable=cache, sleep=lambda s: None).recover("job-1", OFFERS)
    assert rec.state is State.DONE, rec.reason
    assert [o for o, _ in quota.launch_calls] == [OFFER_B, OFFER_A]  # the marked offer last, as a last resort
    assert {(e.offer, e.reason) for e in cache.active()} == {(OFFER_A, "preempted"), (OFFER_B, "quota")}
    assert mig.job("job-1").offer == OFFER_A
    assert_one_copy(mig, local)


def test_a_repeat_of_the_last_mark_is_not_read_or_written_again_while_its_entry_is_active(engine: Engine) -> None:
    """A preemption is marked by the watcher, then by the migrator stopping the copy (same offer, reason and
    time): the repeat costs no statement while the entry is active by the clock, and changes nothing."""
    from sqlalchemy import event

    now = [T0 + timedelta(minutes=5)]
    cache = UnavailableOffers(engine, clock=lambda: now[0])
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", count)
    try:
        cache.mark(A, "preempted", at=T0, detail="i-1 preempted (job j)")
        first = len(statements)
        assert first >= 1  # the entry written (one upsert on SQLite and PostgreSQL; read, then written elsewhere)
        cache.mark(A, "preempted", at=T0, detail="i-1 preempted")
        assert len(statements) == first  # the repeat: nothing read or written
        cache.mark(A, "capacity", at=T0)  # another reason, another time, another offer: as before
        cache.mark(A, "preempted", at=T0 + timedelta(minutes=1))
        cache.mark(B, "preempted", at=T0)
        assert len(statements) >= first + 3
        now[0] = T0 + timedelta(hours=1)  # the entry expired by the clock: a repeat is looked at again
        before = len(statements)
        cache.mark(B, "preempted", at=T0)
        assert len(statements) > before
    finally:
        event.remove(engine, "before_cursor_execute", count)
    (entry,) = [e for e in cache.active(at=T0 + timedelta(minutes=30)) if e.offer == A]
    assert (entry.reason, entry.since, entry.until) == ("preempted", T0, T0 + timedelta(hours=1, minutes=1))
