"""The migration state machine with the local provider and the example script: moves, rollbacks,
recovery after a preemption, resume after a crash at every state, and the reconciler."""

from __future__ import annotations

import builtins
import itertools
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, select

from costopt.agent import control
from costopt.cloud import CapacityError, CloudProvider, Instance, InstanceState, Interruption, LaunchSpec
from costopt.db.migration_schema import migrations
from costopt.domain import Cloud, Market, OfferKey
from costopt.ledger.model import IntervalLine, segment_micro_usd
from costopt.ledger.prices import StepPrices
from costopt.ledger.sql import SqlLedger
from costopt.migration.machine import Migrator
from costopt.migration.reconcile import reconcile
from costopt.migration.records import ALIVE_STATES, TAG_JOB, TAG_MANAGED, EndReason, JobStatus, Kind, State, job_tags
from costopt.planning.model import EgressRates
from costopt.settings import PROJECT_ROOT
from providers.local import LocalProvider

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py

OFFER_A = OfferKey(Cloud.LOCAL, "local", "local-a", "cpu-1", Market.SPOT)
OFFER_B = OfferKey(Cloud.LOCAL, "local", "local-b", "cpu-1", Market.SPOT)
OFFERS = (OFFER_A, OFFER_B)
# Runs until terminated (or moved): ~200 steps/s, a checkpoint every 50 steps.
ENDLESS = [sys.executable, str(PROJECT_ROOT / "examples" / "train.py"), "--steps", "1000000",
           "--checkpoint-every", "50", "--step-seconds", "0.005"]  # fmt: skip

CRASH_POINTS = (
    "enter:planned",
    "enter:checkpointing",
    "enter:checkpointed",
    "enter:launching",
    "launch:returned",
    "enter:launched",
    "enter:verifying",
    "enter:terminating_old",
    "enter:done",
)
"""The 9 state transitions (the fault-injection points of every move)."""
LEDGER_POINTS = ("ledger:opened", "ledger:closed")
"""Right after a ledger write, before its flag is committed (only with a ledger)."""
AFTER_LAST_COMMIT = ("enter:done", "ledger:closed")
"""Crash points at which the move is already done: resume() has nothing left to run."""


class Crash(Exception):
    """The migrator 'dies' here (a raised exception standing in for a crash)."""


class FlakyProvider:
    """A provider whose launches on some offers fail with CapacityError (before creating anything)."""

    def __init__(self, inner: LocalProvider, failing: set[OfferKey]) -> None:
        self.inner = inner
        self.failing = failing
        self.name = inner.name
        self.launch_calls: list[tuple[OfferKey, str]] = []

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        self.launch_calls.append((spec.offer, idempotency_token))
        if spec.offer in self.failing:
            raise CapacityError(f"no capacity for {spec.offer.zone}")
        return self.inner.launch(spec, idempotency_token)

    def terminate(self, instance_id: str) -> None:
        self.inner.terminate(instance_id)

    def describe(self, instance_id: str) -> Instance:
        return self.inner.describe(instance_id)

    def list(self, tags: Mapping[str, str]) -> builtins.list[Instance]:
        return self.inner.list(tags)

    def interruptions(self, since: datetime) -> builtins.list[Interruption]:
        return self.inner.interruptions(since)

    def acknowledge(self, interruptions: Sequence[Interruption]) -> None:
        self.inner.acknowledge(interruptions)

    def output(self, instance_id: str, *, tail: int | None = None) -> str:
        return self.inner.output(instance_id, tail=tail)


def make_migrator(engine: Engine, provider: object, **kw: object) -> Migrator:
    fast = {"checkpoint_timeout": 20.0, "verify_timeout": 20.0, "backoff_base": 0.01, "poll_seconds": 0.05}
    return Migrator(engine, provider, **{**fast, **kw})  # type: ignore[arg-type]


def alive(provider: LocalProvider) -> list[Instance]:
    return [i for i in provider.list({TAG_MANAGED: "true"}) if i.state in ALIVE_STATES]


def started_job(engine: Engine, provider: LocalProvider, tmp_path: Path, job_id: str = "job-1") -> Migrator:
    mig = make_migrator(engine, provider)
    mig.register_job(job_id, ENDLESS, str(tmp_path / "ckpt" / job_id))
    rec = mig.start(job_id, OFFERS)
    assert rec.state is State.DONE, rec.reason
    return mig


