"""One round boundary of a fleet, decided from live state with Gavel's own pieces.

:func:`plan_round` builds the :class:`~costopt.gavel.state.ClusterState` from what the fleet's workers
reported (each job's steps done, the seconds of leases it received on each worker type, where it ran last
round), calls the fleet's policy when asked (a job arrived or left, the GPUs changed, or every
``resolve_rounds`` rounds), and runs :class:`~costopt.gavel.mechanism.RoundMechanism` for the round: the
same policy objects and mechanism :func:`costopt.gavel.simulator.simulate_trace` drives with simulated
progress, under the same rule (:func:`costopt.gavel.mechanism.mechanism_rule`: for heterogeneity-aware
policies, per-type queues, priorities from the allocation integral and a hysteresis from the fleet's
restart overhead). The mechanism is rebuilt at every boundary from the stored history (its ``received``
seconds, ``ever_ran`` flags, last round's types, the seconds of allocation each job had in force per
type, folded round by round by :func:`owed_through` and stored per job, and, when the rule forgets, the
decayed seconds recomputed from the stored rounds' leases by :func:`decayed_received`), so any service
replica can run any round. Then
:func:`costopt.fleets.placement.place` puts the mechanism's units on instances.

Worker types are the accelerators of the fleet's live instances (alphabetical); a job's throughput on a
type counts only when one live instance of it has the job's GPUs (a job runs within one instance). Times
given to the policy are seconds since the fleet was created. Space sharing is not used by live fleets.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from costopt.fleets.model import Assigned, FleetInstance, FleetJob, FleetRecord, InstanceState, RoundLeases
from costopt.fleets.placement import Slot, Unit, place

if TYPE_CHECKING:
    from costopt.gavel.policies import Policy

__all__ = ["HISTORY_MEMORIES", "RoundDecision", "decayed_received", "history_since", "owed_through", "plan_round"]

HISTORY_MEMORIES = 30.0
"""Leases that started more than this many memories (``memory_s``) before a boundary are left out of the
decayed seconds: each of their seconds weighs below ``exp(-30)`` (9.4e-14), so a job's share moves by less
than 1e-9 (the mechanism's floor on shares) for any job younger than about a year (4,000 memories of
7200 s). This bounds the rounds read when an executor recomputes them (its first boundary of a fleet;
then it folds each new round in) to ``30 x memory_s / round_s`` (600 at 360-s rounds)."""


@dataclass(frozen=True, slots=True)
class RoundDecision:
    """What a boundary decided: the leases of the round, the GPUs per worker type it was planned on, the
    allocation document when the policy was solved (None: the one in force was kept) and the jobs the
    mechanism ran but no single instance could hold (they wait)."""

    assignment: tuple[Assigned, ...]
    capacity: Mapping[str, int]
    allocation: Mapping[str, Any] | None
    unplaced: tuple[str, ...] = ()


def _seconds(t: datetime, origin: datetime) -> float:
    return (t - origin).total_seconds()


def history_since(arrivals: Iterable[datetime], now: datetime, memory_s: float) -> datetime:
    """The earliest round start whose leases can count in the decayed seconds at ``now`` of jobs that
    arrived at ``arrivals``: the latest of ``now - HISTORY_MEMORIES x memory_s`` and the first arrival (a
    lease starts after its job arrived)."""
    cutoff = now - timedelta(seconds=HISTORY_MEMORIES * memory_s)
    return max(cutoff, min(arrivals, default=now))


def decayed_received(
    rounds: Iterable[RoundLeases],
    job_ids: Iterable[str] | None,
    now: datetime,
    memory_s: float,
    *,
    start: Mapping[str, Mapping[str, float]] | None = None,
    start_at: datetime | None = None,
) -> dict[str, dict[str, float]]:
    """Seconds of leases each of ``job_ids`` (None: every job of the leases) received on each worker type,
    a second run ``t`` seconds before ``now`` weighted ``exp(-t / memory_s)``, from the stored ``rounds``:
    as :class:`~costopt.gavel.mechanism.RoundMechanism` decays them round by round in the simulator, a
    round's seconds weigh ``exp(-(now - its start) / memory_s)``. A round's seconds: from its start to its
    end (the open round's ends at ``now``), as the executor credits ``received``. ``start``: counts of
    earlier rounds decayed to ``start_at``, aged to ``now`` and added (the executor folds new rounds in)."""
    out: dict[str, dict[str, float]] = {} if job_ids is None else {j: {} for j in job_ids}
    if start is not None:
        if start_at is None or start_at > now:
            raise ValueError("start_at (not after now) is needed with start counts")
        f = math.exp(-(now - start_at).total_seconds() / memory_s)
        for job_id, had in start.items():
            if job_ids is None or job_id in out:
                out[job_id] = {t: v * f for t, v in had.items()}
    for rnd in rounds:
        end = now if rnd.ended_at is None else min(rnd.ended_at, now)
        held = (end - rnd.started_at).total_seconds()
        if held <= 0:
            continue
        credit = held * math.exp(-(now - rnd.started_at).total_seconds() / memory_s)
        for job_id, wtype in rnd.leases:
            got = out.get(job_id) if job_ids is not None else out.setdefault(job_id, {})
            if got is not None:
                got[wtype] = got.get(wtype, 0.0) + credit
    return out


def owed_through(
    jobs: Iterable[FleetJob],
    allocation: Mapping[str, Any] | None,
    round_started_at: datetime | None,
    held_s: float,
    now: datetime,
    memory_s: float | None,
) -> dict[str, dict[str, float]]:
    """Each job's seconds of allocation in force per worker type (the allocation integral of
    :class:`~costopt.gavel.mechanism.RoundMechanism`) at the boundary ``now``: its stored ``owed`` (as of
    ``owed_at``) plus ``held_s`` seconds of ``allocation`` (the one in force in the round that started at
    ``round_started_at`` and ends now; ``held_s`` 0: no round to credit), as the mechanism's ``record``
    adds ``x x seconds`` for every job the allocation names. With ``memory_s``, a second ``t`` seconds
    before ``now`` weighs ``exp(-t / memory_s)``, as the mechanism decays its counts: the stored counts
    are aged from ``owed_at`` and the round's from its start. The executor folds the round that ended the
    way it credits ``received`` (the same ``held_s``), and writes the result with the new round in one
    transaction, so a boundary retried folds the same round into the same stored counts."""
    col: dict[str, int] = {}
    row: dict[str, int] = {}
    stored = np.zeros((0, 0))
    if allocation and held_s > 0:
        col = {str(t): k for k, t in enumerate(allocation.get("worker_types", []))}
        row = {str(j): k for k, j in enumerate(allocation.get("job_ids", []))}
        stored = np.asarray(allocation.get("x", []), dtype=np.float64)
    out: dict[str, dict[str, float]] = {}
    for job in jobs:
        had = dict(job.owed)
        if memory_s is not None and job.owed_at is not None and had:
            f = math.exp(-max((now - job.owed_at).total_seconds(), 0.0) / memory_s)
            had = {t: v * f for t, v in had.items()}
        k = row.get(job.job_id)
        if k is not None and round_started_at is not None:
            w = 1.0 if memory_s is None else math.exp(-max((now - round_started_at).total_seconds(), 0.0) / memory_s)
            for t, c in col.items():
                share = float(stored[k, c])
                if share > 0:
                    had[t] = had.get(t, 0.0) + share * held_s * w
        out[job.job_id] = had
    return out


def plan_round(
    fleet: FleetRecord,
    instances: Sequence[FleetInstance],
    jobs: Sequence[FleetJob],
    previous: Sequence[Assigned],
    received: Mapping[str, Mapping[str, float]],
    now: datetime,
    *,
    solve: bool,
    policy: Policy | None = None,
    restart_overhead_s: float = 0.0,
    decayed: Mapping[str, Mapping[str, float]] | None = None,
    owed: Mapping[str, Mapping[str, float]] | None = None,
) -> RoundDecision:
    """The leases of the round starting at ``now`` (see the module docstring).

    ``instances``: the fleet's instances (those ``running`` count); ``jobs``: the jobs to share the fleet
    among (unfinished, not being cancelled); ``previous``: the last round's leases; ``received``: seconds of
    leases each job received on each worker type up to ``now``; ``solve``: call the policy (else keep the
    allocation in force, ``fleet.allocation``, for the jobs and types it names); ``policy``: the fleet's
    policy object when the caller keeps one between rounds (as the simulator does: a policy that keeps its
    LP models picks among optimal allocations by its history), else a new one. ``restart_overhead_s``:
    seconds a job loses per move (sets the hysteresis of aware policies); ``decayed``: each job's seconds
    of leases per worker type decayed to ``now`` (:func:`decayed_received` over the fleet's rounds since
    :func:`history_since`, the open one included), which a rule that forgets needs (the others ignore it);
    ``owed``: each job's seconds of allocation in force per worker type up to ``now``
    (:func:`owed_through`), which the allocation integral of aware policies needs."""
    from costopt.gavel.mechanism import RoundMechanism, fastest_first, mechanism_rule
    from costopt.gavel.policies import get_policy
    from costopt.gavel.state import ClusterState

    live = [i for i in instances if i.state is InstanceState.RUNNING]
    cap: dict[str, int] = {}
    largest: dict[str, int] = {}
    price: dict[str, list[float]] = {}
    for i in live:
        cap[i.accelerator] = cap.get(i.accelerator, 0) + i.gpus
        largest[i.accelerator] = max(largest.get(i.accelerator, 0), i.gpus)
        if i.usd_per_hour is not None:
            price.setdefault(i.accelerator, []).append(float(i.usd_per_hour) / i.gpus)
    types = sorted(cap)
    if not types or not jobs:
        return RoundDecision((), cap, None)
    n, nt = len(jobs), len(types)
    tput = np.zeros((n, nt))
    for r, job in enumerate(jobs):
        for c, t in enumerate(types):
            rate = job.throughput.get(t, 0.0)
            if rate > 0 and job.gpus <= largest[t]:
                tput[r, c] = rate
    teams = sorted({j.team_id for j in jobs})
    last_type = {a.job_id: types.index(a.wtype) for a in previous if a.wtype in cap}
    origin = fleet.created_at
    arrival = np.array([_seconds(j.arrived_at, origin) for j in jobs])
    state = ClusterState.create(
        tput,
        np.array([cap[t] for t in types], dtype=np.float64),
        worker_types=types,
        prices=np.array([float(np.mean(price[t])) if t in price else 0.0 for t in types]),
        job_ids=np.arange(n),
        scale_factor=np.array([j.gpus for j in jobs]),
        weight=np.array([j.weight for j in jobs]),
        steps_remaining=np.array([max(j.steps_total - j.steps_done, 0) for j in jobs], dtype=np.float64),
        arrival_s=arrival,
        slo_s=np.array([np.inf if j.slo_s is None else j.slo_s for j in jobs]),
        team=np.array([teams.index(j.team_id) for j in jobs]),
        current_type=np.array([last_type.get(j.job_id, -1) for j in jobs]),
        now_s=_seconds(now, origin),
    )
    if policy is None:
        policy = get_policy(fleet.policy)
    doc: dict[str, Any] | None = None
    if solve:
        alloc = policy.allocate(state)
        x = np.asarray(alloc.x, dtype=np.float64)
        doc = {
            "policy": policy.name,
            "round": fleet.round + 1,
            "at": now.isoformat(),
            "worker_types": list(types),
            "job_ids": [j.job_id for j in jobs],
            "x": [[round(float(v), 12) for v in row] for row in x],
            "objective": float(alloc.objective),
            "notes": list(alloc.notes),
        }
    else:
        x = _kept(fleet.allocation, jobs, types)
    # the mechanism, rebuilt from the stored history; constructed as the simulator constructs it
    rule = mechanism_rule(policy.heterogeneity_aware, restart_overhead_s, fleet.round_s)
    mech = RoundMechanism(
        [cap[t] for t in types],
        [largest[t] for t in types],
        n,
        type_order=fastest_first(tput) if rule.per_type_queues else None,
        memory_s=rule.memory_s,
        hysteresis=rule.hysteresis,
        allocation_integral=rule.allocation_integral,
        round_s=fleet.round_s,
    )
    recent = owed_s = None
    if rule.memory_s is not None:
        if decayed is None:
            raise ValueError(f"policy {policy.name} forgets received seconds: plan_round needs them decayed")
        recent = np.array([[float(decayed.get(j.job_id, {}).get(t, 0.0)) for t in types] for j in jobs])
    if rule.allocation_integral:
        if owed is None:
            raise ValueError(f"policy {policy.name} ranks by the allocation integral: plan_round needs owed seconds")
        owed_s = np.array([[float(owed.get(j.job_id, {}).get(t, 0.0)) for t in types] for j in jobs])
    mech.resume(
        np.array([[float(received.get(j.job_id, {}).get(t, 0.0)) for t in types] for j in jobs]),
        np.array([j.ever_ran for j in jobs], dtype=bool),
        now_s=state.now_s,
        recent=recent,
        last_type=np.array([last_type.get(j.job_id, -1) for j in jobs], dtype=np.int64),
        owed=owed_s,
    )
    mech.set_allocation(
        np.arange(n, dtype=np.int64),
        state.scale_factor,
        state.runnable(),
        x,
        np.zeros((0, 2), dtype=np.int64),
        np.zeros((0, nt)),
        arrival,
    )
    plan = mech.plan(state.now_s)
    units = [
        Unit(jobs[int(a)].job_id, types[int(w)], int(g))
        for (a, _), w, g in zip(plan.members.tolist(), plan.wtype.tolist(), plan.gpus.tolist(), strict=True)
    ]
    held = {a.job_id: (a.instance, a.gpus) for a in previous}
    slots = [Slot(i.id, i.accelerator, i.gpus) for i in live]
    where, unplaced = place(units, slots, held)
    epoch_of = {j.job_id: j for j in jobs}
    assignment = []
    for u in units:
        if u.job_id not in where:
            continue
        inst, gpus = where[u.job_id]
        job = epoch_of[u.job_id]
        stays = job.holder == inst and held.get(u.job_id) == (inst, gpus) and job.holder_epoch is not None
        epoch = int(job.holder_epoch) if stays and job.holder_epoch is not None else job.epoch + 1
        assignment.append(Assigned(u.job_id, inst, gpus, u.wtype, epoch))
    return RoundDecision(tuple(assignment), cap, doc, tuple(unplaced))


def _kept(doc: Mapping[str, Any] | None, jobs: Sequence[FleetJob], types: Sequence[str]) -> Any:
    """The allocation in force as a (jobs x types) matrix for ``jobs`` and ``types`` (0 where it names
    neither the job nor the type)."""
    x = np.zeros((len(jobs), len(types)))
    if not doc:
        return x
    col = {str(t): k for k, t in enumerate(doc.get("worker_types", []))}
    row = {str(j): k for k, j in enumerate(doc.get("job_ids", []))}
    stored = np.asarray(doc.get("x", []), dtype=np.float64)
    for r, job in enumerate(jobs):
        k = row.get(job.job_id)
        if k is None:
            continue
        for c, t in enumerate(types):
            if t in col:
                x[r, c] = stored[k, col[t]]
    return x
