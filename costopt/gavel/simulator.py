"""Round-based simulation of a policy on a trace: the same policy and mechanism a live fleet uses,
with simulated progress instead of workers.

Each round (default 360 s): admit the jobs that arrived, re-solve the policy if a job arrived or
completed since the last solve (at most once per ``resolve_interval_s``), plan the round, then
advance every running job by its throughput (consolidated or spread, alone or co-located) for the
round, minus ``restart_overhead_s`` when it moved (and ``start_overhead_s`` in its first round: the
start of its first copy, 0 in Gavel's simulator). A job finishing mid-round frees its GPUs at the
next round. Jobs arriving mid-round wait for the next round (their JCT counts the wait).

Metrics (:class:`SimResult`): average JCT over a window of job ids, makespan (first arrival to last
completion of the window), utilization (busy GPU-seconds over available GPU-seconds while at least
one job is in the system), finish-time fairness rho per job (JCT over the JCT of an isolated 1/N share,
N = the job's time-averaged number of jobs in the system), moves per job (restarts from a checkpoint,
first start excluded).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from costopt.gavel.errors import InvalidState
from costopt.gavel.mechanism import DEFAULT_ROUND_S, RoundMechanism, fastest_first, mechanism_rule
from costopt.gavel.policies import Policy, get_policy
from costopt.gavel.state import ClusterState, FloatArray, IntArray
from costopt.gavel.trace import Trace, generate_trace
from costopt.gavel.workload import Workload

log = logging.getLogger(__name__)

DEFAULT_CLUSTER = "36:36:36"
DEFAULT_GPUS_PER_SERVER = 4
DEFAULT_PRICES_USD_PER_H = {"v100": 2.48, "p100": 1.46, "k80": 0.45}
"""On-demand USD per GPU-hour of GCP's V100, P100 and K80 in us-central1 (2020), for the cost policies."""


def parse_cluster(spec: str, n_types: int = 3) -> tuple[int, ...]:
    """``"36:36:36"`` -> (36, 36, 36): GPU counts per worker type, in the workload's type order."""
    try:
        counts = tuple(int(p) for p in spec.split(":"))
    except ValueError:
        raise InvalidState(f"cluster must be GPU counts like 36:36:36, got {spec!r}") from None
    if len(counts) != n_types or min(counts) < 0 or sum(counts) == 0:
        raise InvalidState(f"cluster needs {n_types} counts >= 0 (not all 0), got {spec!r}")
    return counts


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """One measured job of a simulation: ``completion_s`` is when it finished (simulated seconds, the
    trace's clock), None if it had not by the end of the run; ``moves``: restarts from a checkpoint
    (first start excluded)."""

    job_id: int
    arrival_s: float
    completion_s: float | None
    moves: int

    def jct_s(self, end_s: float) -> float:
        """Arrival to completion; for a job not finished, arrival to ``end_s`` (the run's end)."""
        return (self.completion_s if self.completion_s is not None else end_s) - self.arrival_s


