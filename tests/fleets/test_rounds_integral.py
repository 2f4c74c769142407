"""Live fleets rank jobs by the allocation integral, as the simulator does for heterogeneity-aware policies
(issue 12): priority = (seconds of allocation in force since arrival, the coming round included) / seconds
received. The executor folds the ended round's allocation into each job's stored ``owed`` (per worker type,
decayed as the rule decays) in the same transaction as the new round, so a restarted executor, another
replica, a boundary that crashed mid-write or lost its race all continue the same priorities as the
simulator's mechanism run without interruption. Both backends."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event

from costopt.fleets.model import RoundRecord
from costopt.fleets.store import FleetRepository
from costopt.gavel.mechanism import MechanismRule, mechanism_rule
from tests.fleets.test_rounds_memory import ROUND_S, LiveFleet, SimulatorMechanism, _live, forgetting_rule

# a alone for 10 rounds, then b, then c: the allocation (1, then 1/2 each, then 1/3 each) changes under them
ARRIVALS = {0: ("a",), 10: ("b",), 18: ("c",)}
JOBS = ["job-a", "job-b", "job-c"]


def _owed_by_docs(docs: list[Mapping[str, Any]], memory_s: float | None) -> dict[str, float]:
    """Each job's seconds of allocation on the V100 over the rounds whose allocations are ``docs`` (every
    round but the last started, which is not over), decayed to the last round's start with ``memory_s``."""
    owed: dict[str, float] = {}
    for k, doc in enumerate(docs[:-1]):
        age = (len(docs) - 1 - k) * ROUND_S
        w = 1.0 if memory_s is None else math.exp(-age / memory_s)
        for job, row in zip(doc["job_ids"], doc["x"], strict=True):
            owed[job] = owed.get(job, 0.0) + row[0] * ROUND_S * w
    return owed


def _run(live: LiveFleet, sim: SimulatorMechanism, rounds: int, restart_at: set[int], memory_s: float | None) -> None:
    docs: list[Mapping[str, Any]] = []
    for r in range(rounds):
        if r in restart_at:  # the service restarts: a new executor, nothing of the fleet in its memory
            live.executor = live.replica()
        rnd = live.next_round(ARRIVALS.get(r, ()))
        got = {x.job_id for x in rnd.assignment}
        assert got == sim.round(rnd), f"round {r + 1}: live {got} but the simulator's mechanism ran otherwise"
        fleet = live.repo.get(live.fleet_id)
        assert fleet.allocation is not None
        docs.append(fleet.allocation)
        stored = {j.job_id: j.owed.get("v100", 0.0) for j in live.repo.jobs(live.fleet_id)}
        want = _owed_by_docs(docs, memory_s)
        assert stored == pytest.approx({j: want.get(j, 0.0) for j in stored}, rel=1e-9, abs=1e-6), f"round {r + 1}"


@pytest.mark.parametrize("memory_s", [None, 1800.0], ids=["default", "memory1800"])
def test_a_restarted_executor_continues_the_simulators_allocation_integral(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory_s: float | None
) -> None:
    if memory_s is not None:  # the integral decayed as a rule that forgets decays it
        forgetting_rule(monkeypatch, memory_s, integral=True)
    else:
        assert mechanism_rule(True, 0.0, ROUND_S).allocation_integral  # the default rule of aware policies
    live = _live(engine, tmp_path, restart_overhead_s=0.0)
    sim = SimulatorMechanism(live, JOBS, True, 0.0)
    _run(live, sim, 36, restart_at={12, 13, 20, 27}, memory_s=memory_s)


