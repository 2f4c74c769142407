"""Aware LAS (max_min_fairness_perf) against an emulation of Gavel's reference mechanism, on the same
recorded traces (issue 12, "Traces from elsewhere").

The traces are Gavel's continuous ones (5 jobs/h, jobs 4000-4999 measured, 36 V100 / 36 P100 / 36 K80
in servers of 4, rounds of 360 s), written with ``costopt gavel simulate --dump-trace`` (the same
writer) and read back with ``--trace``'s reader, so every variant runs the same jobs:

* ``costopt-one-queue``: the mechanism before issue 12 (one priority queue over every (job, type)).
* ``costopt``: one queue per worker type, fastest first, priorities from the share since arrival (the
  mechanism between issue 12's per-type queues and its memory rule).
* ``costopt-default``: the core's rule for aware policies as it is (``mechanism_rule``, nothing
  overridden; since 2026-12-04 the allocation integral since arrival, the same JCTs as ``costopt+integral``)
  and ``costopt-default@30s`` at 30 s per move (its hysteresis 6 x 30 / 360; as
  ``costopt+integral+hyst6@30s``); other options add to it (``costopt-default+leftover1920``).
  ``costopt+mem7200``: the default from 2026-12-02 to 12-04 at zero restart cost (shares decayed with a
  memory of 7200 s); ``costopt+mem7200+hyst6@30s`` at 30 s per move (hysteresis 6 x 30 / 360). Other
  variants: ``+mem<S>`` (memory of S seconds), ``+hyst<K>`` (a unit that ran on
  the type last round: priority x (1 + K x overhead / 360 s)), ``+hh<H>`` (x (1 + H) whatever the
  overhead), ``+prior<S>``, ``+central-lp``, ``+resolve-1920s`` (new allocations at most every 1920 s),
  ``+fill-per-type`` (each type's queue followed by the jobs the allocation gives nothing there, before
  the next type; fast-forward off), ``+deficit-tie`` / ``+deficit-total-tie`` (ties of priority broken
  first by the decayed seconds owed on the type / over all types, as the reference breaks them by
  deficit), ``+type-frac`` (the share is the unit's fraction of the type's decayed time, as the
  reference's, not of its own age), ``+no-ff`` (the fast-forward off), ``@<S>s`` (S seconds lost per
  move); a variant without ``+mem``/``+hyst``/``+hh`` uses the share since arrival and no hysteresis.
  Added after the job-by-job comparison of seed 2 (docs/gavel.md): ``+fpt-<order>`` (``+fill-per-type``
  with the unallocated jobs of each type ordered ``recv``: least decayed seconds there first, or
  ``gain``: largest throughput there over the job's slowest type first), ``+drr`` (each type's queue
  ranked by the deficit: the integral of the allocation in force minus the seconds received, decayed
  alike; ``+drr-norm``: times the job's throughput there over its mean; ``+drr-x`` (2026-12-04): the
  deficit with the coming round's ``x round_s``, over ``x round_s`` (rounds of its allocation owed);
  ``+diff``: the current allocation times the age in place of the integral; with ``+fpt-<order>``:
  per-type fill too), ``+integral`` (the core's ``allocation_integral``: the share rule's priority with
  the integral of the allocation in force, coming round included, over the seconds received) and
  ``+ratio-int`` (the same with the fast-forward off: first an experiment subclass, whose JCTs
  ``+integral`` reproduced, now the core's).
  ``+leftover<S>`` (2026-12-04): a job that arrived less than S seconds ago has no allocation in force
  yet, as the reference's arrivals until its next reset: it runs only on GPUs left over and is owed
  nothing meanwhile (fast-forward off; ``+leftover-owed<S>``: owed its allocation while held, as the
  allocation integral counts it). ``+after`` (2026-12-04): the integral's ratio after the coming round if
  the unit runs, ``(owed + x round_s) / (received + round_s)``. ``+iprior<S>`` (2026-12-04): the
  allocation integral's priority as if each unit had received its allocation for S seconds before it
  arrived,
  ``(owed + x round_s + x S) / (received + x S)`` (a new job's priority bounded by ``1 + round_s / S``).
  ``reference-emulation+reset<S>``: the emulation with a reset (and a new allocation) every S seconds.
  ``--jobs-table A B --seeds S``: variant A against B job by job on seed S (JCT differences summed by
  the job's V100 duration and V100/K80 speedup; uses ``SimResult.jobs``).
* ``reference-emulation``: this simulator driven the way the reference implementation
  (stanford-futuredata/gavel, ``scheduler/scheduler.py`` at c4fa400, read, not copied) drives its
  simulation: one queue per type served V100, P100, K80; priority = allocation / the job's fraction of
  the type's time since the last reset, every job starting each reset with half a round on every type;
  ties by deficit (time owed at past resets), then allocation; jobs without allocation on a type queue
  there after the others, by deficit; a reset, and a new allocation in force, at most every 1920 s (its
  ``minimum_time_between_allocation_resets``): jobs that arrived since have no allocation yet and run
  only on GPUs left over; and the max-min LP solved by an interior-point method
  without crossover (the reference's default solver, ECOS, is interior-point: its optimum is a central
  point of the optimal face, not a vertex). What is not emulated: the reference's rounds end when
  their last job ends (here: every 360 s), its steps per round are whole numbers, and ECOS's exact point.

Every costopt variant runs the registry's aware LAS, which since 2026-12-04 takes the Pareto stage (of
the allocations at the max-min level, the one with the largest total normalized throughput). Rows run
before then have ``"lp": "single"`` in their spec (the max-min LP alone, HiGHS's vertex; shown
``[single LP]``); they were kept, not re-run. The emulation always solves the max-min LP alone, as the
reference.

Run: .venv/bin/python experiments/gavel/compare_reference.py [--seeds 0 1 2] [--processes 2] [--ablations]
[--variants V ...] [--jobs-table A B]
Appends to experiments/gavel/results/reference_comparison.jsonl (resumable); prints the table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy.typing as npt
from gavel_common import DATA, RESULTS, load, single_lp_las, spec_key

if TYPE_CHECKING:
    from costopt.gavel.lp import LPSolution
    from costopt.gavel.mechanism import BoolArray, RoundMechanism, RoundPlan
    from costopt.gavel.state import FloatArray, IntArray

VARIANTS = ("costopt-one-queue", "costopt", "costopt+mem7200", "costopt-default", "reference-emulation")
ABLATIONS = (
    "one-queue+central-lp",  # the allocation vertex: the old mechanism on the reference's kind of optimum
    "one-queue+resolve-1920s",  # admission: new allocations at most every 1920 s, as the reference
    "reference-emulation+vertex-lp",  # the reference's mechanism on HiGHS's vertex
    "reference-emulation+one-queue",  # the reference's priorities without its per-type queues
    "costopt@30s",  # 30 s lost per move (restart from a checkpoint), which the paper does not charge
    "costopt+mem7200@30s",  # the memory without the hysteresis
    "costopt+mem7200+hyst6@30s",  # the default of 2026-12-02 to 12-04 at 30 s per move
    "costopt-default@30s",  # today's default at 30 s per move
    "reference-emulation@30s",
)
"""With ``--ablations``: which of the reference's mechanisms carries the difference."""
OUT = RESULTS / "reference_comparison.jsonl"
WINDOW = (4000, 5000)
RESET_S = 1920.0


