"""A fleet instance's launch cut short (the service died after the cloud accepted it, before its id was
written; or the launch call failed part-way after the cloud created the instance) leaves a cloud instance
nobody tracks. The round executor finds it on the provider by the tag costopt puts on every launch of the
fleet instance (``costopt:fleet-instance``), terminates it and bills its cloud life to the fleet as idle
time, exactly once (also across a restart): for a fleet released meanwhile, for a crash mid-launch on an
active fleet (its worker may even have come up), and before a failed launch is tried again. On the
simulated cloud, both backends.

Every test ends with the same two checks: no instance tagged with the fleet still exists on the cloud, and
the fleet's ledger lines sum, to the micro-dollar, to what the cloud billed for every instance tagged with
it (from its launch to its end, at the offer's prices).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from costopt.cloud import HELD_STATES, CloudError, Instance, LaunchSpec, NotFoundError
from costopt.fleets.executor import FleetExecutor
from costopt.fleets.model import FleetInstance, InstanceState, NewFleet, NewInstance
from costopt.fleets.store import FleetRepository
from costopt.ledger import StepPrices
from costopt.ledger.prices import price_segments
from costopt.ledger.sql import SqlLedger
from providers.sim import SimCloud
from tests.fleets.test_sim_fleet import CONFIG, NO_HAZARDS, START, TICK, V100, _prices, _service

TAG_FLEET = "costopt:fleet"
TAG_INSTANCE = "costopt:fleet-instance"


class Died(BaseException):
    """The service's process dies here (nothing of the pass after it runs)."""


class CutShort:
    """The simulated cloud, but its next launch is cut short once the cloud accepted it: ``died`` (the
    service dies before writing the instance id) or ``failed`` (the call fails part-way with a CloudError,
    e.g. a time-out, the instance created all the same)."""

    def __init__(self, cloud: SimCloud, how: str) -> None:
        self.cloud = cloud
        self.name = cloud.name
        self.how: str | None = how

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        launched = self.cloud.launch(spec, idempotency_token)
        how, self.how = self.how, None
        if how == "died":
            raise Died("the service died after the cloud accepted the launch")
        if how == "failed":
            raise CloudError("the launch request timed out")
        return launched

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cloud, name)


class LateFailure:
    """The simulated cloud, but the first launch fails with a CloudError and the cloud creates its instance
    late, just before the retry's own (after the executor looked for it)."""

    def __init__(self, cloud: SimCloud) -> None:
        self.cloud = cloud
        self.name = cloud.name
        self.first: tuple[LaunchSpec, str] | None = None
        self.late: Instance | None = None

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        if self.first is None:
            self.first = (spec, idempotency_token)
            raise CloudError("the launch request timed out")
        if self.late is None:
            self.late = self.cloud.launch(*self.first)
        return self.cloud.launch(spec, idempotency_token)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cloud, name)


class Forgetful:
    """The simulated cloud, but it no longer knows ``gone`` (a provider that forgets a deleted instance at
    once, as GCP does): not listed, not found."""

    def __init__(self, cloud: SimCloud, gone: str) -> None:
        self.cloud = cloud
        self.name = cloud.name
        self.gone = gone

    def list(self, tags: dict[str, str]) -> list[Instance]:
        return [i for i in self.cloud.list(tags) if i.instance_id != self.gone]

    def describe(self, instance_id: str) -> Instance:
        if instance_id == self.gone:
            raise NotFoundError(instance_id)
        return self.cloud.describe(instance_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cloud, name)