@dataclass(frozen=True, slots=True)
class SimResult:
    """Outcome of one simulation; :meth:`as_dict` is JSON-able (plain floats, ints, bools, str).
    ``jobs``: the window's jobs in trace order (:class:`JobOutcome`), their JCTs average to
    ``avg_jct_s`` (with ``simulated_s`` as the end of unfinished ones)."""

    policy: str
    avg_jct_s: float
    makespan_s: float
    utilization: float
    wall_s: float
    cluster: str
    rate_per_hour: float | None
    seed: int
    window: tuple[int, int]
    window_complete: bool
    jobs_in_window: int
    jobs_completed: int
    ftf_rho_mean: float
    ftf_rho_max: float
    ftf_unfair_fraction: float
    moves_per_job: float
    rounds: int
    solves: int
    solve_s: float
    simulated_s: float
    multi_gpu: bool
    space_sharing: bool
    restart_overhead_s: float
    trace: str | None = None  # the file a recorded trace was read from (None: generated)
    jobs: tuple[JobOutcome, ...] = ()
    start_overhead_s: float = 0.0  # seconds a job's first round lost before its first step

    def as_dict(self, *, per_job: bool = False) -> dict[str, Any]:
        """The summary's fields; with ``per_job``, also ``jobs``: one dict per :class:`JobOutcome`."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "jobs"}
        out["window"] = list(self.window)
        if per_job:
            out["jobs"] = [asdict(j) for j in self.jobs]
        return out


def generated_trace(
    workload: Workload,
    rate: float | None = 5.0,
    seed: int = 0,
    window: tuple[int, int] = (4000, 5000),
    multi_gpu: bool = False,
    *,
    slos: bool = False,
    extra_jobs: int | None = None,
) -> Trace:
    """The trace :func:`simulate` runs: ``window[1]`` jobs for a static trace (``rate=None``), else
    ``window[1] + extra_jobs`` (default: the window's size more) so the window's last jobs do not
    finish on an emptying cluster."""
    lo, hi = window
    if not 0 <= lo < hi:
        raise InvalidState(f"window must be 0 <= first < end, got {window}")
    extra = (hi - lo) if extra_jobs is None else extra_jobs
    n = hi if rate is None else hi + extra
    return generate_trace(workload, n, rate_per_hour=rate, seed=seed, multi_gpu=multi_gpu, slos=slos)


def simulate(
    policy_name: str | Policy,
    cluster: str = DEFAULT_CLUSTER,
    rate: float | None = 5.0,
    seed: int = 0,
    window: tuple[int, int] = (4000, 5000),
    multi_gpu: bool = False,
    space_sharing: bool = False,
    restart_overhead_s: float = 0.0,
    *,
    workload: Workload,
    round_s: float = DEFAULT_ROUND_S,
    gpus_per_server: int = DEFAULT_GPUS_PER_SERVER,
    resolve_interval_s: float | None = None,
    slos: bool = False,
    extra_jobs: int | None = None,
    max_simulated_s: float = 5.0e7,
) -> SimResult:
    """Simulate ``policy_name`` (a registry name, or a policy made by hand) on a generated trace (see
    :mod:`costopt.gavel.trace` and :func:`generated_trace`).

    ``rate`` in jobs/hour; ``rate=None`` is a static trace of ``window[1]`` jobs all at t = 0 (for
    makespan). With arrivals, ``extra_jobs`` (default: the window's size) keep arriving after the
    window so its last jobs do not finish on an emptying cluster. The run stops when every job of
    the window is done, or at ``max_simulated_s`` (then ``window_complete`` is false and the JCTs of
    unfinished jobs count up to that time).
    """
    trace = generated_trace(workload, rate, seed, window, multi_gpu, slos=slos, extra_jobs=extra_jobs)
    return simulate_trace(
        get_policy(policy_name) if isinstance(policy_name, str) else policy_name,
        trace,
        workload,
        parse_cluster(cluster, len(workload.worker_types)),
        window=window,
        space_sharing=space_sharing,
        restart_overhead_s=restart_overhead_s,
        round_s=round_s,
        gpus_per_server=gpus_per_server,
        resolve_interval_s=resolve_interval_s,
        max_simulated_s=max_simulated_s,
        seed=seed,
        rate=rate,
        multi_gpu=multi_gpu,
    )


def simulate_trace(
    policy: Policy,
    trace: Trace,
    workload: Workload,
    capacity: tuple[int, ...],
    *,
    window: tuple[int, int] | None = None,
    space_sharing: bool = False,
    restart_overhead_s: float = 0.0,
    round_s: float = DEFAULT_ROUND_S,
    gpus_per_server: int = DEFAULT_GPUS_PER_SERVER,
    resolve_interval_s: float | None = None,
    max_simulated_s: float = 5.0e7,
    prices: tuple[float, ...] | None = None,
    seed: int = 0,
    rate: float | None = None,
    multi_gpu: bool = False,
    fast_forward: bool = True,
    source: str | None = None,
    per_type_queues: bool | None = None,
    memory_s: float | None = None,
    hysteresis: float | None = None,
    prior_s: float = 0.0,
    allocation_integral: bool | None = None,
    start_overhead_s: float = 0.0,
) -> SimResult:
    """Simulate ``policy`` on ``trace``; see :func:`simulate`. ``window``: the job ids measured,
    ``[first, end)`` (default: every job); ``source``: where the trace was read from (reported).

    ``fast_forward``: when every job runs, each on the only type its allocation names, the rounds until
    the next arrival or completion repeat the current one and are advanced in one step (exact; off
    only to check that). ``per_type_queues``: the mechanism serves one queue per worker type, fastest
    first (default: for heterogeneity-aware policies; agnostic ones use one queue over all types).
    ``memory_s``: the priorities' memory (see :class:`RoundMechanism`; ``math.inf``: since arrival),
    ``hysteresis``: a running unit's priority bonus, and ``allocation_integral``: priorities from the
    allocations in force since each job arrived, not the current one times its age; by default all three
    as :func:`~costopt.gavel.mechanism.mechanism_rule` gives them (with per-type queues: no memory,
    6 x ``restart_overhead_s / round_s`` and the integral; else since arrival, 0 and the share rule), the
    rule live fleets use too. ``prior_s``: see :class:`RoundMechanism` (default 0). ``start_overhead_s``:
    seconds of a job's first round lost before its first step (a live worker starting the job's process;
    default 0, as Gavel's simulator), charged like ``restart_overhead_s`` but not counted as a move."""
    wall0 = time.perf_counter()
    if round_s <= 0 or restart_overhead_s < 0 or restart_overhead_s >= round_s:
        raise InvalidState("need round_s > 0 and 0 <= restart_overhead_s < round_s")
    if not 0 <= start_overhead_s < round_s:
        raise InvalidState("need 0 <= start_overhead_s < round_s")
    n, nt = trace.n_jobs, len(workload.worker_types)
    in_window = trace.window_mask(window)
    if not in_window.any():
        raise InvalidState(
            f"no job of the trace has an id in the window [{window[0]}, {window[1]})"
            if window
            else "the trace has no jobs"
        )
    lo, hi = window if window is not None else (int(trace.job_id.min()), int(trace.job_id.max()) + 1)
    cap = np.array(capacity, dtype=np.float64)
    price = np.array(
        prices if prices is not None else [DEFAULT_PRICES_USD_PER_H.get(w, 1.0) for w in workload.worker_types],
        dtype=np.float64,
    )
    interval = round_s if resolve_interval_s is None else resolve_interval_s
    cons = workload.consolidated[trace.entry]  # (n, J)
    per_type = policy.heterogeneity_aware if per_type_queues is None else per_type_queues
    rule = mechanism_rule(per_type, restart_overhead_s, round_s)  # live fleets' too (costopt/fleets/rounds.py)
    mech = RoundMechanism(
        list(capacity),
        [gpus_per_server] * nt,
        n,
        type_order=fastest_first(cons) if per_type else None,
        memory_s=rule.memory_s if memory_s is None else memory_s,
        hysteresis=rule.hysteresis if hysteresis is None else hysteresis,
        prior_s=prior_s,
        allocation_integral=rule.allocation_integral if allocation_integral is None else allocation_integral,
        round_s=round_s,
    )
    spread = workload.spread[trace.entry]
    remaining = trace.steps.astype(np.float64).copy()
    done_at = np.full(n, np.nan)
    admitted_integral = np.zeros(n)  # integral over time of the number of jobs in the system, at admission
    done_integral = np.zeros(n)  # ... and at completion
    moves = np.zeros(n, dtype=np.int64)
    started = np.zeros(n, dtype=np.bool_)  # the job has run a round (its first start is behind it)
    sf = trace.scale_factor
    active: IntArray = np.zeros(0, dtype=np.int64)
    next_arrival = 0
    t = float(trace.arrival_s[0]) if n else 0.0
    t = np.ceil(t / round_s) * round_s
    integral = 0.0
    busy_gpu_s = 0.0
    active_s = 0.0
    rounds = solves = 0
    solve_s = 0.0
    last_solve = -np.inf
    dirty = True
    window_left = int(in_window.sum())
    while window_left > 0 and t < max_simulated_s:
        # admit
        k = int(np.searchsorted(trace.arrival_s, t, side="right"))
        if k > next_arrival:
            new = np.arange(next_arrival, k, dtype=np.int64)
            admitted_integral[new] = integral
            active = np.concatenate([active, new])
            next_arrival = k
            dirty = True
        if active.size == 0:
            if next_arrival >= n:
                break
            t = float(np.ceil(trace.arrival_s[next_arrival] / round_s) * round_s)
            continue
        if dirty and t - last_solve >= interval - 1e-9:
            s0 = time.perf_counter()
            state = ClusterState.create(
                cons[active],
                cap,
                worker_types=workload.worker_types,
                prices=price,
                job_ids=active,
                scale_factor=sf[active],
                weight=trace.weight[active],
                steps_remaining=remaining[active],
                arrival_s=trace.arrival_s[active],
                slo_s=trace.slo_s[active],
                job_type=trace.entry[active],
                now_s=t,
                pair_throughput=workload.pair if space_sharing else None,
                space_sharing=space_sharing,
            )
            alloc = policy.allocate(state)
            mech.set_allocation(
                active, sf[active], state.runnable(), alloc.x, alloc.pairs, alloc.pair_x, trace.arrival_s[active]
            )
            # jobs whose allocation is on one type only: if all run, the next rounds repeat this one
            one_type = np.full(n, -1, dtype=np.int64)
            single = ((alloc.x > 0).sum(axis=1) == 1) & (alloc.pairs.shape[0] == 0)
            one_type[active[single]] = np.argmax(alloc.x[single], axis=1)
            solve_s += time.perf_counter() - s0
            solves += 1
            last_solve = t
            dirty = False
        plan = mech.plan(t)
        rounds += 1
        integral += active.size * round_s
        active_s += round_s
        if plan.n_units:
            a, b = plan.members[:, 0], plan.members[:, 1]
            paired = b >= 0
            j = plan.wtype
            ta = np.where(plan.consolidated, cons[a, j], spread[a, j])
            if paired.any():
                bb = b[paired]
                pt = workload.pair
                ratio_a = np.where(
                    plan.consolidated[paired], 1.0, spread[a[paired], j[paired]] / cons[a[paired], j[paired]]
                )
                ratio_b = np.where(plan.consolidated[paired], 1.0, spread[bb, j[paired]] / cons[bb, j[paired]])
                ta[paired] = pt[trace.entry[a[paired]], trace.entry[bb], j[paired]] * ratio_a
                tb = pt[trace.entry[bb], trace.entry[a[paired]], j[paired]] * ratio_b
                jobs = np.concatenate([a, bb])
                rates = np.concatenate([ta, tb])
                moved = np.concatenate([plan.moved[:, 0], plan.moved[paired, 1]])
                unit_of = np.concatenate([np.arange(plan.n_units), np.nonzero(paired)[0]])
            else:
                jobs, rates, moved, unit_of = a, ta, plan.moved[:, 0], np.arange(plan.n_units)
            moves[jobs] += moved
            start = np.where(moved, restart_overhead_s, np.where(started[jobs], 0.0, start_overhead_s))
            started[jobs] = True
            work = round_s - start
            with np.errstate(divide="ignore", invalid="ignore"):
                need_s = np.where(rates > 0, remaining[jobs] / rates, np.inf)
            finishes = need_s <= work
            used = np.where(finishes, start + need_s, round_s)
            remaining[jobs] = np.where(finishes, 0.0, remaining[jobs] - rates * work)
            done_at[jobs[finishes]] = t + used[finishes]
            done_integral[jobs[finishes]] = integral
            unit_busy = np.zeros(plan.n_units)
            np.maximum.at(unit_busy, unit_of, used)
            busy_gpu_s += float((unit_busy * plan.gpus).sum())
            mech.record(plan, round_s)
            if finishes.any():
                fin = jobs[finishes]
                mech.forget(fin)
                window_left -= int(in_window[fin].sum())
                active = active[~np.isin(active, fin)]
                dirty = True
            elif (
                fast_forward
                and not dirty
                and plan.n_units == active.size
                and not paired.any()
                and restart_overhead_s == 0.0
                and np.array_equal(one_type[a], j)
            ):
                # Every job runs, each on the only type its allocation names: until the next arrival or
                # completion, every round repeats this one. Skip those rounds in one step.
                next_round = t + round_s
                until = np.ceil(trace.arrival_s[next_arrival] / round_s) * round_s if next_arrival < n else np.inf
                with np.errstate(divide="ignore"):
                    first_done = next_round + float((remaining[a] / rates).min())
                skip = int(
                    min(
                        until - next_round,
                        np.floor((first_done - next_round) / round_s) * round_s,
                        max_simulated_s - next_round,
                    )
                    // round_s
                )
                if skip > 0:
                    span = skip * round_s
                    remaining[a] -= rates * span
                    busy_gpu_s += float(plan.gpus.sum()) * span
                    integral += active.size * span
                    active_s += span
                    rounds += skip
                    mech.record(plan, span)
                    t += span
        t += round_s
    return _result(
        policy.name,
        trace,
        workload,
        cap,
        done_at,
        done_integral - admitted_integral,
        moves,
        (lo, hi),
        in_window,
        t,
        busy_gpu_s,
        active_s,
        rounds,
        solves,
        solve_s,
        time.perf_counter() - wall0,
        space_sharing,
        restart_overhead_s,
        seed,
        rate,
        multi_gpu,
        source,
        start_overhead_s,
    )


def _result(
    name: str,
    trace: Trace,
    workload: Workload,
    cap: FloatArray,
    done_at: FloatArray,
    jobs_seen: FloatArray,
    moves: IntArray,
    window: tuple[int, int],
    in_window: npt.NDArray[np.bool_],
    t_end: float,
    busy_gpu_s: float,
    active_s: float,
    rounds: int,
    solves: int,
    solve_s: float,
    wall_s: float,
    space_sharing: bool,
    restart_overhead_s: float,
    seed: int,
    rate: float | None,
    multi_gpu: bool,
    source: str | None,
    start_overhead_s: float = 0.0,
) -> SimResult:
    lo, hi = window
    ids = np.nonzero(in_window)[0]
    finished = np.isfinite(done_at[ids])
    end = np.where(finished, done_at[ids], t_end)
    jct = end - trace.arrival_s[ids]
    # finish-time fairness: JCT over the JCT of an isolated 1/N share, N averaged over the job's life
    n_avg = np.where(finished, np.maximum(jobs_seen[ids] / np.maximum(jct, 1e-9), 1.0), 1.0)
    total = float(cap.sum())
    sf = trace.scale_factor[ids]
    cons = workload.consolidated[trace.entry[ids]]
    can = (cons > 0) & (cap[None, :] >= sf[:, None])
    frac = np.minimum(1.0, total / (n_avg * sf))
    iso_tput = frac * (np.where(can, cons, 0.0) @ cap) / total
    rho = jct / (trace.steps[ids] / np.maximum(iso_tput, 1e-300))
    rho_f = rho[finished]
    outcomes = tuple(
        JobOutcome(int(i), float(a), float(d) if np.isfinite(d) else None, int(m))
        for i, a, d, m in zip(
            trace.job_id[ids].tolist(),
            trace.arrival_s[ids].tolist(),
            done_at[ids].tolist(),
            moves[ids].tolist(),
            strict=True,
        )
    )
    cluster = ":".join(str(int(c)) for c in cap)
    return SimResult(
        policy=name,
        avg_jct_s=float(jct.mean()) if jct.size else 0.0,
        makespan_s=float(end.max() - trace.arrival_s[ids].min()) if jct.size else 0.0,
        utilization=float(busy_gpu_s / (active_s * total)) if active_s > 0 else 0.0,
        wall_s=float(wall_s),
        cluster=cluster,
        rate_per_hour=rate,
        seed=seed,
        window=(lo, hi),
        window_complete=bool(finished.all()),
        jobs_in_window=int(ids.size),
        jobs_completed=int(finished.sum()),
        ftf_rho_mean=float(rho_f.mean()) if rho_f.size else 0.0,
        ftf_rho_max=float(rho_f.max()) if rho_f.size else 0.0,
        ftf_unfair_fraction=float((rho_f > 1.0).mean()) if rho_f.size else 0.0,
        moves_per_job=float(moves[ids].mean()) if ids.size else 0.0,
        rounds=rounds,
        solves=solves,
        solve_s=float(solve_s),
        simulated_s=float(t_end),
        multi_gpu=multi_gpu,
        space_sharing=space_sharing,
        restart_overhead_s=float(restart_overhead_s),
        trace=source,
        jobs=outcomes,
        start_overhead_s=float(start_overhead_s),
    )