def _reference_mechanism(per_type: bool, reset_s: float = RESET_S) -> type[RoundMechanism]:
    import numpy as np

    from costopt.gavel.mechanism import RoundMechanism

    class ReferenceEmulation(RoundMechanism):
        """Priorities, resets, deficits and per-type queues as the reference's simulation applies them."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._type_pos = np.arange(self.n_types) if per_type else np.zeros(self.n_types, dtype=np.int64)
            # v100, p100, k80: the workload's order
            n, t = self._n, self.n_types
            self.half = 180.0
            self.since_reset = np.zeros((n, t))  # seconds on each type since the last reset (+ half a round)
            self.deficit = np.zeros((n, t))
            self.known = np.zeros(n, dtype=bool)
            self.x_in_force = np.zeros((n, t))
            self.last_reset = -np.inf
            self.pending: tuple[Any, Any] | None = None
            self.jobs = np.zeros(0, dtype=np.int64)
            self.runnable = np.zeros((0, t), dtype=bool)

        def set_allocation(
            self,
            jobs: IntArray,
            scale_factor: IntArray,
            runnable: BoolArray,
            x: FloatArray,
            pairs: IntArray,
            pair_x: FloatArray,
            since_s: FloatArray,
        ) -> None:
            super().set_allocation(jobs, scale_factor, runnable, x, pairs, pair_x, since_s)
            fresh = jobs[~self.known[jobs]]
            self.since_reset[fresh] = self.half
            self.known[fresh] = True
            self.pending = (jobs, x)  # in force at the next reset; until then, new jobs queue without allocation
            self.jobs, self.runnable = jobs, runnable

        def plan(self, now_s: float) -> RoundPlan:
            if self.pending is not None and now_s - self.last_reset >= reset_s - 1e-9:  # a reset: the new allocation
                jobs, x = self.pending
                if np.isfinite(self.last_reset):
                    owed = self.x_in_force[jobs] * (now_s - self.last_reset) - (self.since_reset[jobs] - self.half)
                    self.deficit[jobs] += owed
                self.since_reset[jobs] = self.half
                self.x_in_force[:] = 0.0
                self.x_in_force[jobs] = x
                self.last_reset, self.pending = now_s, None
            gone = np.frombuffer(bytes(self._gone), dtype=np.uint8).astype(bool)
            jobs = self.jobs
            type_time = self.since_reset[jobs[~gone[jobs]]].sum(axis=0)
            x = self.x_in_force[jobs]
            frac = np.divide(self.since_reset[jobs], type_time, out=np.zeros_like(x), where=type_time > 0)
            prio = np.where(x > 0, x / np.where(frac > 0, frac, 1e-9), 0.0)
            rows, types = np.nonzero(self.runnable)
            assert self._type_pos is not None  # set in __init__ (one queue: every type at 0)
            order = np.lexsort(
                (-x[rows, types], -self.deficit[jobs[rows], types], -prio[rows, types], self._type_pos[types])
            )
            free, busy = list(self.capacity), bytearray(self._gone)
            units: list[int] = []
            chosen: list[int] = []
            self._greedy(rows[order].tolist(), types[order].tolist(), free, busy, units, chosen)
            return self._place(np.array(units, dtype=np.int64), np.array(chosen, dtype=np.int64))

        def record(self, plan: RoundPlan, seconds: float) -> None:
            super().record(plan, seconds)
            np.add.at(self.since_reset, (plan.members[:, 0], plan.wtype), seconds)

    return ReferenceEmulation


def _fill_per_type_mechanism(fill_order: str | None = None) -> type[RoundMechanism]:
    import numpy as np

    from costopt.gavel.mechanism import RoundMechanism

    class FillPerType(RoundMechanism):
        """costopt's mechanism, but each type's queue is followed by the jobs the allocation gives nothing
        there (earliest arrival first; ``fill_order``: in that order, see :func:`_ordered_fill`) before the
        next type is served, as the reference's queues are."""

        def _queue(self, now_s: float) -> tuple[list[int], list[int]]:
            return _per_type_fill(self, np.lexsort((self._c_rank, -self._priority(now_s))))

        def _fill_candidates(self) -> tuple[list[int], list[int]]:
            if fill_order is not None:
                return _ordered_fill(self, fill_order)
            return super()._fill_candidates()

    return FillPerType


