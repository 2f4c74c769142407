"""The migrator bills every copy of a job in the ledger: one interval per epoch, opened at launch and
closed at its end with the provider's times, the moves' egress and memo lines, nothing counted twice
(resume and the reconciler change nothing), and a ledger failure never stops a migration."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from sqlalchemy import Engine

from costopt.cloud import LaunchSpec
from costopt.ledger.model import ChargeKind
from costopt.ledger.sql import SqlLedger
from costopt.migration.records import EndReason, JobStatus, State, interval_key, job_tags
from providers.local import LocalProvider
from tests.migration.test_machine import (
    ENDLESS,
    OFFER_A,
    OFFER_B,
    OFFER_C,
    OFFERS,
    BrokenNewCopies,
    FlakyProvider,
    assert_ledger_consistent,
    assert_one_copy,
    billed_migrator,
    billed_started_job,
    epoch_of,
    ledger_snapshot,
    step_prices,
)


def test_moves_and_a_recovery_tile_the_jobs_lifetime_one_interval_per_epoch(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    ledger = SqlLedger(engine, step_prices())
    mig = billed_migrator(engine, local, ledger)
    mig.register_job("job-1", ENDLESS, str(tmp_path / "ckpt" / "job-1"))
    assert mig.start("job-1", [OFFER_A]).state is State.DONE
    m2 = mig.move("job-1", [OFFER_C], checkpoint_gb=2.5)  # local -> local-2: egress
    assert m2.state is State.DONE and m2.checkpoint_gb == Decimal("2.5"), m2.reason
    assert mig.move("job-1", [OFFER_B], checkpoint_gb=2.5).state is State.DONE  # local-2 -> local
    current = mig.job("job-1").instance_id
    assert current is not None
    local.preempt(current, notice_seconds=0)
    assert mig.reconcile().marked_for_recovery == ("job-1",)
    assert mig.recover("job-1", [OFFER_A]).state is State.DONE
    assert mig.move("job-1", [OFFER_A], checkpoint_gb=1).state is State.DONE  # same place: no egress
    assert_one_copy(mig, local)

    lines = ledger.intervals(job_id="job-1")
    assert [(epoch_of(ln), ln.record.offer, ln.record.end_reason) for ln in lines] == [
        (1, OFFER_A, "moved"),
        (2, OFFER_C, "moved"),
        (3, OFFER_B, "preempted"),
        (4, OFFER_A, "moved"),
        (5, OFFER_A, None),
    ]
    assert lines[-1].record.instance_id == mig.job("job-1").instance_id
    assert assert_ledger_consistent(engine, ledger, local, "job-1") > 0

    charges = ledger.charges(job_id="job-1")
    egress = [c for c in charges if c.record.kind is ChargeKind.EGRESS]
    assert [(c.record.charge_key, c.amount_usd) for c in egress] == [
        (f"job-1:m{m2.id}:egress", Decimal("0.125")),  # 2.5 GB x $0.05
        (f"job-1:m{m2.id + 1}:egress", Decimal("0.125")),
    ]
    assert all(c.additive for c in egress)
    restarts = [c for c in charges if c.record.kind is ChargeKind.RESTART]
    assert sorted(str(c.record.interval_key) for c in restarts) == sorted(ln.record.interval_key for ln in lines)
    overlaps = {c.record.interval_key: c for c in charges if c.record.kind is ChargeKind.OVERLAP}
    moved = [ln for ln in lines if ln.record.end_reason == "moved"]
    assert set(overlaps) == {ln.record.interval_key for ln in moved}  # the preempted copy overlaps nothing
    for ln in moved:
        span = overlaps[ln.record.interval_key].record.span
        assert span is not None and span[1] == ln.record.ended_at and span[0] < span[1]
    assert not any(c.additive for c in charges if c.record.kind is not ChargeKind.EGRESS)

    report = ledger.costs(job_id="job-1", as_of=datetime.now(UTC))
    closed = sum(ln.amount_micro_usd or 0 for ln in lines[:-1])
    assert report.instances_micro_usd >= closed  # plus the running copy up to now
    assert report.additive_micro_usd == 250_000
    copies = mig.copies("job-1")
    assert copies and all(c.synced and c.ledger_error is None for c in copies)

    before = ledger_snapshot(ledger, "job-1")
    assert billed_migrator(engine, local, ledger).resume() == []
    assert mig.resume("job-1") == []
    assert mig.reconcile().copies_closed == ()
    assert ledger_snapshot(ledger, "job-1") == before


def test_failed_verification_orphans_and_a_rolled_back_launch_are_billed_with_their_reasons(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    ledger, mig = billed_started_job(engine, local, tmp_path)
    # A move whose launches all fail: no copy of epoch 2, nothing billed for it (nor claimed: the next
    # move launches epoch 2 again).
    flaky = FlakyProvider(local, failing=set(OFFERS))
    assert billed_migrator(engine, flaky, ledger, sleep=lambda s: None).move("job-1", OFFERS).state is State.ROLLED_BACK
    assert [epoch_of(ln) for ln in ledger.intervals(job_id="job-1")] == [1]
    # A move whose new copy never progresses: both copies stopped, then a recovery.
    rec = billed_migrator(engine, BrokenNewCopies(local, set()), ledger).move("job-1", OFFERS)
    assert rec.state is State.ROLLED_BACK and rec.to_epoch == 2
    assert mig.job("job-1").status is JobStatus.RECOVERING
    again = mig.recover("job-1", OFFERS)
    assert again.state is State.DONE and again.to_epoch == 3
    lines = ledger.intervals(job_id="job-1")
    assert [(epoch_of(ln), ln.record.end_reason) for ln in lines] == [
        (1, "failed_verification"),
        (2, "failed_verification"),
        (3, None),
    ]
    (restart,) = [c for c in ledger.charges(job_id="job-1") if c.record.interval_key == lines[1].record.interval_key]
    assert restart.record.kind is ChargeKind.RESTART and "never progressed" in (restart.record.note or "")

    # Orphans the reconciler terminates are billed as such, under the job (or the tag) they carry.
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    stale = local.launch(LaunchSpec(OFFER_A, sleeper, tags=job_tags("job-1", 2)), "orphan-stale")
    nojob = local.launch(LaunchSpec(OFFER_B, sleeper, tags=job_tags("no-such-job", 1)), "orphan-nojob")
    report = mig.reconcile()
    assert sorted(report.orphans_terminated) == sorted([stale.instance_id, nojob.instance_id])
    assert len(report.copies_closed) == 2 and report.ledger is not None and report.ledger.pending == 0
    (orphan,) = [ln for ln in ledger.intervals(job_id="job-1") if ln.record.instance_id == stale.instance_id]
    assert orphan.record.end_reason == EndReason.ORPHAN.value and orphan.record.started_at == stale.launched_at
    (other,) = ledger.intervals(job_id="no-such-job")
    assert other.record.end_reason == "orphan" and other.amount_micro_usd is not None
    assert_one_copy(mig, local)
    before = ledger_snapshot(ledger, "job-1")
    assert mig.reconcile().orphans_terminated == () and mig.resume() == []
    assert ledger_snapshot(ledger, "job-1") == before


def test_a_ledger_failure_never_stops_a_move_and_is_recorded_once_prices_are_known(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    unpriced = SqlLedger(engine, step_prices([OFFER_A]))  # no price for OFFER_B yet
    mig = billed_migrator(engine, local, unpriced)
    mig.register_job("job-1", ENDLESS, str(tmp_path / "ckpt" / "job-1"))
    assert mig.start("job-1", [OFFER_A]).state is State.DONE
    assert mig.move("job-1", [OFFER_B]).state is State.DONE  # the restart memo of B cannot be priced
    sync = mig.sync_ledger("job-1")
    assert sync.pending == 1 and "no price" in sync.errors[0], sync
    (pending,) = [c for c in mig.copies("job-1") if not c.synced]
    assert pending.offer == OFFER_B and pending.ledger_error and "no price" in pending.ledger_error

    priced = SqlLedger(engine, step_prices())
    fixed = billed_migrator(engine, local, priced)
    assert fixed.resume() == []  # resume brings the ledger up to date
    assert fixed.sync_ledger().pending == 0
    copies = fixed.copies("job-1")
    assert copies and all(c.synced and c.ledger_error is None for c in copies)
    assert_ledger_consistent(engine, priced, local, "job-1")


def test_without_a_ledger_the_facts_are_kept_and_billed_later(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    mig = billed_migrator(engine, local, None)
    mig.register_job("job-1", ENDLESS, str(tmp_path / "ckpt" / "job-1"))
    assert mig.start("job-1", [OFFER_A]).state is State.DONE
    assert mig.move("job-1", [OFFER_B]).state is State.DONE
    facts = mig.copies("job-1")
    assert [(c.epoch, c.end_reason, c.ledger_opened) for c in facts] == [(1, "moved", False), (2, None, False)]
    ledger = SqlLedger(engine, step_prices())
    assert billed_migrator(engine, local, ledger).sync_ledger().written >= 4
    assert [epoch_of(ln) for ln in ledger.intervals(job_id="job-1")] == [1, 2]
    assert_ledger_consistent(engine, ledger, local, "job-1")


def test_interval_keys_name_provider_job_epoch_and_instance_within_255_characters() -> None:
    assert interval_key("local", "job-1", 3, "local-abc") == "local:job-1:e3:local-abc"
    long = interval_key("local", "j" * 200, 12, "i" * 200)
    assert len(long) <= 255 and long.startswith("local:") and ":e12:" in long
    assert long != interval_key("local", "j" * 199 + "k", 12, "i" * 200)
