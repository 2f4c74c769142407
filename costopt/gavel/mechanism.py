"""The round-based mechanism: turns an allocation (time fractions) into which jobs run on which GPUs
in the next round.

* A **unit** is a job alone or a co-located pair. Its priority on a worker type is the share the
  allocation gives it there over the share it has received so far there (seconds run on that type
  over seconds since it arrived); a unit that has received nothing yet comes first. With
  ``memory_s``, both counts weigh a second ``t`` seconds ago by ``exp(-t / memory_s)``: what a job
  received under allocations long gone fades instead of ruling its priority for the rest of its life
  (Gavel's reference implementation forgets by resetting its counters every 1920 s). With
  ``hysteresis`` ``h``, a unit that ran on a type last round has its priority there multiplied by
  ``1 + h``: it keeps its GPUs unless a challenger's priority is clearly higher. ``prior_s`` counts each
  unit as having received its allocation for that long before it arrived (measured without effect; off
  by default). With ``allocation_integral``, the numerator is not the current allocation times the
  unit's (decayed) age but what the allocations in force gave it: priority = (the integral of its
  allocation there over the rounds recorded since it arrived, plus the coming round's ``x * round_s``) /
  (seconds it ran there), both decayed alike with ``memory_s``. The share rule assumes the current
  allocation held since arrival; this one charges a job only what it was owed when it ran (issue 12).
  The simulator and live fleets set these by :func:`mechanism_rule`: for heterogeneity-aware policies
  the allocation integral since arrival (no memory) and ``h`` from the restart cost (0 when moves are
  free); live fleets rebuild the state each round with :meth:`RoundMechanism.resume` from what they
  store per job (seconds received and owed per type).
* Units are taken greedily in priority order (ties: larger allocation, earlier arrival, lower id): a
  unit is placed if none of its jobs runs yet this round and the type has ``scale_factor`` free GPUs.
  With ``type_order`` (one queue per worker type, as Gavel's reference implementation runs its
  heterogeneity-aware policies), the types are filled one after the other, fastest first
  (:func:`fastest_first`), each from its own candidates in priority order: a job due on both a fast and
  a slow type runs on the fast one. Without it, one queue holds every (unit, type) candidate, and a
  job's highest priority wins whatever its type. With ``fill_idle``, GPUs still free then go to units
  the allocation gives nothing on that type (earliest arrival first), so no GPU idles while a job
  could use it.
* Placement: a unit that ran last round on the same type keeps its GPUs; new multi-GPU units are
  placed largest first on the fullest server that fits them whole (consolidated), else spread over
  the emptiest servers; new single-GPU units fill the fullest servers first, keeping large holes for
  multi-GPU jobs.
* A job **moves** (restarts from its checkpoint) when it runs in a round but not on the same GPUs,
  alone or with the same partner, as in the previous round; its first start is not a move.

Job indices are global (e.g. trace rows); the caller says which jobs each allocation covers.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from costopt.gavel.errors import InvalidState
from costopt.gavel.state import FloatArray, IntArray

log = logging.getLogger(__name__)

BoolArray = npt.NDArray[np.bool_]
DEFAULT_ROUND_S = 360.0
_MIN_SHARE = 1e-9  # a share received below this counts as nothing received
_MIN_RECEIVED_S = 1e-9  # with allocation_integral: seconds received below this count as nothing received
AWARE_HYSTERESIS_PER_RESTART = 6.0
"""A unit that ran on a type last round keeps it unless outranked by the factor
``1 + AWARE_HYSTERESIS_PER_RESTART * restart_overhead_s / round_s`` (1 when moves are free)."""


@dataclass(frozen=True, slots=True)
class MechanismRule:
    """How a :class:`RoundMechanism` ranks units: ``per_type_queues`` (serve one queue per worker type,
    fastest first), ``memory_s`` (None: counts since arrival), ``hysteresis`` (>= 0) and
    ``allocation_integral`` (priorities from the allocations in force, not the current one times the age)."""

    per_type_queues: bool
    memory_s: float | None
    hysteresis: float
    allocation_integral: bool = False


def mechanism_rule(per_type_queues: bool, restart_overhead_s: float, round_s: float) -> MechanismRule:
    """The rule the simulator and live fleets give a policy: with per-type queues (heterogeneity-aware
    policies), priorities from the allocation integral since arrival (no memory) and a hysteresis of
    :data:`AWARE_HYSTERESIS_PER_RESTART` x ``restart_overhead_s / round_s`` (seconds lost per move over
    the round's length); else shares since arrival and no hysteresis (docs/gavel.md, issue 12: the
    integral replaced a 7200-s memory on 2026-12-04, better on every compared trace)."""
    if not round_s > 0 or not restart_overhead_s >= 0:
        raise InvalidState("need round_s > 0 and restart_overhead_s >= 0 seconds")
    if not per_type_queues:
        return MechanismRule(False, None, 0.0, False)
    return MechanismRule(True, None, AWARE_HYSTERESIS_PER_RESTART * restart_overhead_s / round_s, True)


def fastest_first(throughput: FloatArray) -> tuple[int, ...]:
    """Worker types from the fastest to the slowest for the jobs of ``throughput`` (jobs x types,
    steps/s): by the mean over jobs of a job's throughput on the type over its best one (jobs that
    run nowhere are ignored; ties: lower index first)."""
    t = np.asarray(throughput, dtype=np.float64)
    best = t.max(axis=1) if t.size else np.zeros(0)
    rows = best > 0
    score = (t[rows] / best[rows, None]).mean(axis=0) if rows.any() else np.zeros(t.shape[1])
    return tuple(int(j) for j in np.argsort(-score, kind="stable"))


@dataclass(frozen=True, slots=True, eq=False)
class RoundPlan:
    """The units that run in one round. ``members[u] = (job, partner or -1)``; ``wtype[u]`` its
    worker type; ``gpus[u]`` the GPUs it holds; ``consolidated[u]``: all of them in one server;
    ``moved[u, k]``: member ``k`` restarts from a checkpoint this round."""

    members: IntArray
    wtype: IntArray
    gpus: IntArray
    consolidated: BoolArray
    moved: BoolArray

    @property
    def n_units(self) -> int:
        return int(self.members.shape[0])


class RoundMechanism:
    """Round-by-round realization of allocations for jobs ``0 .. n_jobs - 1``.

    Call :meth:`set_allocation` whenever the policy re-solves, then per round :meth:`plan` and
    :meth:`record`. One instance per cluster; not thread-safe. ``type_order``: worker types in the
    order their queues are served (fastest first, see :func:`fastest_first`); ``None``: one queue.
    ``memory_s`` (None or inf: since arrival), ``hysteresis`` (>= 0), ``prior_s`` (>= 0, the share rule
    only) and ``allocation_integral`` (with ``round_s``, the length of the coming round it counts): see the
    module docstring. :attr:`received` always holds the undecayed seconds run alone per type.
    """

    def __init__(
        self,
        capacity: Sequence[int],
        gpus_per_server: Sequence[int],
        n_jobs: int,
        *,
        fill_idle: bool = True,
        type_order: Sequence[int] | None = None,
        memory_s: float | None = None,
        hysteresis: float = 0.0,
        prior_s: float = 0.0,
        allocation_integral: bool = False,
        round_s: float = DEFAULT_ROUND_S,
    ) -> None:
        if not round_s > 0:
            raise InvalidState("round_s must be > 0 seconds")
        if memory_s is not None and not memory_s > 0:
            raise InvalidState("memory_s must be > 0 seconds (None or inf: remember since arrival)")
        if memory_s is not None and math.isinf(memory_s):
            memory_s = None
        if not prior_s >= 0:
            raise InvalidState("prior_s must be >= 0")
        if not hysteresis >= 0:
            raise InvalidState("hysteresis must be >= 0")
        if len(capacity) != len(gpus_per_server) or min(gpus_per_server, default=1) < 1 or min(capacity) < 0:
            raise InvalidState("need GPU counts >= 0 and a GPUs-per-server count >= 1 per worker type")
        self.capacity = [int(c) for c in capacity]
        self.per_server = [int(g) for g in gpus_per_server]
        self.n_types = len(self.capacity)
        self.fill_idle = fill_idle
        self._type_pos: IntArray | None = None  # queue position of each type (None: one queue)
        if type_order is not None:
            if sorted(int(j) for j in type_order) != list(range(self.n_types)):
                raise InvalidState(f"type_order must list each of the {self.n_types} worker types once")
            self._type_pos = np.argsort(np.array(type_order, dtype=np.int64)).astype(np.int64)
        self._n = n_jobs
        self.received = np.zeros((n_jobs, self.n_types))  # seconds run alone per type
        self.memory_s = memory_s
        self.hysteresis = float(hysteresis)
        self.prior_s = float(prior_s)
        self.allocation_integral = bool(allocation_integral)
        self.round_s = float(round_s)
        # with allocation_integral: seconds of allocation in force per job (alone) and type, decayed as _recent
        self._owed = np.zeros((n_jobs if allocation_integral else 0, self.n_types))
        # with memory_s: seconds run alone per type, each second weighted exp(-its age / memory_s)
        self._recent = np.zeros((n_jobs, self.n_types)) if memory_s is not None else self.received
        self._decayed_at = 0.0  # the time self._recent and self._u_recv were last decayed to
        self.ever_ran = np.zeros(n_jobs, dtype=bool)
        self._gone = bytearray(n_jobs)
        self._last_type = np.full(n_jobs, -1, dtype=np.int64)  # type of the job's unit last round
        self._last_partner = np.full(n_jobs, -2, dtype=np.int64)  # its partner (-1 alone, -2 did not run)
        self._last_consolidated = np.zeros(n_jobs, dtype=bool)
        self._last_jobs = np.zeros(0, dtype=np.int64)
        # per type: job id (first member of the unit) holding each GPU slot, -1 = free
        self._owner: list[IntArray | None] = [None] * self.n_types
        self._pair_keys = np.zeros(0, dtype=np.int64)  # sorted lo * n_jobs + hi
        self._pair_recv = np.zeros((0, self.n_types))
        self._u_members = np.zeros((0, 2), dtype=np.int64)
        self._u_sf = np.zeros(0, dtype=np.int64)
        self._u_since = np.zeros(0)
        self._u_recv = np.zeros((0, self.n_types))
        self._u_owed = np.zeros((0, self.n_types))  # per unit, as _u_recv (allocation_integral only)
        self._pair_owed = np.zeros((0, self.n_types))
        self._c_unit = np.zeros(0, dtype=np.int64)
        self._c_type = np.zeros(0, dtype=np.int64)
        self._c_x = np.zeros(0)
        self._c_rank = np.zeros(0, dtype=np.int64)
        self._f_unit: list[int] | None = None
        self._f_type: list[int] = []
        self._n_units_jobs = 0  # jobs named by the allocation (an upper bound on units per round)
        self._fill_from: tuple[IntArray, BoolArray, FloatArray] = (
            np.zeros(0, dtype=np.int64),
            np.zeros((0, self.n_types), dtype=bool),
            np.zeros(0),
        )
        self._sf_list: list[int] = []
        self._a_list: list[int] = []
        self._b_list: list[int] = []
        self._pending: tuple[IntArray, IntArray] = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    def resume(
        self,
        received: FloatArray,
        ever_ran: BoolArray,
        *,
        now_s: float,
        recent: FloatArray | None = None,
        last_type: IntArray | None = None,
        owed: FloatArray | None = None,
    ) -> None:
        """Start from a stored history instead of recorded rounds (live fleets rebuild the mechanism at
        every boundary). ``received``: seconds each job ran alone per type (jobs x types); ``recent``: the
        same with a second run ``t`` seconds before ``now_s`` weighted ``exp(-t / memory_s)`` (required with
        ``memory_s``, ignored without); ``last_type``: the type each job ran on alone last round (-1: it did
        not run), which the hysteresis and sticky placement use; ``owed``: with ``allocation_integral``
        (required then), the seconds of allocation each job had in force per type, decayed as ``recent``.
        Call before :meth:`set_allocation`."""
        shape = (self._n, self.n_types)
        if np.shape(received) != shape or any(a is not None and np.shape(a) != shape for a in (recent, owed)):
            raise InvalidState(f"received seconds must be {self._n} jobs x {self.n_types} worker types")
        if self.allocation_integral:
            if owed is None:
                raise InvalidState("a mechanism with allocation_integral needs the seconds owed (owed) to resume")
            self._owed[:] = owed
        self.received[:] = received
        self.ever_ran[:] = ever_ran
        if self.memory_s is not None:
            if recent is None:
                raise InvalidState("a mechanism with memory_s needs the decayed seconds (recent) to resume")
            self._recent[:] = recent
            self._decayed_at = float(now_s)
        if last_type is not None:
            lt = np.asarray(last_type, dtype=np.int64)
            ran = np.nonzero(lt >= 0)[0]
            self._last_type[:] = -1
            self._last_partner[:] = -2
            self._last_type[ran] = lt[ran]
            self._last_partner[ran] = -1
            self._last_consolidated[ran] = True
            self._last_jobs = ran.astype(np.int64)

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
        """The allocation now in force. ``jobs``: global indices of its rows; ``pairs``: row indices
        into ``jobs``; ``runnable``: (rows x types) where each job can run; ``since_s``: when each job
        arrived."""
        n = jobs.shape[0]
        if x.shape != (n, self.n_types) or runnable.shape != x.shape:
            raise InvalidState("allocation rows must match the jobs and the mechanism's worker types")
        # pairs keep what they received while they stay in the allocation
        old_pairs = self._u_members[:, 1] >= 0
        if old_pairs.any():
            okey = self._u_members[old_pairs, 0] * self._n + self._u_members[old_pairs, 1]
            order = np.argsort(okey)
            self._pair_keys, self._pair_recv = okey[order], self._u_recv[old_pairs][order]
            if self.allocation_integral:
                self._pair_owed = self._u_owed[old_pairs][order]
        else:
            self._pair_keys, self._pair_recv = np.zeros(0, dtype=np.int64), np.zeros((0, self.n_types))
            self._pair_owed = np.zeros((0, self.n_types))
        keep = pair_x.sum(axis=1) > 0
        pairs, pair_x = pairs[keep], pair_x[keep]
        ga, gb = jobs[pairs[:, 0]], jobs[pairs[:, 1]]
        lo, hi = np.minimum(ga, gb), np.maximum(ga, gb)
        self._u_members = np.concatenate([np.stack([jobs, np.full(n, -1)], axis=1), np.stack([lo, hi], axis=1)]).astype(
            np.int64
        )
        self._u_sf = np.concatenate([scale_factor, scale_factor[pairs[:, 0]]]).astype(np.int64)
        self._sf_list = self._u_sf.tolist()
        self._a_list = self._u_members[:, 0].tolist()
        self._b_list = self._u_members[:, 1].tolist()
        self._u_since = np.concatenate([since_s, np.maximum(since_s[pairs[:, 0]], since_s[pairs[:, 1]])])
        precv = np.zeros((lo.shape[0], self.n_types))
        powed = np.zeros((lo.shape[0], self.n_types))
        if lo.shape[0] and self._pair_keys.shape[0]:
            key = lo * self._n + hi
            pos = np.minimum(np.searchsorted(self._pair_keys, key), self._pair_keys.shape[0] - 1)
            found = self._pair_keys[pos] == key
            precv[found] = self._pair_recv[pos[found]]
            if self.allocation_integral:
                powed[found] = self._pair_owed[pos[found]]
        self._u_recv = np.concatenate([self._recent[jobs], precv])
        if self.allocation_integral:
            self._u_owed = np.concatenate([self._owed[jobs], powed])
        ux = np.concatenate([x, pair_x])
        cu, cj = np.nonzero(ux > 0)
        cx = ux[cu, cj]
        # ties after priority: larger allocation, earlier arrival, lower job id (fixed until the next solve)
        tie = np.lexsort((self._u_members[cu, 0], self._u_since[cu], -cx))
        rank = np.empty(cu.shape[0], dtype=np.int64)
        rank[tie] = np.arange(cu.shape[0])
        self._c_unit, self._c_type, self._c_x, self._c_rank = cu.astype(np.int64), cj.astype(np.int64), cx, rank
        self._fill_from = (jobs, runnable & (x <= 0), since_s)  # idle-filling candidates, built on demand
        self._n_units_jobs = n
        self._f_unit = None

    def plan(self, now_s: float) -> RoundPlan:
        """The units to run in the round starting at ``now_s``, placed on GPUs."""
        free = list(self.capacity)
        busy = bytearray(self._gone)  # finished jobs never run again, whatever the allocation says
        units: list[int] = []
        types: list[int] = []
        if self.memory_s is not None:
            self._decay_to(now_s)
        cand_u, cand_j = self._queue(now_s)
        if cand_u:
            self._greedy(cand_u, cand_j, free, busy, units, types)
        if self.fill_idle and sum(free) > 0 and len(units) < self._n_units_jobs:
            fu, fj = self._fill_candidates()
            if fu:
                self._greedy(fu, fj, free, busy, units, types)
        return self._place(np.array(units, dtype=np.int64), np.array(types, dtype=np.int64))

    def _queue(self, now_s: float) -> tuple[list[int], list[int]]:
        """The allocation's (unit, type) candidates in the order :meth:`plan` serves them (shares decayed to
        ``now_s`` already): by :meth:`_priority`, one queue per type in type order if there are several."""
        if not self._c_unit.shape[0]:
            return [], []
        cu, cj = self._c_unit, self._c_type
        prio = self._priority(now_s)
        if self._type_pos is None:
            order = np.lexsort((self._c_rank, -prio))
        else:  # one queue per type, served in type order
            order = np.lexsort((self._c_rank, -prio, self._type_pos[cj]))
        return cu[order].tolist(), cj[order].tolist()

    def _priority(self, now_s: float) -> FloatArray:
        """Each candidate's priority (module docstring): the share rule or the allocation integral, with
        the hysteresis bonus of a unit that ran on the type last round."""
        cu, cj, cx = self._c_unit, self._c_type, self._c_x
        recv = self._u_recv[cu, cj]
        if self.allocation_integral:  # what the allocations in force gave it, the coming round included
            prio = (self._u_owed[cu, cj] + cx * self.round_s) / np.maximum(recv, _MIN_RECEIVED_S)
        else:
            age = np.maximum(now_s - self._u_since[cu], 0.0)
            if self.memory_s is not None:
                age = -self.memory_s * np.expm1(-age / self.memory_s)  # the same weights over its lifetime
            if self.prior_s > 0:  # as if each unit had received its allocation for prior_s before arriving
                recv, age = recv + cx * self.prior_s, age + self.prior_s
            share = np.divide(recv, age, out=np.zeros_like(age), where=age > 0)
            prio = cx / np.maximum(share, _MIN_SHARE)
        if self.hysteresis > 0:  # a unit that ran on the type last round holds it unless clearly outranked
            prio = np.where(self._held(), prio * (1.0 + self.hysteresis), prio)
        return prio

    def _held(self) -> BoolArray:
        """Per candidate: its unit ran on the candidate's type last round (same jobs together)."""
        a, b = self._u_members[self._c_unit, 0], self._u_members[self._c_unit, 1]
        return (self._last_type[a] == self._c_type) & (self._last_partner[a] == b)  # type: ignore[no-any-return]

    def _decay_to(self, now_s: float) -> None:
        """Age the decayed shares from the last decay to ``now_s`` (never backwards)."""
        assert self.memory_s is not None
        dt = now_s - self._decayed_at
        if dt > 0:
            f = float(np.exp(-dt / self.memory_s))
            self._recent *= f
            self._u_recv *= f
            if self.allocation_integral:
                self._owed *= f
                self._u_owed *= f
            self._decayed_at = now_s

    def forget(self, jobs: IntArray) -> None:
        """Jobs that finished (or left): never planned again, even under an allocation naming them."""
        for j in np.asarray(jobs, dtype=np.int64).tolist():
            self._gone[j] = 1

    def _fill_candidates(self) -> tuple[list[int], list[int]]:
        """(unit, type) pairs the allocation gives nothing, earliest arrival first."""
        if self._f_unit is None:
            jobs, allowed, since = self._fill_from
            fu, fj = np.nonzero(allowed)
            order = np.lexsort((jobs[fu], since[fu]))
            self._f_unit, self._f_type = fu[order].tolist(), fj[order].tolist()
        return self._f_unit, self._f_type

    def _greedy(
        self, cand_u: list[int], cand_j: list[int], free: list[int], busy: bytearray, units: list[int], types: list[int]
    ) -> None:
        """Candidates in order: a unit is taken if its jobs are idle and its type has room. Plain
        Python lists: a round takes about a hundred units, and numpy's per-call cost would dominate."""
        sf_of, a_of, b_of = self._sf_list, self._a_list, self._b_list
        left = sum(free)
        for u, j in zip(cand_u, cand_j, strict=True):
            if left <= 0:
                return
            sf = sf_of[u]
            if free[j] < sf:
                continue
            a = a_of[u]
            if busy[a]:
                continue
            b = b_of[u]
            if b >= 0:
                if busy[b]:
                    continue
                busy[b] = 1
            busy[a] = 1
            units.append(u)
            types.append(j)
            free[j] -= sf
            left -= sf

    def _place(self, units: IntArray, types: IntArray) -> RoundPlan:
        k = units.shape[0]
        members = self._u_members[units] if k else np.zeros((0, 2), dtype=np.int64)
        a, b = members[:, 0], members[:, 1]
        sf = self._u_sf[units] if k else np.zeros(0, dtype=np.int64)
        sticky = (self._last_type[a] == types) & (self._last_partner[a] == b)
        consolidated = np.where(sticky, self._last_consolidated[a], sf == 1)
        multi = sf > 1
        for j in np.unique(types[multi]).tolist():
            self._place_on(j, types == j, a, sf, sticky, consolidated)
        for j in range(self.n_types):  # slots are tracked only while a type holds multi-GPU units
            if not (multi & (types == j)).any():
                self._owner[j] = None
        moved = np.zeros((k, 2), dtype=bool)
        moved[:, 0] = self.ever_ran[a] & ~sticky
        paired = b >= 0
        moved[paired, 1] = self.ever_ran[b[paired]] & ~sticky[paired]
        # remember this round
        self._last_type[self._last_jobs] = -1
        self._last_partner[self._last_jobs] = -2
        self._last_type[a] = types
        self._last_partner[a] = b
        self._last_consolidated[a] = consolidated
        bp = b[paired]
        self._last_type[bp] = types[paired]
        self._last_partner[bp] = a[paired]
        self._last_consolidated[bp] = consolidated[paired]
        self._last_jobs = np.concatenate([a, bp])
        self._pending = (units, types)
        return RoundPlan(members=members, wtype=types, gpus=sf, consolidated=consolidated, moved=moved)

    def _place_on(
        self, j: int, on_j: BoolArray, a: IntArray, sf: IntArray, sticky: BoolArray, consolidated: BoolArray
    ) -> None:
        """GPU slots of type ``j``: sticky units keep theirs, new multi-GPU units go largest first to
        the fullest server that fits them (else spread), new single-GPU units fill the fullest servers.
        Slots of a type that held only single-GPU units last round were not tracked: its sticky units
        are laid out anew (any layout is a valid history of units that did not move)."""
        per = self.per_server[j]
        cap = self.capacity[j]
        server_of = np.arange(cap) // per
        n_servers = (cap + per - 1) // per
        old = self._owner[j]
        owner = np.full(cap, -1, dtype=np.int64)
        keep = on_j & sticky
        if old is not None:
            keeps = np.zeros(self._n + 1, dtype=bool)  # index -1 (a free slot) lands on the extra entry
            keeps[a[keep]] = True
            owner = np.where(keeps[old], old, -1)
            place = on_j & ~sticky
        else:
            place = on_j.copy()  # untracked: lay everything out, keeping sticky units' consolidation
        for i in np.nonzero(place & (sf > 1))[0][np.argsort(-sf[place & (sf > 1)], kind="stable")].tolist():
            free_slots = np.nonzero(owner < 0)[0]
            free_per = np.bincount(server_of[free_slots], minlength=n_servers)
            need = int(sf[i])
            fits = np.nonzero(free_per >= need)[0]
            if fits.size:
                srv = int(fits[np.argmin(free_per[fits])])
                take = free_slots[server_of[free_slots] == srv][:need]
            else:
                rank = np.argsort(-free_per[server_of[free_slots]], kind="stable")
                take = free_slots[rank][:need]
            if not keep[i]:
                consolidated[i] = np.unique(server_of[take]).size == 1
            owner[take] = a[i]
        singles = np.nonzero(place & (sf == 1))[0]
        if singles.size:
            free_slots = np.nonzero(owner < 0)[0]
            free_per = np.bincount(server_of[free_slots], minlength=n_servers)
            rank = np.lexsort((free_slots, free_per[server_of[free_slots]]))
            owner[free_slots[rank][: singles.size]] = a[singles]
        self._owner[j] = owner

    def record(self, plan: RoundPlan, seconds: float) -> None:
        """Credit ``seconds`` of running to every unit of ``plan`` (the last planned round); with
        ``allocation_integral``, also ``seconds`` of the allocation in force to every unit it names whose
        jobs have not finished (:meth:`forget`)."""
        units, wtype = self._pending
        if self.allocation_integral and self._c_unit.shape[0]:
            cu, cj = self._c_unit, self._c_type
            gone = np.frombuffer(bytes(self._gone), dtype=np.uint8).astype(bool)
            a, b = self._u_members[cu, 0], self._u_members[cu, 1]
            live = ~gone[a] & ((b < 0) | ~gone[np.maximum(b, 0)])
            self._u_owed[cu[live], cj[live]] += self._c_x[live] * seconds
            alone = live & (b < 0)
            self._owed[a[alone], cj[alone]] += self._c_x[alone] * seconds
        if plan.n_units == 0:
            return
        self._u_recv[units, wtype] += seconds
        single = plan.members[:, 1] < 0
        self.received[plan.members[single, 0], wtype[single]] += seconds
        if self.memory_s is not None:
            self._recent[plan.members[single, 0], wtype[single]] += seconds
        self.ever_ran[plan.members[:, 0]] = True
        self.ever_ran[plan.members[~single, 1]] = True