def _per_type_fill(mech: Any, order: Any) -> tuple[list[int], list[int]]:
    """The candidates in ``order``, each type's followed by the jobs the allocation gives nothing there
    (:meth:`_fill_candidates`' order), served in type order."""
    import numpy as np

    fu, fj = mech._fill_candidates()
    uc = np.concatenate([mech._c_unit[order], np.array(fu, dtype=np.int64)])
    tc = np.concatenate([mech._c_type[order], np.array(fj, dtype=np.int64)])
    group = np.concatenate([np.zeros(order.shape[0]), np.ones(len(fu))])
    final = np.lexsort((np.arange(uc.shape[0]), group, mech._type_pos[tc]))
    return uc[final].tolist(), tc[final].tolist()


def _age(mech: Any, now_s: float) -> Any:
    """Each candidate's (decayed) seconds since it arrived, as the share rule weighs them."""
    import numpy as np

    age = np.maximum(now_s - mech._u_since[mech._c_unit], 0.0)
    if mech.memory_s is not None:
        age = -mech.memory_s * np.expm1(-age / mech.memory_s)
    return age


_THROUGHPUT: Any = None  # the trace's jobs x types steps/s, set by _run for the +fpt-gain variant


def _ordered_fill(mech: RoundMechanism, order: str) -> tuple[list[int], list[int]]:
    """Each type's unallocated jobs in another order than the core's (``+fpt-<order>``): ``recv`` (least
    decayed seconds received on the type first, as the reference's deficit orders them), ``gain`` (largest
    throughput on the type over the job's slowest type first), each then earliest arrival."""
    import numpy as np

    jobs, allowed, since = mech._fill_from
    fu, fj = np.nonzero(allowed)
    if order == "recv":
        key = mech._recent[jobs[fu], fj]
    else:
        tp = _THROUGHPUT[jobs]
        slow = np.where(tp > 0, tp, np.inf).min(axis=1)
        key = -tp[fu, fj] / slow[fu]
    o = np.lexsort((jobs[fu], since[fu], key))
    return fu[o].tolist(), fj[o].tolist()