def assert_one_copy(mig: Migrator, provider: LocalProvider, job_id: str = "job-1") -> None:
    job = mig.job(job_id)
    running = alive(provider)
    assert [i.instance_id for i in running] == [job.instance_id]
    assert running[0].tags["costopt-epoch"] == str(job.epoch)
    assert control.current_epoch(job.checkpoint_uri) == job.epoch
    assert reconcile(mig.engine, provider).orphans_terminated == ()


# Another region of this machine, so a move there ships its checkpoint (egress).
OFFER_C = OfferKey(Cloud.LOCAL, "local-2", "local-c", "cpu-1", Market.SPOT)
USD_PER_HOUR = {OFFER_A: 0.9, OFFER_B: 1.2, OFFER_C: 0.6}
EGRESS = EgressRates(inter_region={Cloud.LOCAL: 0.05}, internet={Cloud.LOCAL: 0.09})
PRICED_SINCE = datetime(2020, 1, 1, tzinfo=UTC)


def step_prices(offers: Sequence[OfferKey] = tuple(USD_PER_HOUR)) -> StepPrices:
    """One price per offer, in effect since 2020."""
    since_ns = int(PRICED_SINCE.timestamp()) * 1_000_000_000
    return StepPrices(
        list(offers),
        [np.array([since_ns], dtype=np.int64) for _ in offers],
        [np.array([USD_PER_HOUR[o]]) for o in offers],
        {},
    )


def billed_started_job(
    engine: Engine, local: CloudProvider, tmp_path: Path, offers: Sequence[OfferKey] = OFFERS
) -> tuple[SqlLedger, Migrator]:
    """A billed migrator with ``job-1`` (:data:`ENDLESS`) registered and started on one of ``offers``."""
    ledger = SqlLedger(engine, step_prices())
    mig = billed_migrator(engine, local, ledger)
    mig.register_job("job-1", ENDLESS, str(tmp_path / "ckpt" / "job-1"))
    assert mig.start("job-1", offers).state is State.DONE
    return ledger, mig


def billed_migrator(engine: Engine, provider: CloudProvider, ledger: SqlLedger | None, **kw: Any) -> Migrator:
    """A migrator billing into ``ledger`` (None: not billed), with the test egress rates."""
    return Migrator(
        engine,
        provider,
        checkpoint_timeout=20.0,
        verify_timeout=20.0,
        backoff_base=0.01,
        poll_seconds=0.05,
        ledger=ledger,
        egress=EGRESS,
        **kw,
    )


def epoch_of(item: IntervalLine | Any) -> int:
    """The epoch in an interval key (of a ledger line or an interval record)."""
    key = item.record.interval_key if isinstance(item, IntervalLine) else item.interval_key
    match = re.search(r":e(\d+):", key)
    assert match, key
    return int(match.group(1))


def ledger_snapshot(ledger: SqlLedger, job_id: str) -> tuple[Any, ...]:
    return (
        [(ln.record, ln.segments, ln.amount_micro_usd) for ln in ledger.intervals(job_id=job_id)],
        [(c.record.charge_key, c.record.kind, c.record.at, c.amount_micro_usd) for c in ledger.charges(job_id=job_id)],
    )


