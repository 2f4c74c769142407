"""Live fleets rank jobs by the simulator's rule for heterogeneity-aware policies (issue 12), here a rule
that forgets (:func:`forgetting_rule`: shares where a second run ``t`` seconds ago weighs
``exp(-t / 7200 s)``, recomputed at each boundary from the stored rounds' leases; the default rule until
2026-12-04, now replaced by the allocation integral, tests/fleets/test_rounds_integral.py) and a
hysteresis of ``1 + 6 x restart overhead / round`` for the job that holds the GPU. Rounds are driven
through the executor on both backends; the workers only sync once (their instance is then running; the
leases are credited whether or not a copy ran)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine

import costopt.fleets.executor as executor_module
import costopt.gavel.mechanism as mechanism_module
from costopt.domain import Cloud, Market, OfferKey
from costopt.fleets.executor import FleetExecutor
from costopt.fleets.model import FLEET_PROVIDER, FleetJob, NewFleet, NewInstance, RoundLeases, RoundRecord
from costopt.fleets.rounds import HISTORY_MEMORIES, decayed_received, history_since
from costopt.fleets.store import FleetRepository, NewFleetJob
from costopt.fleets.sync import WorkerSync
from costopt.gavel.mechanism import MechanismRule, RoundMechanism
from costopt.jobs.records import JobRepository, NewJob
from tests.fleets.test_executor import Clock, FakeProvider

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
ROUND_S = 360.0
V100 = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
POLICY = "max_min_fairness_perf"  # heterogeneity-aware: the memory and the hysteresis apply
AWARE_MEMORY_S = 7200.0


def forgetting_rule(monkeypatch: pytest.MonkeyPatch, memory_s: float = AWARE_MEMORY_S, integral: bool = False) -> None:
    """Aware policies get, in the simulator's mechanism and live fleets alike, the default rule with a
    memory of ``memory_s`` (and the allocation integral when ``integral``)."""
    real = mechanism_module.mechanism_rule

    def rule(per_type_queues: bool, restart_overhead_s: float, round_s: float) -> MechanismRule:
        got = real(per_type_queues, restart_overhead_s, round_s)
        if not per_type_queues:
            return got
        return MechanismRule(True, memory_s, got.hysteresis, integral)

    monkeypatch.setattr(mechanism_module, "mechanism_rule", rule)
    monkeypatch.setattr(executor_module, "mechanism_rule", rule)


@dataclass
class LiveFleet:
    """A fleet of one V100 GPU under ``POLICY``, its executor charging ``restart_overhead_s`` per move."""

    clock: Clock
    repo: FleetRepository
    jobs: JobRepository
    executor: FleetExecutor
    fleet_id: str
    tmp: Path
    provider: FakeProvider
    overhead_s: float
    rounds: int = 0

    def replica(self) -> FleetExecutor:
        """Another service replica's executor (nothing of the fleet in its memory)."""
        return _executor(self.repo, self.jobs, self.provider, self.overhead_s)

    def submit(self, name: str, rates: dict[str, float] | None = None) -> str:
        job_id = f"job-{name}"
        spec = {"command": ["python", "train.py"], "checkpoint_uri": f"file://{self.tmp}/{job_id}", "gpus": 1}
        job, _ = self.jobs.insert(
            NewJob("team-a", {**spec, "fleet_id": self.fleet_id}, 10**9, FLEET_PROVIDER, job_id=job_id)
        )
        self.repo.add_job(
            NewFleetJob(job_id, self.fleet_id, "team-a", 1, rates or {"v100": 10.0}, 10**9, job.created_at)
        )
        return job_id

    def next_round(
        self, arriving: tuple[str, ...] = (), rates: dict[str, dict[str, float]] | None = None
    ) -> RoundRecord:
        """Let the round in force end (the first round starts now), submit ``arriving`` at the boundary's
        time (with ``rates[name]`` when given), and return the round the executor starts."""
        if self.rounds:
            self.clock.advance(ROUND_S)
        for name in arriving:
            self.submit(name, (rates or {}).get(name))
        report = self.executor.tick()
        assert report.errors == [] and len(report.rounds) == 1
        self.rounds += 1
        rnd = self.repo.round(self.fleet_id, self.rounds)
        assert rnd is not None and rnd.started_at == T0 + timedelta(seconds=ROUND_S * (self.rounds - 1))
        return rnd