def _deficit_mechanism(
    fill_order: str | None = None, current_x: bool = False, normalized: bool = False, per_x: bool = False
) -> type[RoundMechanism]:
    import numpy as np

    from costopt.gavel.mechanism import RoundMechanism

    class Deficit(RoundMechanism):
        """Each type's queue ranked by the unit's deficit there: the (decayed) seconds the allocations in
        force since it arrived gave it on the type (the integral of its allocation over the rounds: the
        core's ``allocation_integral`` bookkeeping) minus the (decayed) seconds it ran there; larger first,
        ties by the usual rank (larger allocation, earlier arrival). Single-GPU units without space sharing
        only (an experiment)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "allocation_integral": True})

        def _fill_candidates(self) -> tuple[list[int], list[int]]:
            if fill_order:  # +fpt-<order>: each type's unallocated jobs in that order
                return _ordered_fill(self, fill_order)
            return super()._fill_candidates()

        def _queue(self, now_s: float) -> tuple[list[int], list[int]]:
            cu, cj = self._c_unit, self._c_type
            if not cu.shape[0]:
                return [], []
            a = self._u_members[cu, 0]
            if current_x:  # owed approximated by the current allocation over the (decayed) age, as the share rule
                deficit = self._c_x * _age(self, now_s) - self._recent[a, cj]
            else:
                deficit = self._owed[a, cj] - self._recent[a, cj]
            if normalized:  # seconds owed x the job's throughput there over its mean one: progress owed
                tp = _THROUGHPUT[a]
                deficit = deficit * tp[np.arange(a.shape[0]), cj] / tp.mean(axis=1)
            if per_x:  # the coming round included, in rounds of the unit's allocation there
                deficit = (deficit + self._c_x * self.round_s) / (self._c_x * self.round_s)
            if self.hysteresis > 0:  # a unit that ran on the type last round: owed h rounds more there
                deficit = np.where(self._held(), deficit + self.hysteresis * 360.0, deficit)
            assert self._type_pos is not None
            order = np.lexsort((self._c_rank, -deficit, self._type_pos[cj]))
            if fill_order:  # each type's queue followed by its unallocated jobs
                return _per_type_fill(self, order)
            return cu[order].tolist(), cj[order].tolist()

    return Deficit


def _deficit_tie_mechanism(total: bool) -> type[RoundMechanism]:
    import numpy as np

    from costopt.gavel.mechanism import RoundMechanism

    class DeficitTie(RoundMechanism):
        """costopt's mechanism, its ties of priority broken first by deficit, as the reference's are: the
        (decayed) seconds the unit is owed on the type, ``x * age - received there`` (``total``: over all
        its types, ``sum(x) * age - everything received``), larger first; then the usual rank."""

        def _queue(self, now_s: float) -> tuple[list[int], list[int]]:
            cu, cj, cx = self._c_unit, self._c_type, self._c_x
            if not cu.shape[0]:
                return [], []
            age = _age(self, now_s)
            if total:
                x_all = np.bincount(cu, weights=cx, minlength=self._u_recv.shape[0])[cu]
                deficit = x_all * age - self._u_recv[cu].sum(axis=1)
            else:
                deficit = cx * age - self._u_recv[cu, cj]
            assert self._type_pos is not None
            order = np.lexsort((self._c_rank, -deficit, -self._priority(now_s), self._type_pos[cj]))
            return cu[order].tolist(), cj[order].tolist()

    return DeficitTie


def _leftover_mechanism(hold_s: float, owed_meanwhile: bool = False) -> type[RoundMechanism]:
    import numpy as np

    from costopt.gavel.mechanism import RoundMechanism

    class Leftover(RoundMechanism):
        """costopt's mechanism, but a job that arrived less than ``hold_s`` ago has no allocation in force
        yet, as the reference's arrivals until its next reset: it is not in the types' queues, runs only on
        GPUs left over (with the jobs the allocation gives nothing there, earliest arrival first) and is
        owed nothing meanwhile (``owed_meanwhile``: owed its allocation while held, which it catches up on
        after). Single-GPU units without space sharing only (an experiment)."""

        _now = 0.0

        def set_allocation(
            self,
            jobs: IntArray,
            scale_factor: IntArray,
            runnable: BoolArray,
            x: FloatArray,
            pairs: IntArray,
            pair_x: FloatArray,
            since_s: FloatArray,
        ) -> None:
            super().set_allocation(jobs, scale_factor, runnable, x, pairs, pair_x, since_s)
            self._rows_runnable = runnable

        def _young(self, units: Any) -> Any:
            return self._u_since[units] > self._now - hold_s + 1e-9

        def plan(self, now_s: float) -> RoundPlan:
            self._now = now_s
            self._f_unit = None  # who is young changes with time
            return super().plan(now_s)

        def _queue(self, now_s: float) -> tuple[list[int], list[int]]:
            cu, cj = super()._queue(now_s)
            if not cu:
                return cu, cj
            keep = ~self._young(np.array(cu, dtype=np.int64))
            return np.array(cu)[keep].tolist(), np.array(cj)[keep].tolist()

        def _fill_candidates(self) -> tuple[list[int], list[int]]:
            jobs, allowed, since = self._fill_from
            young = since > self._now - hold_s + 1e-9
            fu, fj = np.nonzero(allowed | (self._rows_runnable & young[:, None]))
            order = np.lexsort((jobs[fu], since[fu]))
            return fu[order].tolist(), fj[order].tolist()

        def record(self, plan: RoundPlan, seconds: float) -> None:
            kept = self._c_x
            if self.allocation_integral and kept.shape[0] and not owed_meanwhile:
                self._c_x = np.where(self._young(self._c_unit), 0.0, kept)  # owed nothing while held
            try:
                super().record(plan, seconds)
            finally:
                self._c_x = kept

    return Leftover


def _integral_prior_mechanism(prior_s: float) -> type[RoundMechanism]:
    import numpy as np

    from costopt.gavel.mechanism import _MIN_RECEIVED_S, RoundMechanism

    class IntegralPrior(RoundMechanism):
        """The allocation integral's priority with a prior: ``(owed + x * round_s + x * prior_s) /
        (received + x * prior_s)``, as if each unit had received its allocation for ``prior_s`` before it
        arrived: a new unit's priority is ``1 + round_s / prior_s`` instead of unbounded, so a long job
        behind its allocation can outrank it."""

        def _priority(self, now_s: float) -> Any:
            cu, cj, cx = self._c_unit, self._c_type, self._c_x
            recv = self._u_recv[cu, cj] + cx * prior_s
            prio = (self._u_owed[cu, cj] + cx * (self.round_s + prior_s)) / np.maximum(recv, _MIN_RECEIVED_S)
            if self.hysteresis > 0:
                prio = np.where(self._held(), prio * (1.0 + self.hysteresis), prio)
            return prio

    return IntegralPrior


def _after_mechanism() -> type[RoundMechanism]:
    import numpy as np

    from costopt.gavel.mechanism import RoundMechanism

    class After(RoundMechanism):
        """The allocation integral's priority as it would be after the coming round if the unit ran:
        ``(owed + x * round_s) / (received + round_s)``: the unit that stays furthest behind even after
        running goes first (a new unit: ``x``, below an established unit at its part, about 1)."""

        def _priority(self, now_s: float) -> Any:
            cu, cj, cx = self._c_unit, self._c_type, self._c_x
            prio = (self._u_owed[cu, cj] + cx * self.round_s) / (self._u_recv[cu, cj] + self.round_s)
            if self.hysteresis > 0:
                prio = np.where(self._held(), prio * (1.0 + self.hysteresis), prio)
            return prio

    return After


def _type_fraction_mechanism() -> type[RoundMechanism]:
    import numpy as np

    from costopt.gavel.mechanism import _MIN_SHARE, RoundMechanism

    class TypeFraction(RoundMechanism):
        """costopt's mechanism with the reference's kind of share: the unit's (decayed) seconds on the type
        over every unit's on that type (its fraction of the type's time), not over its own age; within a
        type's queue that ranks by ``x / seconds received there`` whatever the job's age. ``prior_s``: each
        unit counts that many seconds at its allocated share as received (the reference seeds every job with
        half a round on each type at each reset)."""

        def _priority(self, now_s: float) -> Any:
            cu, cj, cx = self._c_unit, self._c_type, self._c_x
            recv = self._u_recv[cu, cj] + cx * self.prior_s
            live = np.frombuffer(bytes(self._gone), dtype=np.uint8)[self._u_members[cu, 0]] == 0
            total = np.bincount(cj[live], weights=recv[live], minlength=self.n_types)[cj]
            share = np.divide(recv, total, out=np.zeros_like(recv), where=total > 0)
            prio = cx / np.maximum(share, _MIN_SHARE)
            if self.hysteresis > 0:
                prio = np.where(self._held(), prio * (1.0 + self.hysteresis), prio)
            return prio

    return TypeFraction


def _central_solve_lp(
    c: npt.ArrayLike,
    a: Any,
    row_lower: npt.ArrayLike,
    row_upper: npt.ArrayLike,
    col_lower: npt.ArrayLike | None = None,
    col_upper: npt.ArrayLike | None = None,
    *,
    maximize: bool = False,
    what: str = "LP",
    warm: bool = True,
) -> LPSolution:
    """The LP by HiGHS's interior-point method without crossover (a central optimum, as ECOS)."""
    import numpy as np

    from costopt.gavel.lp import LPSolution, _arrays, _new_highs

    cost = np.asarray(c, dtype=np.float64)
    arr = _arrays(-cost if maximize else cost, a, row_lower, row_upper, col_lower, col_upper, what)
    h = _new_highs()  # the core class, configured as the project's (no banner on stdout)
    h.setOptionValue("solver", "ipm")
    h.setOptionValue("run_crossover", "off")
    h.passModel(arr.highs_lp())
    h.run()
    x = np.asarray(h.getSolution().col_value, dtype=np.float64)
    return LPSolution(x=x, objective=float(cost @ x))


