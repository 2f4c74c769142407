"""A fleet's bill survives a restart and ends (both backends): an ended instance's bill to its end is marked
in the database (``fleet_instances.billed_to``), so a crash between an instance's end and its record, then
a release, gives the same bill as no crash; a released fleet that lost an instance leaves the executor's
work list once billed; an instance drained mid-round is released once that round is billed; what the
executor keeps of a fleet in memory is dropped once the fleet is released and billed; a stopped executor
starts no pass and the app's shutdown waits for a running one."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from api.app import stop_background
from api.scheduler import new_scheduler
from costopt.cloud import CloudError, Instance, LaunchSpec
from costopt.fleets.billing import FleetBilling
from costopt.fleets.executor import FleetExecutor
from costopt.fleets.model import (
    FLEET_PROVIDER,
    FleetInstance,
    FleetJobStatus,
    FleetRecord,
    InstanceState,
    NewFleet,
    NewInstance,
)
from costopt.fleets.store import FleetRepository, NewFleetJob
from costopt.fleets.sync import WorkerSync
from costopt.jobs.records import JobRepository, NewJob
from costopt.ledger.book import MemoryLedger
from costopt.ledger.prices import price_segments
from costopt.ledger.sql import SqlLedger
from tests.fleets.test_executor import K80, T0, V100, Clock, FakeProvider, StepPricesFor, exited

ONLY_V100 = {"v100": 10.0}


@dataclass
class Run:
    """One fleet of a V100 and a K80 instance (one GPU each), billed into the shared database's ledger under
    its own team (two runs compare their bills in one database)."""

    team: str
    clock: Clock
    repo: FleetRepository
    jobs: JobRepository
    sync: WorkerSync
    provider: FakeProvider
    prices: StepPricesFor
    ledger: SqlLedger
    executor: FleetExecutor
    fleet_id: str
    tmp: Path

    def new_executor(self, *, billing: bool = True) -> FleetExecutor:
        """A fresh executor and billing over the same database: what a restarted service builds."""
        repo = FleetRepository(self.repo.engine, now=self.clock)
        return FleetExecutor(
            repo,
            JobRepository(self.repo.engine, now=self.clock),
            {"local": self.provider},
            worker_command=lambda p: ["python", "-m", "costopt.agent.worker"],
            service_url="http://svc:8000/",
            dead_after_s=30,
            boot_timeout_s=300,
            full_every_s=0.0,
            billing=FleetBilling(repo, SqlLedger(self.repo.engine, self.prices), self.prices) if billing else None,
        )

    def tick(self) -> Any:
        report = self.executor.tick()
        assert report.errors == []
        return report

    def workers(self) -> list[str]:
        return [i.id for i in self.repo.instances(self.fleet_id)]

    def worker_sync(self, worker: str, copies: Any = ()) -> dict[str, Any]:
        inst = self.repo.instance(worker)
        assert inst is not None and inst.instance_id is not None
        token = self.provider.launched[inst.instance_id].env["COSTOPT_WORKER_TOKEN"]
        return self.sync.sync(worker, token, {"copies": list(copies)})

    def live_for(self, seconds: float, workers: list[str]) -> None:
        left = seconds
        while left > 0:
            step = min(10.0, left)
            self.clock.advance(step)
            left -= step
            for w in workers:
                self.worker_sync(w)

    def exit_held(self, workers: list[str], jobs: list[str], step: int, code: int) -> None:
        """Each of ``workers`` reports the copies it holds of ``jobs`` exited at ``step`` with exit ``code``,
        under their holder epochs."""
        for w in workers:
            for j in jobs:
                fj = self.repo.job(j)
                if fj is not None and fj.holder == w and fj.holder_epoch is not None:
                    self.worker_sync(w, [exited(j, fj.holder_epoch, step, code)])

    def submit(self, name: str, steps: int, rates: Mapping[str, float]) -> str:
        job_id = f"{self.team}-{name}"
        spec = {
            "command": ["python", "train.py"],
            "checkpoint_uri": f"file://{self.tmp}/{job_id}",
            "fleet_id": self.fleet_id,
        }
        job, _ = self.jobs.insert(NewJob(self.team, spec, steps, FLEET_PROVIDER, job_id=job_id))
        self.repo.add_job(NewFleetJob(job_id, self.fleet_id, self.team, 1, dict(rates), steps, job.created_at))
        return job_id

    def fleet(self) -> FleetRecord:
        return self.repo.get(self.fleet_id)

    def bill(self) -> dict[str, int]:
        """Micro-dollars per ledger job (this run's prefix taken off; the fleet's idle lines: ``fleet``) and
        per cloud instance id, and the total."""
        out: dict[str, int] = defaultdict(int)
        for line in self.ledger.costs(team=self.team).lines:
            job = "fleet" if line.record.job_id == self.fleet_id else line.record.job_id.removeprefix(f"{self.team}-")
            out[f"job:{job}"] += line.amount_micro_usd
            out[f"instance:{line.record.instance_id}"] += line.amount_micro_usd
            out["total"] += line.amount_micro_usd
        return dict(out)


def make_run(engine: Engine, tmp: Path, team: str, *, policy: str = "max_min_fairness_perf") -> Run:
    clock = Clock()
    repo = FleetRepository(engine, now=clock)
    jobs = JobRepository(engine, now=clock)
    fleet, _ = repo.create(
        NewFleet(
            team_id=team,
            policy=policy,
            instances=(
                NewInstance(V100, "v100", 1, "local", Decimal("0.95")),
                NewInstance(K80, "k80", 1, "local", Decimal("0.35")),
            ),
            round_s=60.0,
            resolve_rounds=1000,
        )
    )
    prices = StepPricesFor()
    run = Run(
        team,
        clock,
        repo,
        jobs,
        WorkerSync(repo, jobs, poll_s=0.5),
        FakeProvider(),
        prices,
        SqlLedger(engine, prices),
        None,  # type: ignore[arg-type]  # set just below
        fleet.id,
        tmp,
    )
    run.executor = run.new_executor()
    return run


class Died(RuntimeError):
    """The service process dies here (not an error a pass catches: it leaves the pass)."""


class DiesWhenBilling:
    """A FleetBiller whose every call is where the process dies."""

    def __call__(self, fleet: FleetRecord, now: datetime) -> object:
        raise Died("the process died before billing")

    def stray(
        self,
        fleet: FleetRecord,
        inst: FleetInstance,
        cloud_instance_id: str,
        started_at: datetime,
        ended_at: datetime | None,
    ) -> bool:
        raise Died("the process died before billing a stray")

    def open_strays(self, fleet: FleetRecord, inst: FleetInstance) -> list[tuple[str, datetime]]:
        raise Died("the process died before reading the open strays")


def _lost_in_a_gap_then_released(run: Run, *, crash: str | None) -> None:
    """One job holds the V100 in round 1 and finishes 5 s in; the round ends at the boundary (60 s) and no
    round follows. The V100's worker then goes silent: it is lost 100 s in, its last stretch [60 s, 100 s)
    in no round (only the instance's own end bills it) and a replacement is launched. ``crash``: the service
    dies in that pass after writing the loss, before billing it (``before_billing``), or after the stretch's
    lines but before their mark (``before_mark``); a fresh executor and billing over the same database go on.
    Then the fleet is released and every worker ends."""
    run.tick()
    v100, k80 = run.workers()
    run.worker_sync(v100)
    run.worker_sync(k80)
    a = run.submit("a", 50, ONLY_V100)
    run.tick()
    assert run.worker_sync(v100)["run"]
    done_at = (T0 + timedelta(seconds=5)).timestamp()
    run.worker_sync(v100, [exited(a, 1, 50, 0, done=True, checkpoint_step=50, ended_at=done_at)])
    run.live_for(60, [v100, k80])
    run.tick()  # nobody left: round 1 ends at 60 s
    assert run.repo.round(run.fleet_id, 1) is not None and run.fleet().round == 1
    run.live_for(40, [k80])  # the V100 silent since 60 s
    if crash == "before_billing":
        run.executor.billing = DiesWhenBilling()
        with pytest.raises(Died):
            run.executor.tick()
    elif crash == "before_mark":

        def dies(self: FleetRepository, instance_id: str, at: datetime) -> None:
            raise Died("the process died after the lines, before their mark")

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(FleetRepository, "mark_billed_to", dies)
            with pytest.raises(Died):
                run.executor.tick()
        assert run.bill()["job:fleet"] > 0  # the lines were written
    else:
        assert run.tick().lost == [v100]
    lost = run.repo.instance(v100)
    assert lost is not None and lost.state is InstanceState.LOST and lost.ended_at == T0 + timedelta(seconds=100)
    if crash is not None:
        assert lost.billed_to is None  # the crash came first
        run.executor = run.new_executor()  # the restart
    (new,) = [i.id for i in run.repo.instances(run.fleet_id) if i.replaces == v100]
    run.live_for(5, [k80, new])
    run.tick()
    run.repo.release(run.fleet_id)
    run.live_for(5, [k80, new])
    run.tick()


@pytest.mark.parametrize("crash", ["before_billing", "before_mark"])
def test_a_lost_instances_last_stretch_is_billed_once_after_a_crash_and_the_fleet_then_leaves_the_work_list(
    engine: Engine, tmp_path: Path, crash: str
) -> None:
    reference = make_run(engine, tmp_path, "team-ref")
    _lost_in_a_gap_then_released(reference, crash=None)
    crashed = make_run(engine, tmp_path, "team-crash")
    _lost_in_a_gap_then_released(crashed, crash=crash)
    for run in (reference, crashed):
        insts = run.repo.instances(run.fleet_id)
        assert {i.state for i in insts} == {InstanceState.LOST, InstanceState.RELEASED}
        assert all(i.billed_to is not None and i.billed_to == i.ended_at for i in insts)
        assert all(r.billed for r in run.repo.rounds(run.fleet_id))
    expected = reference.bill()
    # the lost V100's life: round 1's lease [0, 60 s) on job a and its last stretch [60 s, 100 s) on the fleet
    v100_life = sum(
        s.amount_micro_usd
        for a, b in ((T0, T0 + timedelta(seconds=60)), (T0 + timedelta(seconds=60), T0 + timedelta(seconds=100)))
        for s in price_segments(reference.prices, V100, a, b)
    )
    assert expected["instance:i-0"] == v100_life
    assert crashed.bill() == expected  # to the micro-dollar, line for line per job and instance
    lines = [len(r.ledger.costs(team=r.team).lines) for r in (reference, crashed)]
    assert lines[0] == lines[1]  # nothing recorded twice
    # every instance terminated and billed to its end: the released fleet leaves the work list
    assert crashed.tick().fleets == 0 and reference.tick().fleets == 0


def test_a_fresh_billing_over_a_billed_fleet_finds_nothing_to_do(engine: Engine, tmp_path: Path) -> None:
    """The marks are in the database: a restarted service does not walk a billed fleet's rounds again."""
    run = make_run(engine, tmp_path, "team-a")
    _lost_in_a_gap_then_released(run, crash=None)
    before = run.bill()
    fresh = run.new_executor()
    assert fresh.billing is not None
    assert fresh.billing(run.fleet(), run.clock()) == 0
    assert run.bill() == before


@pytest.mark.parametrize("billed", [True, False])
def test_a_released_fleet_that_lost_an_instance_leaves_the_work_list(
    engine: Engine, tmp_path: Path, billed: bool
) -> None:
    run = make_run(engine, tmp_path, "team-a")
    run.executor = run.new_executor(billing=billed)
    run.tick()
    v100, k80 = run.workers()
    run.worker_sync(v100)
    run.worker_sync(k80)
    run.live_for(40, [k80])
    assert run.tick().lost == [v100]
    run.repo.release(run.fleet_id)
    run.clock.advance(1)
    run.tick()
    assert {i.state for i in run.repo.instances(run.fleet_id)} == {InstanceState.LOST, InstanceState.RELEASED}
    run.clock.advance(1)
    assert run.tick().fleets == 0
    assert run.repo.released_with_instances(billed=billed) == []
    if billed:
        assert all(i.billed_to == i.ended_at for i in run.repo.instances(run.fleet_id))


def test_an_instance_drained_mid_round_is_released_once_that_round_is_billed(engine: Engine, tmp_path: Path) -> None:
    """Scaled down: its job moves at the next round, its copy exits, it is terminated inside that round;
    the round's window bills it to its end, then it is released (and the fleet, once released, leaves the
    work list)."""
    run = make_run(engine, tmp_path, "team-a")
    run.tick()
    v100, k80 = run.workers()
    run.worker_sync(v100)
    run.worker_sync(k80)
    jobs = [run.submit(n, 10_000, {"v100": 10.0, "k80": 2.0}) for n in "ab"]
    run.tick()
    for w in (v100, k80):
        assert run.worker_sync(w)["run"]
    run.live_for(10, [v100, k80])
    assert run.repo.drain(run.fleet_id, [k80]) == [k80]
    run.live_for(50, [v100, k80])
    run.tick()  # round 2: the V100 only
    on_k80 = [j for j in jobs if (fj := run.repo.job(j)) is not None and fj.holder == k80]
    assert len(on_k80) == 1
    run.clock.advance(5)
    run.worker_sync(k80, [exited(on_k80[0], 1, 10, 75, checkpoint_step=10)])
    run.tick()  # nobody holds it: terminated 65 s in, inside round 2
    drained = run.repo.instance(k80)
    assert drained is not None and drained.state is InstanceState.DRAINING
    assert drained.ended_at == T0 + timedelta(seconds=65) and drained.billed_to is None
    run.live_for(55, [v100])
    report = run.tick()  # round 2 ended and billed: the K80 is billed to its end
    assert report.released == [k80]
    drained = run.repo.instance(k80)
    assert drained is not None and drained.billed_to == drained.ended_at
    k80_id = drained.instance_id
    life = sum(
        s.amount_micro_usd
        for a, b in ((T0, T0 + timedelta(seconds=60)), (T0 + timedelta(seconds=60), T0 + timedelta(seconds=65)))
        for s in price_segments(run.prices, K80, a, b)
    )
    assert run.bill()[f"instance:{k80_id}"] == life
    run.repo.release(run.fleet_id)
    for _ in range(3):
        run.clock.advance(5)
        run.exit_held([v100], jobs, 20, 75)
        run.tick()
    assert {i.state for i in run.repo.instances(run.fleet_id)} == {InstanceState.RELEASED}
    assert run.tick().fleets == 0


def test_an_instance_waiting_for_its_round_to_be_billed_reads_the_recent_rounds_only(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After several rounds, an instance drained mid-round waits for that round's bill: every pass until
    then reads the rounds from the first unbilled one's predecessor on (two), not the fleet's history; once
    the round is billed, the instance is billed to its end and released."""
    run = make_run(engine, tmp_path, "team-a")
    run.tick()
    v100, k80 = run.workers()
    jobs = [run.submit(n, 10_000, {"v100": 10.0, "k80": 2.0}) for n in "ab"]
    for _ in range(4):
        run.tick()
        run.live_for(60, [v100, k80])
    assert run.fleet().round >= 3
    assert run.repo.drain(run.fleet_id, [k80]) == [k80]
    run.tick()  # the next round: the V100 only
    (on_k80,) = [j for j in jobs if (fj := run.repo.job(j)) is not None and fj.holder == k80]
    run.clock.advance(5)
    run.exit_held([k80], [on_k80], 10, 75)
    read: list[int] = []
    real = FleetRepository.rounds

    def counted(self: FleetRepository, fleet_id: str, **kw: Any) -> list[Any]:
        found = real(self, fleet_id, **kw)
        read.append(len(found))
        return found

    monkeypatch.setattr(FleetRepository, "rounds", counted)
    run.tick()  # nobody holds it: terminated inside the round
    for _ in range(3):
        run.live_for(10, [v100])
        run.tick()
    drained = run.repo.instance(k80)
    assert drained is not None and drained.state is InstanceState.DRAINING and drained.billed_to is None
    assert read and max(read) <= 2, read
    run.live_for(30, [v100])
    assert run.tick().released == [k80]


def test_the_executor_forgets_a_fleet_once_released_and_billed_and_nothing_billed_changes(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.fleets.test_rounds_memory import forgetting_rule

    forgetting_rule(monkeypatch)  # a rule that forgets: the executor keeps decayed shares per fleet
    run = make_run(engine, tmp_path, "team-a")
    run.tick()
    v100, k80 = run.workers()
    run.worker_sync(v100)
    run.worker_sync(k80)
    jobs = [run.submit(n, 10_000, {"v100": 10.0, "k80": 2.0}) for n in "abc"]
    for _ in range(3):
        run.tick()
        for w in (v100, k80):
            run.worker_sync(w)
        run.live_for(60, [v100, k80])
        run.exit_held([v100, k80], jobs, 1, 75)
    run.tick()
    kept = run.executor.kept()
    assert run.fleet_id in kept["policies"] and run.fleet_id in kept["folded"]  # an aware policy's decayed shares
    run.repo.release(run.fleet_id)
    for _ in range(4):
        run.clock.advance(5)
        run.exit_held([v100, k80], jobs, 1, 75)
        run.tick()
    assert {i.state for i in run.repo.instances(run.fleet_id)} == {InstanceState.RELEASED}
    assert all(run.repo.job(j).status is FleetJobStatus.CANCELLED for j in jobs)  # type: ignore[union-attr]
    billed = run.bill()
    assert run.tick().fleets == 0
    kept = run.executor.kept()
    assert run.fleet_id not in kept["policies"] | kept["folded"]
    run.clock.advance(600)
    run.tick()
    assert run.bill() == billed
    fresh = run.new_executor()
    assert fresh.billing is not None and fresh.billing(run.fleet(), run.clock()) == 0


@pytest.mark.parametrize("kind", ["sql", "memory"])
def test_the_open_bills_of_strays_are_found_on_either_ledger(engine: Engine, tmp_path: Path, kind: str) -> None:
    """A stray's bill opened and not closed is found (:meth:`FleetBilling.open_strays`) on the database
    ledger and on the in-process one alike; once closed, it is not."""
    run = make_run(engine, tmp_path, "team-a")
    run.tick()
    ledger = SqlLedger(run.repo.engine, run.prices) if kind == "sql" else MemoryLedger(run.prices)
    billing = FleetBilling(run.repo, ledger, run.prices)
    fleet, inst = run.fleet(), run.repo.instances(run.fleet_id)[0]
    start = run.clock()
    assert billing.stray(fleet, inst, "i-stray", start, None) is False
    run.clock.advance(30)
    assert billing.open_strays(fleet, inst) == [("i-stray", start)]
    assert billing.stray(fleet, inst, "i-stray", start, run.clock()) is True
    assert billing.open_strays(fleet, inst) == []


class FailsOnce(FakeProvider):
    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        if not self.failed:
            self.failed = True
            raise CloudError("no capacity")
        return super().launch(spec, idempotency_token)


def test_a_launch_retry_is_forgotten_once_due(engine: Engine, tmp_path: Path) -> None:
    run = make_run(engine, tmp_path, "team-a")
    run.provider = FailsOnce()
    run.executor = run.new_executor()
    report = run.executor.tick()
    assert len(report.errors) == 1 and "no capacity" in report.errors[0]
    (waiting,) = run.executor.kept()["retry_at"]
    run.clock.advance(31)
    assert run.tick().launched == [waiting]
    assert run.executor.kept()["retry_at"] == frozenset()


def test_a_stopped_executor_starts_no_pass_and_a_running_one_ends_after_its_fleet(
    engine: Engine, tmp_path: Path
) -> None:
    first = make_run(engine, tmp_path, "team-a")
    second = make_run(engine, tmp_path, "team-b")
    executor = first.executor
    passed: list[str] = []
    one_fleet = executor._fleet

    def then_stop(fleet: FleetRecord, out: Any) -> None:
        passed.append(fleet.id)
        one_fleet(fleet, out)
        executor.stop()  # the shutdown lands while the pass is at its first fleet

    executor._fleet = then_stop  # type: ignore[method-assign]
    executor.tick()
    assert passed == [first.fleet_id]  # the second fleet is left to the next process
    assert {i.state for i in second.repo.instances(second.fleet_id)} == {InstanceState.PENDING}
    assert executor.tick().fleets == 0 and passed == [first.fleet_id]
    assert executor.wait_idle(0)


def test_shutdown_waits_for_a_running_pass(engine: Engine, tmp_path: Path) -> None:
    """The app's shutdown (:func:`api.app.stop_background`): the executor stops, and the scheduler's running
    pass is waited for before the job service and the engine close; bounded (False when it still runs)."""
    run = make_run(engine, tmp_path, "team-a")
    executor = run.executor
    inside, go_on, ended = threading.Event(), threading.Event(), threading.Event()
    one_fleet = executor._fleet

    def slow(fleet: FleetRecord, out: Any) -> None:
        inside.set()
        assert go_on.wait(60)
        one_fleet(fleet, out)
        ended.set()

    executor._fleet = slow  # type: ignore[method-assign]
    scheduler = new_scheduler()
    scheduler.add_job(executor.tick, "date", id="fleets")
    scheduler.start()
    assert inside.wait(60)
    assert stop_background(scheduler, executor, 0.05) is False  # bounded: the pass still runs
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(stop_background(None, executor, 60)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not ended.is_set()  # waiting for the pass, which cannot end yet
    go_on.set()
    waiter.join(60)
    assert result == [True] and ended.is_set()
    assert {i.state for i in run.repo.instances(run.fleet_id)} == {InstanceState.LAUNCHING}  # the pass completed


def test_shutdown_gives_the_clock_the_time_left() -> None:
    """The simulated clock's stop waits within the shutdown's bound, not on a bound of its own."""
    given: list[float] = []
    assert stop_background(None, None, 10.0, clock=given.append) is True
    (left,) = given
    assert 0.0 <= left <= 10.0