def test_the_integral_decides_where_the_rules_before_it_would_not(engine: Engine, tmp_path: Path) -> None:
    # the case above tells the rules apart: a had the V100 alone for 10 rounds; in the 26 rounds after b
    # arrives (its part 1/2, then 1/3 from round 19) the integral gives it about its part, the rules before
    # (shares since arrival, or decayed with 7200 s) charge it for the rounds it had alone
    live = _live(engine, tmp_path, restart_overhead_s=0.0)
    sim = SimulatorMechanism(live, JOBS, True, 0.0)
    since = SimulatorMechanism(live, JOBS, True, 0.0, MechanismRule(True, None, 0.0, False))
    memory = SimulatorMechanism(live, JOBS, True, 0.0, MechanismRule(True, 7200.0, 0.0, False))
    ran = {"integral": 0, "since arrival": 0, "memory 7200 s": 0}
    for r in range(36):
        rnd = live.next_round(ARRIVALS.get(r, ()))
        got = {x.job_id for x in rnd.assignment}
        assert got == sim.round(rnd)
        by_since, by_memory = since.round(rnd), memory.round(rnd)
        if r >= 10:
            ran["integral"] += got == {"job-a"}
            ran["since arrival"] += by_since == {"job-a"}
            ran["memory 7200 s"] += by_memory == {"job-a"}
    assert ran == {"integral": 10, "since arrival": 6, "memory 7200 s": 8}  # its part: 8 x 1/2 + 18 x 1/3 = 10


def _crash_mid_boundary(live: LiveFleet, engine: Engine) -> RoundRecord:
    """The boundary dies after writing a job's owed seconds, inside the round's transaction; the restarted
    service runs it again. Returns the round it started."""
    live.clock.advance(ROUND_S)
    crashed: list[str] = []

    def die(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if not crashed and statement.lstrip().upper().startswith("UPDATE FLEET_JOBS") and "owed" in statement:
            crashed.append(statement)
            raise OSError("the service died mid-boundary")

    before = live.repo.get(live.fleet_id).round
    event.listen(engine, "before_cursor_execute", die)
    try:
        report = live.executor.tick()
    finally:
        event.remove(engine, "before_cursor_execute", die)
    assert crashed and report.rounds == [] and "died mid-boundary" in " ".join(report.errors)
    assert live.repo.get(live.fleet_id).round == before  # nothing of that boundary was kept
    live.executor = live.replica()
    report = live.executor.tick()
    assert report.errors == [] and len(report.rounds) == 1
    live.rounds += 1
    rnd = live.repo.round(live.fleet_id, live.rounds)
    assert rnd is not None and rnd.started_at == live.clock.t
    return rnd


def _lose_the_race(live: LiveFleet, engine: Engine) -> RoundRecord:
    """Two replicas at the same boundary: the one that loses the compare-and-set writes nothing (it read the
    fleet before the winner started the round). Returns the round the winner started."""
    live.clock.advance(ROUND_S)
    winner = live.replica()

    class BeatenToIt(FleetRepository):
        raced = False

        def begin_round(self, *args: Any, **kwargs: Any) -> bool:  # the winner starts this round first
            if not BeatenToIt.raced:
                BeatenToIt.raced = True
                assert len(winner.tick().rounds) == 1
            return super().begin_round(*args, **kwargs)

    loser = live.replica()
    loser.repo = BeatenToIt(engine, now=live.clock)
    assert loser.tick().rounds == []
    live.rounds += 1
    rnd = live.repo.round(live.fleet_id, live.rounds)
    assert rnd is not None and rnd.started_at == live.clock.t
    assert live.repo.round(live.fleet_id, live.rounds + 1) is None
    live.executor = loser  # and it runs the next boundaries
    return rnd


def test_a_boundary_that_crashed_mid_write_or_lost_its_race_counts_the_round_once(
    engine: Engine, tmp_path: Path
) -> None:
    live = _live(engine, tmp_path, restart_overhead_s=0.0)
    sim = SimulatorMechanism(live, JOBS, True, 0.0)
    docs: list[Mapping[str, Any]] = []
    for r in range(30):
        if r == 14:
            rnd = _crash_mid_boundary(live, engine)
        elif r == 22:
            rnd = _lose_the_race(live, engine)
        else:
            rnd = live.next_round(ARRIVALS.get(r, ()))
        assert {x.job_id for x in rnd.assignment} == sim.round(rnd), f"round {r + 1}"
        fleet = live.repo.get(live.fleet_id)
        assert fleet.allocation is not None
        docs.append(fleet.allocation)
        stored = {j.job_id: j.owed.get("v100", 0.0) for j in live.repo.jobs(live.fleet_id)}
        want = _owed_by_docs(docs, None)
        assert stored == pytest.approx({j: want.get(j, 0.0) for j in stored}, rel=1e-9, abs=1e-6), f"round {r + 1}"
    assert live.repo.get(live.fleet_id).round == 30