def _patch_mechanism(mechanism: type[RoundMechanism]) -> None:
    """Make :func:`costopt.gavel.simulator.simulate_trace` build ``mechanism``, in this worker process only
    (one process per run)."""
    import costopt.gavel.simulator as simulator

    # a monkeypatch: the simulator instantiates the RoundMechanism it imported, a name it does not re-export
    simulator.RoundMechanism = mechanism  # type: ignore[attr-defined]


def _run(spec: dict[str, Any], trace_path: str, per_job: bool = False) -> dict[str, Any]:
    import costopt.gavel.policies.fairness as fairness
    import costopt.gavel.simulator as simulator
    from costopt.gavel.policies import get_policy
    from costopt.gavel.trace import read_trace
    from costopt.gavel.workload import load_workload
    from costopt.throughput import GAVEL_SIMULATION_FILE

    workload = load_workload(DATA / GAVEL_SIMULATION_FILE)
    with open(trace_path, encoding="utf-8") as f:
        trace = read_trace(f, workload, source=trace_path)
    kwargs: dict[str, Any] = {}
    variant, _, overhead = spec["variant"].partition("@")
    if overhead:
        kwargs["restart_overhead_s"] = float(overhead.rstrip("s"))
    parts = variant.split("+")
    variant = "+".join(p for p in parts if not p.startswith(("mem", "hyst", "prior", "hh")))
    if variant.startswith("costopt-default"):  # the core's rule as it is (mechanism_rule): nothing overridden
        pass
    else:  # rows without +mem / +hyst / +integral: shares since arrival, no hysteresis (the rule before issue 12's)
        kwargs["memory_s"], kwargs["hysteresis"], kwargs["allocation_integral"] = math.inf, 0.0, False
    for opt in (p for p in parts if p.startswith(("mem", "hyst", "prior", "hh"))):
        if opt.startswith("hh"):  # +hh<H>: a unit that ran on the type last round: priority x (1 + H)
            kwargs["hysteresis"] = float(opt[2:])
        elif opt.startswith("prior"):  # +prior<S>: as if each job had received its allocation for S seconds
            kwargs["prior_s"] = float(opt[5:])
        elif opt.startswith("mem"):  # +mem<S>: shares decayed with a memory of S seconds
            kwargs["memory_s"] = float(opt[3:])
        else:  # +hyst<K>: a unit that ran on the type last round: priority x (1 + K * overhead / round)
            kwargs["hysteresis"] = float(opt[4:]) * kwargs.get("restart_overhead_s", 0.0) / 360.0
    if variant.startswith("one-queue") or variant == "costopt-one-queue":
        kwargs["per_type_queues"] = False
    if "+integral" in variant or "+ratio-int" in variant:  # the core's allocation_integral
        kwargs["allocation_integral"] = True
    if "+ratio-int" in variant:  # as the experiment that preceded the core's option: fast-forward off
        kwargs["fast_forward"] = False
    if "no-ff" in variant:  # every round simulated (the fast-forward off)
        kwargs["fast_forward"] = False
    if "deficit-tie" in variant or "deficit-total-tie" in variant:  # patched in this worker process only
        _patch_mechanism(_deficit_tie_mechanism(total="deficit-total-tie" in variant))
    if "+iprior" in variant:  # patched in this worker process only
        _patch_mechanism(_integral_prior_mechanism(float(variant.split("+iprior")[1].split("+")[0])))
        kwargs["allocation_integral"] = True
    if "+after" in variant:  # patched in this worker process only
        _patch_mechanism(_after_mechanism())
        kwargs["allocation_integral"] = True
    if "+leftover" in variant:  # patched in this worker process only
        hold = float(variant.split("+leftover")[1].split("+")[0].removeprefix("-owed"))
        _patch_mechanism(_leftover_mechanism(hold, "+leftover-owed" in variant))
        kwargs["fast_forward"] = False  # who is held changes with time: rounds do not repeat
    if "type-frac" in variant:  # patched in this worker process only
        _patch_mechanism(_type_fraction_mechanism())
    if "fpt-" in variant or "+drr" in variant:
        global _THROUGHPUT
        _THROUGHPUT = workload.consolidated[trace.entry]
    if "+drr" in variant or "+diff" in variant:  # patched in this worker process only
        fill = variant.split("fpt-")[1].split("+")[0] if "fpt-" in variant else None
        _patch_mechanism(
            _deficit_mechanism(
                fill, current_x="+diff" in variant, normalized="+drr-norm" in variant, per_x="+drr-x" in variant
            )
        )
        kwargs["fast_forward"] = False
    elif "fpt-" in variant:  # patched in this worker process only
        _patch_mechanism(_fill_per_type_mechanism(variant.split("fpt-")[1].split("+")[0]))
        kwargs["fast_forward"] = False
    if "fill-per-type" in variant:  # patched in this worker process only
        _patch_mechanism(_fill_per_type_mechanism())
        kwargs["fast_forward"] = False
    if variant.startswith("reference-emulation"):  # patched in this worker process only
        reset_s = float(variant.split("+reset")[1].split("+")[0]) if "+reset" in variant else RESET_S
        _patch_mechanism(_reference_mechanism("one-queue" not in variant, reset_s))
        kwargs["fast_forward"] = False  # its skipped rounds assume the mechanism repeats the last one
    if variant == "reference-emulation" or "central-lp" in variant:
        # a monkeypatch of the name the fairness policy imported (and does not re-export), in this worker only
        fairness.solve_lp = _central_solve_lp  # type: ignore[attr-defined]
    if "resolve-1920s" in variant:
        kwargs["resolve_interval_s"] = RESET_S
    t0 = time.perf_counter()
    if spec.get("lp") == "single" or variant.startswith("reference-emulation"):
        # the max-min LP alone (the reference has no Pareto stage): the registry's aware LAS until 2026-12-04
        policy: Any = single_lp_las()
    else:
        policy = get_policy("max_min_fairness_perf")
    res = simulator.simulate_trace(policy, trace, workload, (36, 36, 36), window=WINDOW, seed=spec["seed"], **kwargs)
    out = res.as_dict(per_job=per_job)
    out["spec"] = spec
    out["runner_wall_s"] = time.perf_counter() - t0
    return out