@dataclass
class Setup:
    engine: Engine
    cloud: SimCloud
    prices: StepPrices
    repo: FleetRepository
    executor: FleetExecutor
    ledger: SqlLedger
    fleet_id: str

    def restart(self, provider: Any = None) -> None:
        """What a restarted service builds over the same database and cloud (``provider``: in its place)."""
        repo, _jobs, executor, ledger = _service(self.engine, self.cloud, self.prices)
        if provider is not None:
            executor.providers["sim"] = provider
        self.repo, self.executor, self.ledger = repo, executor, ledger

    def pass_(self, seconds: float = 0.0) -> None:
        if seconds:
            self.cloud.run_to(self.cloud.now() + timedelta(seconds=seconds))
        report = self.executor.tick()
        assert report.errors == [], report.errors

    def only(self) -> FleetInstance:
        (inst,) = self.repo.instances(self.fleet_id)
        return inst

    def tagged(self, **tags: str) -> list[Instance]:
        return self.cloud.list(tags or {TAG_FLEET: self.fleet_id})

    def cloud_bill(self) -> int:
        """Micro-dollars the cloud billed for every instance tagged with the fleet, each from its launch to
        its end (all have ended)."""
        total = 0
        for inst in self.tagged():
            assert inst.launched_at is not None and inst.terminated_at is not None, inst
            for seg in price_segments(self.prices, inst.offer, inst.launched_at, inst.terminated_at):
                total += seg.amount_micro_usd
        return total

    def ledger_bill(self) -> dict[str, int]:
        """The fleet's ledger lines: micro-dollars per ledger job ("idle": the fleet's own) and in all."""
        out: dict[str, int] = {"total": 0}
        for line in self.ledger.costs(team="team-a").lines:
            key = "idle" if line.record.job_id == self.fleet_id else line.record.job_id
            out[key] = out.get(key, 0) + line.amount_micro_usd
            out["total"] += line.amount_micro_usd
        return out

    def assert_nothing_leaked_and_all_billed(self) -> None:
        held = [(i.instance_id, i.state) for i in self.tagged() if i.state in HELD_STATES]
        assert held == [], f"cloud instances of the fleet still running: {held}"
        assert all(i.state is InstanceState.RELEASED or i.billed_to_end for i in self.repo.instances(self.fleet_id))
        assert self.repo.released_with_instances() == []
        assert self.ledger_bill()["total"] == self.cloud_bill() > 0


@pytest.fixture
def setup(engine: Engine, tmp_path: Path) -> Setup:
    prices = _prices()
    cloud = SimCloud(prices, NO_HAZARDS, start=START, config=CONFIG)
    repo, _jobs, executor, ledger = _service(engine, cloud, prices)
    fleet, _ = repo.create(
        NewFleet(
            team_id="team-a",
            policy="max_min_fairness_perf",
            instances=(NewInstance(V100, "v100", 1, "sim", Decimal("0.918")),),
            round_s=360.0,
        )
    )
    return Setup(engine, cloud, prices, repo, executor, ledger, fleet.id)


def _die_mid_launch(s: Setup) -> FleetInstance:
    """The first launch reaches the cloud and the service dies; the restarted service's view of it."""
    s.restart(CutShort(s.cloud, "died"))
    with pytest.raises(Died):
        s.executor.tick()
    s.restart()
    inst = s.only()
    assert inst.state is InstanceState.LAUNCHING and inst.instance_id is None and inst.launch_token
    (orphan,) = s.tagged(**{TAG_INSTANCE: inst.id})
    assert orphan.state in HELD_STATES
    return inst


def test_a_released_fleets_launch_cut_short_is_terminated_on_the_cloud_and_billed_once(setup: Setup) -> None:
    """The fleet is released while its only launch was cut short: its cloud instance (never recorded) is
    found by its tags, terminated and billed as the fleet's idle time; a restart bills nothing more."""
    s = setup
    inst = _die_mid_launch(s)
    s.repo.release(s.fleet_id)
    s.pass_(10)
    s.pass_(10)
    (orphan,) = s.tagged(**{TAG_INSTANCE: inst.id})
    assert orphan.state not in HELD_STATES, f"the cut-short launch's instance leaked: {orphan}"
    assert s.only().state is InstanceState.RELEASED
    bill = s.ledger_bill()
    assert set(bill) == {"idle", "total"}  # no job ran: all of it is the fleet's idle time
    s.assert_nothing_leaked_and_all_billed()
    s.restart()
    s.pass_(TICK.total_seconds())
    assert s.ledger_bill() == bill