def _live(
    engine: Engine, tmp_path: Path, restart_overhead_s: float, instances: tuple[NewInstance, ...] | None = None
) -> LiveFleet:
    clock = Clock()
    repo = FleetRepository(engine, now=clock)
    jobs = JobRepository(engine, now=clock)
    provider = FakeProvider()
    fleet, _ = repo.create(
        NewFleet(
            team_id="team-a",
            policy=POLICY,
            instances=instances or (NewInstance(V100, "v100", 1, "local", Decimal("0.95")),),
            round_s=ROUND_S,
            resolve_rounds=1000,
        )
    )
    executor = _executor(repo, jobs, provider, restart_overhead_s)
    executor.tick()  # launches the instances
    for inst in repo.instances(fleet.id):
        assert inst.instance_id is not None
        token = provider.launched[inst.instance_id].env["COSTOPT_WORKER_TOKEN"]
        WorkerSync(repo, jobs, poll_s=0.5).sync(inst.id, token, {"copies": []})
    return LiveFleet(clock, repo, jobs, executor, fleet.id, tmp_path, provider, restart_overhead_s)


def _executor(repo: FleetRepository, jobs: JobRepository, provider: FakeProvider, overhead_s: float) -> FleetExecutor:
    return FleetExecutor(
        repo,
        jobs,
        {"local": provider},
        worker_command=lambda p: ["python", "-m", "costopt.agent.worker"],
        service_url="http://svc:8000/",
        dead_after_s=1e9,  # the worker syncs once: its instance stays running
        boot_timeout_s=300,
        full_every_s=0.0,
        restart_overhead_s=overhead_s,
    )


class SimulatorMechanism:
    """The simulator's :class:`RoundMechanism` (built as ``simulate_trace`` builds it for an aware policy
    on one worker type, or under ``rule``) fed the live fleet's allocation, arrivals and round starts."""

    def __init__(
        self,
        live: LiveFleet,
        job_ids: list[str],
        rule_aware: bool,
        restart_overhead_s: float,
        rule: MechanismRule | None = None,
    ) -> None:
        if rule is None:
            rule = mechanism_module.mechanism_rule(rule_aware, restart_overhead_s, ROUND_S)
        self.mech = RoundMechanism(
            [1],
            [1],
            len(job_ids),
            type_order=(0,),
            memory_s=rule.memory_s,
            hysteresis=rule.hysteresis,
            allocation_integral=rule.allocation_integral,
            round_s=ROUND_S,
        )
        self.live = live
        self.index = {j: k for k, j in enumerate(job_ids)}

    def round(self, rnd: RoundRecord) -> set[str]:
        fleet = self.live.repo.get(self.live.fleet_id)
        doc = fleet.allocation
        assert doc is not None and doc["worker_types"] == ["v100"]
        jobs: list[FleetJob] = [j for j in self.live.repo.jobs(fleet.id) if j.job_id in doc["job_ids"]]
        by_id = {j.job_id: j for j in jobs}
        ids = list(doc["job_ids"])
        n = len(ids)
        self.mech.set_allocation(
            np.array([self.index[j] for j in ids], dtype=np.int64),
            np.ones(n, dtype=np.int64),
            np.ones((n, 1), dtype=bool),
            np.array(doc["x"], dtype=np.float64),
            np.zeros((0, 2), dtype=np.int64),
            np.zeros((0, 1)),
            np.array([(by_id[j].arrived_at - fleet.created_at).total_seconds() for j in ids]),
        )
        plan = self.mech.plan((rnd.started_at - fleet.created_at).total_seconds())
        self.mech.record(plan, ROUND_S)
        names = {k: j for j, k in self.index.items()}
        return {names[int(a)] for a in plan.members[:, 0].tolist()}