def assert_ledger_consistent(engine: Engine, ledger: SqlLedger, provider: LocalProvider, job_id: str) -> float:
    """The job's ledger intervals against the provider's view of its copies: one interval per epoch, no
    key twice, each interval's bounds the copy's launch and end times (so the billed time is the sum of
    the copies' lifetimes), only the current copy open, consecutive epochs overlapping only across a
    move's launch-to-terminate window, and closed intervals priced exactly. Returns the billed seconds."""
    lines = ledger.intervals(job_id=job_id)
    keys = [ln.record.interval_key for ln in lines]
    assert len(keys) == len(set(keys)), keys
    epochs = sorted(epoch_of(ln) for ln in lines)
    assert epochs == list(range(1, len(lines) + 1)), epochs  # one interval per epoch, none missing
    by_epoch = {epoch_of(ln): ln.record for ln in lines}

    instances = {i.instance_id: i for i in provider.list({TAG_JOB: job_id})}
    assert set(instances) == {r.instance_id for r in by_epoch.values()}  # every copy billed, nothing else
    now = datetime.now(UTC)
    billed = lifetimes = 0.0
    for rec in by_epoch.values():
        inst = instances[rec.instance_id]
        assert rec.started_at == inst.launched_at, rec
        if rec.ended_at is None:
            assert inst.state in (InstanceState.PENDING, InstanceState.RUNNING), rec
        else:
            assert inst.state in (InstanceState.TERMINATED, InstanceState.PREEMPTED), (rec, inst.state)
            assert rec.ended_at == inst.terminated_at, rec
        billed += ((rec.ended_at or now) - rec.started_at).total_seconds()
        lifetimes += ((inst.terminated_at or now) - (inst.launched_at or now)).total_seconds()
    assert billed == pytest.approx(lifetimes, abs=1e-6)
    assert sum(r.ended_at is None for r in by_epoch.values()) <= 1

    with engine.connect() as conn:
        windows = {
            int(r.to_epoch): (r.created_at, r.updated_at)
            for r in conn.execute(select(migrations).where(migrations.c.job_id == job_id)).all()
            if r.state == State.DONE.value
        }
    ordered = [by_epoch[e] for e in sorted(by_epoch)]
    for prev, cur in itertools.pairwise(ordered):
        assert prev.ended_at is not None
        if prev.ended_at > cur.started_at:  # the intended overlap: the old copy runs while the new one verifies
            assert prev.end_reason == EndReason.MOVED.value, (prev, cur)
            lo, hi = windows[epoch_of(cur)]
            assert lo <= cur.started_at and prev.ended_at <= hi, (prev, cur, lo, hi)
    for i, a in enumerate(ordered):
        for b in ordered[i + 2 :]:  # non-consecutive copies never overlap
            assert a.ended_at is not None and a.ended_at <= b.started_at, (a, b)

    for ln in lines:
        if ln.record.ended_at is not None:
            price = Decimal(repr(USD_PER_HOUR[ln.record.offer]))
            expected = segment_micro_usd(ln.record.started_at, ln.record.ended_at, price, Decimal(1))
            assert ln.amount_micro_usd == expected, ln
    return billed


def test_a_registered_job_starts_as_epoch_1_from_scratch(engine: Engine, local: LocalProvider, tmp_path: Path) -> None:
    mig = started_job(engine, local, tmp_path)
    job = mig.job("job-1")
    assert (job.epoch, job.status, job.offer) == (1, JobStatus.RUNNING, OFFER_A)
    assert control.progress(job.checkpoint_uri, 1).progressing
    assert_one_copy(mig, local)