def test_a_crash_mid_launch_on_an_active_fleet_whose_worker_came_up_is_cleared_and_replaced(setup: Setup) -> None:
    """The cut-short launch's worker boots and syncs with the token it was given (the fleet instance turns
    ``running`` with no cloud id, billed by nobody): it is found by its tags, terminated, billed as idle
    time, and the fleet instance is lost and replaced. Released later, everything is billed."""
    s = setup
    inst = _die_mid_launch(s)
    s.cloud.run_to(s.cloud.now() + timedelta(minutes=4))  # its worker boots (3 min) and syncs
    assert s.repo.instance(inst.id).state is InstanceState.RUNNING  # type: ignore[union-attr]
    for _ in range(4):
        s.pass_(TICK.total_seconds())
    gone = s.repo.instance(inst.id)
    assert gone is not None and gone.state is InstanceState.LOST, gone
    (orphan,) = s.tagged(**{TAG_INSTANCE: inst.id})
    assert orphan.state not in HELD_STATES
    (replacement,) = [i for i in s.repo.instances(s.fleet_id) if i.replaces == inst.id]
    assert replacement.state is InstanceState.RUNNING and replacement.instance_id is not None
    s.repo.release(s.fleet_id)
    s.pass_(10)
    s.pass_(10)
    s.assert_nothing_leaked_and_all_billed()


def test_a_launch_that_failed_part_way_is_cleared_before_it_is_tried_again(setup: Setup) -> None:
    """The launch call fails after the cloud created the instance: before the launch is tried again, the
    executor finds the first one by its tags, terminates and bills it; one instance runs for the fleet
    instance, and once released the fleet's bill is the cloud's."""
    s = setup
    s.restart(CutShort(s.cloud, "failed"))
    report = s.executor.tick()
    assert len(report.errors) == 1 and "timed out" in report.errors[0]
    inst = s.only()
    assert inst.state is InstanceState.PENDING and inst.instance_id is None
    (first,) = s.tagged(**{TAG_INSTANCE: inst.id})
    assert first.state in HELD_STATES
    s.pass_(60)  # the retry, 30 s later
    tagged = {i.instance_id: i for i in s.tagged(**{TAG_INSTANCE: inst.id})}
    assert len(tagged) == 2 and tagged[first.instance_id].state not in HELD_STATES
    launched = s.only()
    assert launched.instance_id not in (None, first.instance_id)
    assert tagged[str(launched.instance_id)].state in HELD_STATES
    s.pass_(TICK.total_seconds())
    s.repo.release(s.fleet_id)
    s.pass_(10)
    s.pass_(10)
    s.assert_nothing_leaked_and_all_billed()


