"""Live fleets rank jobs by the allocation integral, as the simulator does for heterogeneity-aware policies
(issue 12): priority = (seconds of allocation in force since arrival, the coming round included) / seconds
received. The executor folds the ended round's allocation into each job's stored ``owed`` (per worker type,
decayed as the rule decays) in the same transaction as the new round, so a restarted executor, another
replica, a boundary that crashed mid-write or lost its race all continue the same priorities as the
simulator's mechanism run without interruption. Both backends."""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
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


def test_on_two_worker_types_the_executor_follows_the_simulators_integral_per_type(
    engine: Engine, tmp_path: Path
) -> None:
    # a V100 and a K80; jobs with different speedups arrive over time; the executor is replaced every 5
    # rounds: each round, which job runs on which type is the simulator's mechanism's (owed per type name)
    import numpy as np

    from costopt.fleets.model import NewInstance
    from costopt.gavel.mechanism import RoundMechanism, fastest_first
    from tests.fleets.test_executor import K80, V100

    rates = {
        "a": {"v100": 10.0, "k80": 4.0},
        "b": {"v100": 10.0, "k80": 8.0},
        "c": {"v100": 10.0, "k80": 2.0},
        "d": {"v100": 10.0, "k80": 5.0},
    }
    arrivals = {0: ("a",), 3: ("b",), 7: ("c",), 12: ("d",)}
    instances = (
        NewInstance(V100, "v100", 1, "local", Decimal("0.95")),
        NewInstance(K80, "k80", 1, "local", Decimal("0.30")),
    )
    live = _live(engine, tmp_path, restart_overhead_s=0.0, instances=instances)
    names = sorted(rates)
    types = ["k80", "v100"]  # the executor's order (alphabetical)
    tput = np.array([[rates[n][t] for t in types] for n in names])
    rule = mechanism_rule(True, 0.0, ROUND_S)
    mech = RoundMechanism(
        [1, 1],
        [1, 1],
        len(names),
        type_order=fastest_first(tput),
        memory_s=rule.memory_s,
        hysteresis=rule.hysteresis,
        allocation_integral=rule.allocation_integral,
        round_s=ROUND_S,
    )
    ran_k80 = 0
    for r in range(30):
        if r and r % 5 == 0:
            live.executor = live.replica()
        rnd = live.next_round(arrivals.get(r, ()), {n: rates[n] for n in arrivals.get(r, ())})
        fleet = live.repo.get(live.fleet_id)
        doc = fleet.allocation
        assert doc is not None and doc["worker_types"] == types
        jobs = {j.job_id: j for j in live.repo.jobs(fleet.id)}
        rows = np.array([names.index(j.removeprefix("job-")) for j in doc["job_ids"]], dtype=np.int64)
        mech.set_allocation(
            rows,
            np.ones(rows.shape[0], dtype=np.int64),
            tput[rows] > 0,
            np.array(doc["x"], dtype=np.float64),
            np.zeros((0, 2), dtype=np.int64),
            np.zeros((0, 2)),
            np.array([(jobs[j].arrived_at - fleet.created_at).total_seconds() for j in doc["job_ids"]]),
        )
        plan = mech.plan((rnd.started_at - fleet.created_at).total_seconds())
        mech.record(plan, ROUND_S)
        pairs = zip(plan.members[:, 0].tolist(), plan.wtype.tolist(), strict=True)
        want = {(f"job-{names[a]}", types[w]) for a, w in pairs}
        got = {(x.job_id, x.wtype) for x in rnd.assignment}
        assert got == want, f"round {r + 1}: live {got}, the simulator's mechanism {want}"
        ran_k80 += any(t == "k80" for _, t in got)
    assert ran_k80 >= 20, ran_k80  # both types in use: the K80's queue is served too