def write_traces(seeds: list[int], folder: Path) -> dict[int, str]:
    """Each seed's trace, as ``costopt gavel simulate --rate 5 --seed S --dump-trace`` writes it."""
    from costopt.gavel.simulator import generated_trace
    from costopt.gavel.trace import write_trace
    from costopt.gavel.workload import load_workload
    from costopt.throughput import GAVEL_SIMULATION_FILE

    workload = load_workload(DATA / GAVEL_SIMULATION_FILE)
    paths = {}
    for seed in seeds:
        path = folder / f"trace_5jph_seed{seed}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            write_trace(generated_trace(workload, 5.0, seed, WINDOW), workload, f)
        paths[seed] = str(path)
    return paths


def jobs_table(a: str, b: str, seed: int, processes: int) -> str:
    """Job by job, variant ``a`` against ``b`` on one seed's trace: the sum of JCT differences (hours)
    by the job's duration on a V100 and by its V100 / K80 speedup (which jobs make up the difference)."""
    import numpy as np

    from costopt.gavel.workload import load_workload
    from costopt.throughput import GAVEL_SIMULATION_FILE

    workload = load_workload(DATA / GAVEL_SIMULATION_FILE)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_traces([seed], Path(tmp))[seed]
        with ProcessPoolExecutor(max_workers=processes, max_tasks_per_child=1) as pool:
            fa, fb = (pool.submit(_run, {"variant": v, "seed": seed}, path, True) for v in (a, b))
            ra, rb = fa.result(), fb.result()
    trace = generated_trace_for(seed)
    row = {int(i): k for k, i in enumerate(trace.job_id.tolist())}
    ids = [j["job_id"] for j in ra["jobs"]]
    rows = np.array([row[i] for i in ids])
    jct = [np.array([j["completion_s"] - j["arrival_s"] for j in r["jobs"]]) for r in (ra, rb)]
    diff = (jct[0] - jct[1]) / 3600
    cons = workload.consolidated[trace.entry[rows]]
    hours = trace.steps[rows] / cons[:, 0] / 3600
    speedup = cons[:, 0] / cons[:, 2]
    lines = [f"{a} vs {b}, seed {seed}: mean JCT {jct[0].mean() / 3600:.3f} h vs {jct[1].mean() / 3600:.3f} h"]
    lines.append("| jobs | n | sum of JCT differences | mean JCT a / b |")
    lines.append("|---|---|---|---|")
    bins = [("V100 duration", hours, (0, 1, 3, 10, np.inf)), ("V100/K80 speedup", speedup, (0, 2, 4, 7, np.inf))]
    for name, val, edges in bins:
        for lo, hi in itertools.pairwise(edges):
            m = (val >= lo) & (val < hi)
            if m.any():
                lines.append(
                    f"| {name} {lo}-{hi} | {int(m.sum())} | {diff[m].sum():+.1f} h | "
                    f"{jct[0][m].mean() / 3600:.2f} / {jct[1][m].mean() / 3600:.2f} h |"
                )
    return "\n".join(lines)