def _dies_after_terminate(s: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on (until ``monkeypatch.undo()``) the service dies right after each terminate it sends."""
    real_terminate = s.cloud.terminate

    def dies_after_terminate(instance_id: str) -> None:
        real_terminate(instance_id)
        raise Died("the service died right after the terminate")

    monkeypatch.setattr(s.cloud, "terminate", dies_after_terminate)


@pytest.mark.parametrize("where", ["after the bill", "after the terminate"])
def test_a_crash_while_clearing_a_launch_cut_short_bills_it_exactly_once(
    setup: Setup, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The service dies while clearing a released fleet's launch cut short (the stray terminated, or also
    billed, its record not yet written): the restarted service finishes it, the stray billed once."""
    s = setup
    inst = _die_mid_launch(s)
    s.repo.release(s.fleet_id)
    s.cloud.run_to(s.cloud.now() + timedelta(seconds=10))
    if where == "after the bill":
        real: Callable[..., bool] = FleetRepository.update_instance

        def dies_on_record(self: FleetRepository, fleet_instance: str, /, **values: Any) -> bool:
            if "launch_token" in values and values["launch_token"] is None:
                raise Died("the service died before recording the clean-up")
            return real(self, fleet_instance, **values)

        monkeypatch.setattr(FleetRepository, "update_instance", dies_on_record)
    else:
        _dies_after_terminate(s, monkeypatch)
    with pytest.raises(Died):
        s.executor.tick()
    monkeypatch.undo()
    (orphan,) = s.tagged(**{TAG_INSTANCE: inst.id})
    assert orphan.state not in HELD_STATES
    assert s.repo.instance(inst.id).launch_token is not None  # type: ignore[union-attr]  # not recorded yet
    s.restart()
    s.pass_(10)
    s.pass_(10)
    s.assert_nothing_leaked_and_all_billed()
    bill = s.ledger_bill()
    s.restart()
    s.pass_(TICK.total_seconds())
    assert s.ledger_bill() == bill


def test_a_stray_terminated_by_a_pass_that_died_is_billed_to_when_seen_gone_if_the_cloud_forgot_it(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service dies right after terminating a released fleet's launch cut short (its bill opened, not
    closed) and the provider no longer knows the instance when the service is back (deleted instances are
    not listed): the open bill, found in the ledger, is closed when the restarted service sees it gone (a
    little more than the cloud billed, never an interval left open), once."""
    s = setup
    inst = _die_mid_launch(s)
    s.repo.release(s.fleet_id)
    s.cloud.run_to(s.cloud.now() + timedelta(seconds=10))
    _dies_after_terminate(s, monkeypatch)
    with pytest.raises(Died):
        s.executor.tick()
    monkeypatch.undo()
    (orphan,) = s.tagged(**{TAG_INSTANCE: inst.id})
    assert orphan.terminated_at is not None
    lines = s.ledger.costs(team="team-a", as_of=s.cloud.now()).lines
    assert [(line.record.instance_id, line.open) for line in lines] == [(orphan.instance_id, True)]
    s.restart(Forgetful(s.cloud, orphan.instance_id))
    s.cloud.run_to(s.cloud.now() + timedelta(seconds=20))
    seen_gone = s.cloud.now()
    s.pass_()
    s.pass_(10)
    (line,) = s.ledger.costs(team="team-a").lines
    assert not line.open and line.record.ended_at == seen_gone
    assert line.record.started_at == orphan.launched_at and line.record.job_id == s.fleet_id
    assert s.only().state is InstanceState.RELEASED and s.repo.released_with_instances() == []
    assert s.ledger_bill()["total"] >= s.cloud_bill() > 0
    bill = s.ledger_bill()
    s.restart(Forgetful(s.cloud, orphan.instance_id))
    s.pass_(TICK.total_seconds())
    assert s.ledger_bill() == bill


def test_a_failed_launchs_instance_the_cloud_created_late_is_cleared_when_the_fleet_is_released(
    setup: Setup,
) -> None:
    """The first launch fails and the cloud creates its instance only after the retry's look-up: the fleet
    instance runs on its second launch, the first goes on tracked by nobody until the fleet instance ends:
    released, it is looked for by its tags, terminated and billed as idle time before the end is written."""
    s = setup
    late = LateFailure(s.cloud)
    s.restart(late)
    assert len(s.executor.tick().errors) == 1
    s.pass_(60)
    inst = s.only()
    assert late.late is not None and inst.instance_id not in (None, late.late.instance_id)
    assert {i.instance_id for i in s.tagged(**{TAG_INSTANCE: inst.id}) if i.state in HELD_STATES} == {
        inst.instance_id,
        late.late.instance_id,
    }
    s.pass_(TICK.total_seconds())
    s.repo.release(s.fleet_id)
    s.pass_(10)
    s.pass_(10)
    s.assert_nothing_leaked_and_all_billed()


def test_a_launch_cut_short_that_an_older_service_released_is_taken_up_again(setup: Setup) -> None:
    """A fleet released by a service before this clean-up: its cut-short fleet instance ``released`` (ended,
    billed to its end: nothing) with its launch token and no cloud id, the fleet off the work list. The
    executor takes the fleet up again, terminates the cloud instance and bills it."""
    s = setup
    inst = _die_mid_launch(s)
    s.repo.release(s.fleet_id)
    at = s.cloud.now()
    assert s.repo.update_instance(inst.id, state=InstanceState.RELEASED, ended_at=at, billed_to=at)
    assert [f.id for f in s.repo.released_with_instances()] == [s.fleet_id]
    s.pass_(10)
    s.assert_nothing_leaked_and_all_billed()
    assert s.only().launch_token is None