def test_a_job_that_had_the_gpu_long_ago_regains_priority_as_its_share_decays(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forgetting_rule(monkeypatch)
    # job a has the V100 alone for 4 hours; then b arrives and the allocation gives each half of it.
    # Since arrival, a's share stays near 1 and b takes most rounds; with the memory, a's old surplus fades
    live = _live(engine, tmp_path, restart_overhead_s=1.5)
    solo = 40
    new = SimulatorMechanism(live, ["job-a", "job-b"], True, 1.5)
    old = SimulatorMechanism(live, ["job-a", "job-b"], False, 1.5)  # since arrival, no hysteresis
    a_live = a_old = 0
    first = live.executor
    for r in range(solo + 20):
        arriving = ("a",) if r == 0 else ("b",) if r == solo else ()
        if r == solo + 10:  # another replica takes over: it recomputes the decayed seconds from every lease
            live.executor = live.replica()
        rnd = live.next_round(arriving)
        got = {x.job_id for x in rnd.assignment}
        assert got == new.round(rnd), f"round {r + 1}: live {got} but the simulator's mechanism ran otherwise"
        by_old = old.round(rnd)
        if r < solo:
            assert got == by_old == {"job-a"}
        else:
            a_live += got == {"job-a"}
            a_old += by_old == {"job-a"}
    assert (a_live, a_old) == (8, 5)  # of the 20 rounds after b arrived (the allocation says 10)
    # rounds of leases read per boundary: each executor folds the round that just ended into its counts
    assert list(first.history_read) == [0] + [1] * (solo + 9)
    assert list(live.executor.history_read) == [solo + 10] + [1] * 9


def _shares(history: list[str], k: int) -> dict[str, float]:
    """Each job's decayed share of the GPU at round ``k`` (both arrived at 0), from who ran each round."""
    now = k * ROUND_S
    weight = AWARE_MEMORY_S * -math.expm1(-now / AWARE_MEMORY_S)
    got = {"job-a": 0.0, "job-b": 0.0}
    for r, job in enumerate(history[:k]):
        got[job] += ROUND_S * math.exp(-(now - r * ROUND_S) / AWARE_MEMORY_S)
    return {j: s / weight for j, s in got.items()}


def test_a_running_job_is_not_rotated_off_for_a_gain_smaller_than_the_hysteresis(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forgetting_rule(monkeypatch)
    # two jobs with half of one V100 each; a move costs 30 s of a 360-s round: the holder keeps the GPU
    # unless the other's priority (allocation / decayed share) is more than 1 + 6 x 30 / 360 = 1.5 times its own
    live = _live(engine, tmp_path, restart_overhead_s=30.0)
    sim = SimulatorMechanism(live, ["job-a", "job-b"], True, 30.0)
    history: list[str] = []
    held_back = 0  # rounds the holder kept although the other's priority was higher
    for k in range(30):
        rnd = live.next_round(("a", "b") if k == 0 else ())
        (lease,) = rnd.assignment
        assert {lease.job_id} == sim.round(rnd)
        if k >= 1:
            share = _shares(history, k)
            prio = {j: 0.5 / max(s, 1e-9) for j, s in share.items()}
            holder = history[-1]
            other = "job-b" if holder == "job-a" else "job-a"
            if prio[other] > 1.5 * prio[holder]:
                assert lease.job_id == other, f"round {k + 1}: kept {holder} though outranked by more than 1.5x"
            else:
                assert lease.job_id == holder, f"round {k + 1}: rotated {holder} off for a gain below 1.5x"
                held_back += prio[other] > prio[holder]
        history.append(lease.job_id)
    moves = sum(x != y for x, y in itertools.pairwise(history))
    assert held_back >= 10 and moves == 7  # without the hysteresis the two alternate: 29 moves in 30 rounds


def test_decayed_seconds_come_from_the_stored_leases_and_folding_new_rounds_in_gives_the_same() -> None:
    def rnd(number: int, start_s: float, end_s: float | None, job: str) -> RoundLeases:
        end = None if end_s is None else T0 + timedelta(seconds=end_s)
        return RoundLeases(number, T0 + timedelta(seconds=start_s), end, ((job, "v100"),))

    now = T0 + timedelta(seconds=1000)
    rounds = [rnd(1, 0, 360, "a"), rnd(2, 360, 700, "b"), rnd(3, 700, None, "a")]  # the open round ends now
    got = decayed_received(rounds, ["a", "b", "gone"], now, 7200.0)
    assert got["a"]["v100"] == pytest.approx(360 * math.exp(-1000 / 7200) + 300 * math.exp(-300 / 7200), rel=1e-12)
    assert got["b"]["v100"] == pytest.approx(340 * math.exp(-640 / 7200), rel=1e-12) and got["gone"] == {}
    # the executor's fold: the counts at 700 s (rounds 1-2, closed), aged to now, plus round 3
    before = decayed_received(rounds[:2], None, T0 + timedelta(seconds=700), 7200.0)
    folded = decayed_received(rounds[2:], None, now, 7200.0, start=before, start_at=T0 + timedelta(seconds=700))
    assert folded.keys() == {"a", "b"}
    assert all(folded[j]["v100"] == pytest.approx(got[j]["v100"], rel=1e-12) for j in ("a", "b"))
    # the rounds read are bounded by HISTORY_MEMORIES memories, or by the first arrival when later
    late = T0 + timedelta(days=100)
    assert history_since([T0, late], late, 7200.0) == late - timedelta(seconds=HISTORY_MEMORIES * 7200.0)
    assert history_since([T0 + timedelta(hours=2), T0], T0 + timedelta(hours=3), 7200.0) == T0