def generated_trace_for(seed: int) -> Any:
    """The trace of ``seed`` as :func:`write_traces` writes it."""
    from costopt.gavel.simulator import generated_trace
    from costopt.gavel.workload import load_workload
    from costopt.throughput import GAVEL_SIMULATION_FILE

    return generated_trace(load_workload(DATA / GAVEL_SIMULATION_FILE), 5.0, seed, WINDOW)


def _label(spec: dict[str, Any]) -> str:
    """The variant's name, marked when it ran the max-min LP alone (``"lp": "single"``: before 2026-12-04)."""
    return str(spec["variant"]) + (" [single LP]" if spec.get("lp") == "single" else "")


def table(rows: list[dict[str, Any]]) -> str:
    by: dict[tuple[str, int], float] = {(_label(r["spec"]), r["spec"]["seed"]): r["avg_jct_s"] / 3600 for r in rows}
    seeds = sorted({s for _, s in by})
    lines = [
        "| variant | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | vs emulation |",
        "|---" * (len(seeds) + 3) + "|",
    ]
    others = sorted({v for v, _ in by} - set(VARIANTS + ABLATIONS), key=lambda v: ("@" in v, v))
    for v in VARIANTS + ABLATIONS + tuple(others):
        ref_got = [
            by.get(("reference-emulation" + v[v.index("@") :] if "@" in v else "reference-emulation", s)) for s in seeds
        ]
        ref = [x for x in ref_got if x is not None]
        got = [by.get((v, s)) for s in seeds]
        vals = [x for x in got if x is not None]
        if len(vals) < len(got):
            continue
        mean = sum(vals) / len(vals)
        rel = (
            " / ".join(f"{(a / b - 1) * 100:+.1f}%" for a, b in zip(vals, ref, strict=True))
            if len(ref) == len(ref_got)
            else "-"
        )
        lines.append(f"| {v} | " + " | ".join(f"{x:.2f} h" for x in vals) + f" | {mean:.2f} h | {rel} |")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--ablations", action="store_true", help="also run the variants that isolate each mechanism")
    ap.add_argument("--variants", nargs="+", help="run these variants only (e.g. costopt+mem1920@30s)")
    ap.add_argument(
        "--jobs-table",
        nargs=2,
        metavar=("A", "B"),
        help="job by job: variant A against B on the first of --seeds (nothing appended to the results)",
    )
    args = ap.parse_args()
    if args.jobs_table:
        print(jobs_table(args.jobs_table[0], args.jobs_table[1], args.seeds[0], args.processes))
        raise SystemExit(0)
    done = {spec_key(r["spec"]) for r in load(OUT)}
    variants = tuple(args.variants) if args.variants else VARIANTS + (ABLATIONS if args.ablations else ())
    specs = [{"variant": v, "seed": s} for s in args.seeds for v in variants]
    todo = [s for s in specs if spec_key(s) not in done]
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_traces(sorted({s["seed"] for s in todo}), Path(tmp)) if todo else {}
        # one process per run: the emulation patches the simulator's module in its process
        with ProcessPoolExecutor(max_workers=args.processes, max_tasks_per_child=1) as pool:
            futures = [pool.submit(_run, s, paths[s["seed"]]) for s in todo]
            for fut in as_completed(futures):
                r = fut.result()
                with OUT.open("a") as f:
                    f.write(json.dumps(r) + "\n")
                print(
                    f"  {r['spec']} -> avg JCT {r['avg_jct_s'] / 3600:.3f} h, wall {r['runner_wall_s']:.0f} s",
                    flush=True,
                )
    print(table([r for r in load(OUT) if r["spec"]["seed"] in args.seeds]))