def test_registering_a_job_another_process_registered_between_read_and_insert_returns_its_record(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    """Two processes registering one job at once (seen in the soak: a duplicate key of pk_migration_jobs logged
    with a traceback): the one whose insert loses gets the winner's record, not an error."""
    from sqlalchemy import event

    a, b = make_migrator(engine, local), make_migrator(engine, local)
    first = a.register_job("job-1", ENDLESS, str(tmp_path / "ckpt" / "job-1"))
    stale: list[str] = []

    def read_before_the_other_commit(
        conn: object, cursor: object, statement: str, parameters: object, context: object, many: bool
    ) -> tuple[str, object]:
        # b's first read of the job misses a's row, as a read just before a's commit would
        if not stale and statement.lstrip().upper().startswith("SELECT") and "FROM migration_jobs" in statement:
            stale.append(statement)
            statement += " AND 1 = 0"
        return statement, parameters

    event.listen(engine, "before_cursor_execute", read_before_the_other_commit, retval=True)
    try:
        second = b.register_job("job-1", ["other"], str(tmp_path / "other"))
    finally:
        event.remove(engine, "before_cursor_execute", read_before_the_other_commit)
    assert stale and second == first  # the read missed it, the insert collided, a's record stands


def test_a_move_checkpoints_launches_the_next_epoch_verifies_it_and_terminates_the_old_copy(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    mig = started_job(engine, local, tmp_path)
    old = mig.job("job-1").instance_id
    rec = mig.move("job-1", OFFERS)
    assert rec.state is State.DONE, rec.reason
    assert (rec.kind, rec.from_epoch, rec.to_epoch, rec.old_instance_id) == (Kind.MOVE, 1, 2, old)
    job = mig.job("job-1")
    assert (job.epoch, job.instance_id, job.status) == (2, rec.new_instance_id, JobStatus.RUNNING)
    assert local.describe(old).state is InstanceState.TERMINATED  # type: ignore[arg-type]
    prog = control.progress(job.checkpoint_uri, 2)
    assert prog.progressing and prog.restored_step > 0  # restored the checkpoint the move asked for
    assert_one_copy(mig, local)


def test_launch_failures_back_off_and_try_the_next_offer_with_a_new_token(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    started_job(engine, local, tmp_path)
    flaky = FlakyProvider(local, failing={OFFER_A})
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        time.sleep(min(s, 0.05))

    mig2 = make_migrator(engine, flaky, sleep=sleep)
    rec = mig2.move("job-1", OFFERS)
    assert rec.state is State.DONE, rec.reason
    assert [o for o, _ in flaky.launch_calls] == [OFFER_A, OFFER_B]
    assert len({t for _, t in flaky.launch_calls}) == 2
    assert 0.01 in sleeps  # backed off (backoff_base) before the next offer
    assert mig2.job("job-1").offer == OFFER_B
    assert_one_copy(mig2, local)


def test_a_move_whose_launches_all_fail_rolls_back_and_the_old_copy_keeps_running_unfenced(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    mig = started_job(engine, local, tmp_path)
    old = mig.job("job-1").instance_id
    flaky = FlakyProvider(local, failing=set(OFFERS))
    rec = make_migrator(engine, flaky, sleep=lambda s: None).move("job-1", OFFERS)
    assert rec.state is State.ROLLED_BACK
    assert "launch failed on all 2 offer(s)" in rec.reason and "old copy keeps running" in rec.reason
    job = mig.job("job-1")
    assert (job.status, job.epoch, job.instance_id) == (JobStatus.RUNNING, 1, old)
    assert control.current_epoch(job.checkpoint_uri) == 1  # nothing claimed: the old copy may still write
    before = control.progress(job.checkpoint_uri, 1).last_step
    time.sleep(0.5)
    assert control.progress(job.checkpoint_uri, 1).last_step > before
    assert_one_copy(mig, local)


def test_a_reconcile_of_one_job_marks_that_job_alone_and_sweeps_no_orphan(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    """``reconcile(..., job_id=)`` (the engine's close of one finished job's copy, once per finished job: the
    whole pass each time grew with the history in the soak) looks at that job's instance and copies only;
    the whole pass still finds the rest."""
    mig = started_job(engine, local, tmp_path, "job-1")
    mig.register_job("job-2", ENDLESS, str(tmp_path / "ckpt" / "job-2"))
    assert mig.start("job-2", OFFERS).state is State.DONE
    for job_id in ("job-1", "job-2"):
        iid = mig.job(job_id).instance_id
        assert iid is not None
        local.preempt(iid, notice_seconds=0)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    orphan = local.launch(LaunchSpec(OFFER_A, sleeper, tags=job_tags("no-such-job", 1)), "orphan-nojob")
    one = reconcile(engine, local, job_id="job-1")
    assert one.marked_for_recovery == ("job-1",) and one.orphans_terminated == ()
    assert mig.job("job-2").status is JobStatus.RUNNING  # not looked at
    assert local.describe(orphan.instance_id).state is not InstanceState.TERMINATED
    whole = reconcile(engine, local)
    assert whole.marked_for_recovery == ("job-2",) and whole.orphans_terminated == (orphan.instance_id,)


def test_after_a_preemption_recovery_launches_a_new_epoch_from_the_last_checkpoint(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    mig = started_job(engine, local, tmp_path)
    job = mig.job("job-1")
    assert job.instance_id is not None
    local.preempt(job.instance_id, notice_seconds=0)  # taken at once, no notice
    last = control.latest(job.checkpoint_uri)
    report = reconcile(engine, local)
    assert report.marked_for_recovery == ("job-1",)
    assert mig.job("job-1").status is JobStatus.RECOVERING
    rec = mig.recover("job-1", OFFERS)
    assert rec.state is State.DONE, rec.reason
    assert (rec.kind, rec.to_epoch) == (Kind.RECOVER, 2)
    prog = control.progress(job.checkpoint_uri, 2)
    assert prog.restored_step == (last.step if last else 0)
    assert_one_copy(mig, local)


def test_the_reconciler_terminates_an_orphan_of_a_stale_epoch_and_one_of_no_job(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    mig = started_job(engine, local, tmp_path)
    assert mig.move("job-1", OFFERS).state is State.DONE
    job = mig.job("job-1")
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    stale = local.launch(LaunchSpec(OFFER_A, sleeper, tags=job_tags("job-1", 1)), "orphan-stale")
    nojob = local.launch(LaunchSpec(OFFER_A, sleeper, tags=job_tags("no-such-job", 1)), "orphan-nojob")
    report = reconcile(engine, local)
    assert sorted(report.orphans_terminated) == sorted([stale.instance_id, nojob.instance_id])
    assert local.describe(stale.instance_id).state is InstanceState.TERMINATED
    assert local.describe(nojob.instance_id).state is InstanceState.TERMINATED
    assert mig.job("job-1").instance_id == job.instance_id
    assert_one_copy(mig, local)


@pytest.mark.slow
def test_a_crash_at_every_state_resumes_to_exactly_one_copy_with_no_orphans_or_second_launch(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    """A raised exception at each transition and after each ledger write (one move per point, same job),
    then a fresh migrator's resume(): the move completes, one copy runs, the token launched nothing
    twice, and the ledger bills each copy once."""
    ledger, mig = billed_started_job(engine, local, tmp_path)
    uri = mig.job("job-1").checkpoint_uri
    for n, point in enumerate(CRASH_POINTS + LEDGER_POINTS, start=2):

        def hook(p: str, point: str = point) -> None:
            if p == point:
                raise Crash(p)

        crashing = billed_migrator(engine, local, ledger, hook=hook)
        with pytest.raises(Crash):
            crashing.move("job-1", OFFERS)
        resumed = billed_migrator(engine, local, ledger, hook=lambda p: None).resume("job-1")
        if point in AFTER_LAST_COMMIT:
            assert resumed == [], point  # the crash came after the last commit
        else:
            assert [r.state for r in resumed] == [State.DONE], point
        assert mig.job("job-1").epoch == n, point
        assert len(local.list({"costopt-job": "job-1", "costopt-epoch": str(n)})) == 1, point
        assert_one_copy(mig, local)
        assert_ledger_consistent(engine, ledger, local, "job-1")
        assert len(ledger.intervals(job_id="job-1")) == n, point
    audit = control.audit_job(uri)
    assert audit.checkpoints_monotonic and audit.repeated_steps == 0, audit.problems


class BrokenNewCopies(FlakyProvider):
    """Launches of epoch >= 2 run a command that exits at once without progressing."""

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        if int(spec.tags["costopt-epoch"]) >= 2:
            spec = LaunchSpec(spec.offer, [sys.executable, "-c", "raise SystemExit(1)"], spec.env, spec.tags)
        return self.inner.launch(spec, idempotency_token)


def test_a_new_copy_that_never_progresses_is_terminated_and_the_job_is_marked_for_recovery(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    mig = started_job(engine, local, tmp_path)
    old = mig.job("job-1").instance_id
    rec = make_migrator(engine, BrokenNewCopies(local, set())).move("job-1", OFFERS)
    assert rec.state is State.ROLLED_BACK
    assert "exited; the job needs recovery" in rec.reason
    job = mig.job("job-1")
    assert job.status is JobStatus.RECOVERING and job.reason == rec.reason
    assert local.describe(old).state is InstanceState.TERMINATED  # type: ignore[arg-type]  # fenced: stopped
    assert alive(local) == []
    again = mig.recover("job-1", OFFERS)
    assert again.state is State.DONE and again.to_epoch == 3, again.reason
    assert_one_copy(mig, local)


def test_a_copy_preempted_while_the_move_waits_for_its_checkpoint_is_replaced_at_once(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    mig = started_job(engine, local, tmp_path)
    old = mig.job("job-1").instance_id
    assert old is not None

    def preempt_old(point: str) -> None:
        # Freeze the old copy before the request is written, so it cannot answer before the
        # preemption lands (a real process racing the test otherwise); SIGKILL takes it stopped.
        if point == "enter:planned":
            assert local._signal(old, signal.SIGSTOP)
        if point == "enter:checkpointing":
            local.preempt(old, notice_seconds=0)

    rec = make_migrator(engine, local, hook=preempt_old).move("job-1", OFFERS)
    assert rec.state is State.DONE, rec.reason
    assert rec.reason == "old copy gone while checkpointing"
    assert local.describe(old).state is InstanceState.PREEMPTED
    assert_one_copy(mig, local)
