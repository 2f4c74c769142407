"""The LP skeleton every allocation policy shares, built vectorized as sparse matrices.

Jobs are grouped into **classes** of interchangeable jobs (one job per class in the per-job
formulation). A **column** is one way to use GPUs: a class running alone on a worker type, a class
running with a fixed capacity-proportional mix of types (heterogeneity-agnostic), or two classes
co-located on a type (space sharing). Its variable ``Y`` is the *total* time fraction over all jobs of
the class (or class pair), so with ``n_a`` jobs in class ``a``:

* time:     ``sum_v time[a, v] Y_v <= n_a``       (each job runs at most all of the time)
* capacity: ``sum_v gpus[j, v] Y_v <= capacity_j``
* a job of class ``a`` averages ``sum_v tput[a, v] Y_v / n_a`` steps/s.

Merging is exact for policies whose constraints and objective are symmetric in the jobs of a class
(max-min fairness, max sum throughput): averaging an optimal per-job allocation over the
permutations of each class keeps it feasible and optimal, and a class-level solution is split back
to jobs evenly (:func:`expand`), pairs of classes through a transport plan with at most
``n_a + n_b - 1`` job pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from costopt.gavel.lp import Triplets, assemble
from costopt.gavel.state import ClusterState, FloatArray, IntArray

MIN_FRACTION = 1e-9
"""Time fractions below this are solver noise and dropped when splitting back to jobs."""


@dataclass(frozen=True, slots=True, eq=False)
class Classes:
    """Jobs grouped into classes: ``of_job[i]`` is job row ``i``'s class; ``members[start[k]:start[k+1]]``
    are class ``k``'s job rows (ascending); ``rep[k]`` is one of them."""

    of_job: IntArray
    count: IntArray
    rep: IntArray
    members: IntArray
    start: IntArray

    @property
    def n(self) -> int:
        return int(self.count.shape[0])


def singleton_classes(n: int) -> Classes:
    """One class per job (the per-job formulation)."""
    idx = np.arange(n, dtype=np.int64)
    return Classes(
        of_job=idx, count=np.ones(n, dtype=np.int64), rep=idx, members=idx, start=np.arange(n + 1, dtype=np.int64)
    )


def classes_by_key(key: FloatArray) -> Classes:
    """Jobs with identical rows of ``key`` (n x d) form one class; classes ordered by key."""
    n = key.shape[0]
    if n == 0:
        return singleton_classes(0)
    rows = np.ascontiguousarray(key, dtype=np.float64)
    rows = rows + 0.0  # -0.0 and 0.0 must compare equal byte-wise
    return _classes_by_codes(rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel())


def _classes_by_codes(codes: npt.NDArray[Any]) -> Classes:
    """Jobs with equal ``codes`` form one class; classes ordered by code."""
    _, rep, inverse, count = np.unique(codes, return_index=True, return_inverse=True, return_counts=True)
    of_job = inverse.reshape(-1).astype(np.int64)
    members = np.argsort(of_job, kind="stable").astype(np.int64)
    start = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    return Classes(of_job=of_job, count=count.astype(np.int64), rep=rep.astype(np.int64), members=members, start=start)


def interchangeable_classes(state: ClusterState, weight: FloatArray | None = None) -> Classes:
    """Classes of jobs with equal throughputs, scale factor, weight (``weight`` overrides the state's)
    and, under space sharing, job type: exactly the jobs max-min fairness cannot tell apart.

    Fast path: when every job has a job type, group by (job type, scale factor, weight) and keep the
    grouping if the throughput rows agree within each group (else group by the rows themselves)."""
    w = state.weight if weight is None else weight
    n = state.n_jobs
    if n and state.job_type.min() >= 0:
        if w.min() == w.max():
            w_code = np.zeros(n, dtype=np.int64)
        else:
            _, w_code = np.unique(w, return_inverse=True)
        sf = state.scale_factor
        codes = (state.job_type * (int(sf.max()) + 1) + sf) * (int(w_code.max()) + 1) + w_code.reshape(-1)
        classes = _classes_by_codes(codes.astype(np.int64))
        if np.array_equal(state.throughput, state.throughput[classes.rep[classes.of_job]]):
            return classes
    cols = [state.throughput, state.scale_factor[:, None].astype(np.float64), w[:, None]]
    if state.space_sharing:
        cols.append(state.job_type[:, None].astype(np.float64))
    return classes_by_key(np.hstack(cols))


@dataclass(frozen=True, slots=True, eq=False)
class Columns:
    """LP columns. ``a``/``b``: member classes (``b == -1``: alone; ``a == b``: two jobs of one class);
    ``wtype``: worker type (-1 for a mixed column, whose per-type time split is ``mix``);
    ``tput_a``/``tput_b``: steps/s of each member while the column runs; ``gpus``: GPUs it holds."""

    a: IntArray
    b: IntArray
    wtype: IntArray
    tput_a: FloatArray
    tput_b: FloatArray
    gpus: FloatArray
    mix: FloatArray  # (V, J); one-hot of wtype for typed columns

    @property
    def n(self) -> int:
        return int(self.a.shape[0])


def _columns(
    a: IntArray,
    b: IntArray,
    wtype: IntArray,
    ta: FloatArray,
    tb: FloatArray,
    gpus: FloatArray,
    n_types: int,
    mix: FloatArray | None = None,
) -> Columns:
    if mix is None:
        mix = np.zeros((a.shape[0], n_types))
        mix[np.arange(a.shape[0]), wtype] = 1.0
    return Columns(
        a=a.astype(np.int64),
        b=b.astype(np.int64),
        wtype=wtype.astype(np.int64),
        tput_a=ta.astype(np.float64),
        tput_b=tb.astype(np.float64),
        gpus=gpus.astype(np.float64),
        mix=mix,
    )


def single_columns(state: ClusterState, classes: Classes) -> Columns:
    """A column per (class, type) where the class can run (see :func:`runnable`)."""
    t = state.throughput[classes.rep]
    a, j = np.nonzero(runnable(state)[classes.rep])
    sf = state.scale_factor[classes.rep][a].astype(np.float64)
    return _columns(a, np.full(a.shape, -1), j, t[a, j], np.zeros(a.shape), sf, state.n_types)


def runnable(state: ClusterState) -> npt.NDArray[np.bool_]:
    """See :meth:`ClusterState.runnable`."""
    return state.runnable()


def agnostic_mix(state: ClusterState) -> FloatArray:
    """(jobs x types) type mix of a heterogeneity-agnostic scheduler: time spread over the types a job
    can run on, in proportion to their capacity (rows sum to 1; 0 for a job that runs nowhere)."""
    feasible = runnable(state) * state.capacity[None, :]
    tot = feasible.sum(axis=1, keepdims=True)
    out: FloatArray = np.divide(feasible, tot, out=np.zeros_like(feasible), where=tot > 0)
    return out


def mixed_columns(state: ClusterState, classes: Classes) -> Columns:
    """One column per class that runs with the fixed agnostic type mix (throughput = mix-weighted)."""
    mix = agnostic_mix(state)[classes.rep]
    tbar = (mix * state.throughput[classes.rep]).sum(axis=1)
    a = np.nonzero(tbar > 0)[0]
    sf = state.scale_factor[classes.rep][a].astype(np.float64)
    return _columns(
        a, np.full(a.shape, -1), np.full(a.shape, -1), tbar[a], np.zeros(a.shape), sf, state.n_types, mix=mix[a]
    )


def pair_columns(state: ClusterState, classes: Classes) -> Columns:
    """A column per (class pair, type) that can space-share: equal scale factors, both co-located
    throughputs > 0, and two distinct jobs (a class pairs with itself only if it has >= 2 jobs)."""
    pt = state.pair_throughput
    if pt is None or classes.n == 0:
        return _columns(*(np.zeros(0, dtype=np.int64),) * 3, *(np.zeros(0),) * 3, state.n_types)
    jt = state.job_type[classes.rep]
    sf = state.scale_factor[classes.rep]
    ia, ib = np.triu_indices(classes.n)
    ok = (sf[ia] == sf[ib]) & ((ia != ib) | (classes.count[ia] >= 2))
    ia, ib = ia[ok], ib[ok]
    ta = pt[jt[ia], jt[ib]]  # (P, J): steps/s of a next to b
    tb = pt[jt[ib], jt[ia]]
    p, j = np.nonzero((ta > 0) & (tb > 0) & (state.capacity[None, :] >= sf[ia][:, None]))
    return _columns(ia[p], ib[p], j, ta[p, j], tb[p, j], sf[ia[p]].astype(np.float64), state.n_types)


def concat(*parts: Columns) -> Columns:
    return Columns(
        *(
            np.concatenate([getattr(p, f) for p in parts])
            for f in ("a", "b", "wtype", "tput_a", "tput_b", "gpus", "mix")
        )
    )


def columns_for(state: ClusterState, classes: Classes, *, aware: bool) -> Columns:
    """The columns of a policy: agnostic (mixed) or aware (typed), plus pairs under space sharing."""
    if not aware:
        return mixed_columns(state, classes)
    base = single_columns(state, classes)
    return concat(base, pair_columns(state, classes)) if state.space_sharing else base


def member_matrix(cols: Columns, n_classes: int, weight_a: FloatArray, weight_b: FloatArray) -> Triplets:
    """(classes x columns) with ``weight_a`` at (a, v) and ``weight_b`` at (b, v) (summed when a == b)."""
    v = np.arange(cols.n, dtype=np.int64)
    same = cols.a == cols.b
    other = (cols.b >= 0) & ~same
    rows = np.concatenate([cols.a, cols.b[other]])
    cidx = np.concatenate([v, v[other]])
    vals = np.concatenate([weight_a + np.where(same, weight_b, 0.0), weight_b[other]])
    return Triplets(rows, cidx, vals, n_classes, cols.n)


def time_matrix(cols: Columns, n_classes: int) -> Triplets:
    one = np.ones(cols.n)
    return member_matrix(cols, n_classes, one, one)


def throughput_matrix(cols: Columns, n_classes: int) -> Triplets:
    """(classes x columns): steps/s a class's jobs gain in total per unit of the column."""
    return member_matrix(cols, n_classes, cols.tput_a, cols.tput_b)


def capacity_matrix(cols: Columns) -> Triplets:
    """(types x columns): GPUs of each type held per unit of the column."""
    held = cols.mix * cols.gpus[:, None]
    v, j = np.nonzero(held)
    return Triplets(j.astype(np.int64), v.astype(np.int64), held[v, j], cols.mix.shape[1], cols.n)


def base_constraints(cols: Columns, classes: Classes, capacity: FloatArray) -> tuple[Triplets, FloatArray]:
    """Rows ``A @ Y <= b`` for time (one per class) then capacity (one per type)."""
    t = time_matrix(cols, classes.n)
    c = capacity_matrix(cols)
    a = assemble([(0, 0, t), (t.n_rows, 0, c)], t.n_rows + c.n_rows, cols.n)
    b = np.concatenate([classes.count.astype(np.float64), capacity])
    return a, b


@lru_cache(maxsize=4096)
def _transport(na: int, nb: int) -> tuple[IntArray, IntArray, FloatArray]:
    """North-west-corner plan between ``na`` equal supplies and ``nb`` equal demands (total 1):
    at most na + nb - 1 edges (i, k, weight); each i gets 1/na, each k gets 1/nb."""
    cuts = np.union1d(np.arange(na + 1, dtype=np.int64) * nb, np.arange(nb + 1, dtype=np.int64) * na)
    lo, hi = cuts[:-1], cuts[1:]
    return lo // nb, lo // na, (hi - lo) / float(na * nb)


@lru_cache(maxsize=1024)
def _ring(n: int) -> tuple[IntArray, IntArray, FloatArray]:
    """Pairs of ``n >= 2`` jobs of one class, each job in pairs carrying 2/n of the class-pair total."""
    if n == 2:
        return np.array([0]), np.array([1]), np.array([1.0])
    i = np.arange(n, dtype=np.int64)
    return i, (i + 1) % n, np.full(n, 1.0 / n)


def expand(
    state: ClusterState, classes: Classes, cols: Columns, y: FloatArray
) -> tuple[FloatArray, IntArray, FloatArray]:
    """Split class-level column values ``y`` back into per-job fractions ``x`` (jobs x types) and
    co-located job pairs (row indices, lower first) with their per-type fractions."""
    y = np.where(y > MIN_FRACTION, y, 0.0)
    nj = state.n_types
    single = cols.b < 0
    xc = cols.mix[single] * y[single, None]
    a_single = cols.a[single]
    xk = np.stack([np.bincount(a_single, weights=xc[:, t], minlength=classes.n) for t in range(nj)], axis=1)
    x = xk[classes.of_job] / classes.count[classes.of_job, None]
    pmask = (~single) & (y > 0)
    if not pmask.any():
        return x, np.zeros((0, 2), dtype=np.int64), np.zeros((0, nj))
    # total fraction per (class pair, type)
    key = cols.a[pmask] * classes.n + cols.b[pmask]
    ukey, inv = np.unique(key, return_inverse=True)
    flat = inv.reshape(-1) * nj + cols.wtype[pmask]
    per_pair = np.bincount(flat, weights=y[pmask], minlength=ukey.shape[0] * nj).reshape(-1, nj)
    ca, cb = ukey // classes.n, ukey % classes.n
    na, nb = classes.count[ca], classes.count[cb]
    rows_a: list[IntArray] = []
    rows_b: list[IntArray] = []
    fracs: list[FloatArray] = []
    simple = (na == 1) & (nb == 1) & (ca != cb)
    if simple.any():  # the per-job formulation: one job pair per column group
        rows_a.append(classes.members[classes.start[ca[simple]]])
        rows_b.append(classes.members[classes.start[cb[simple]]])
        fracs.append(per_pair[simple])
    for k in np.nonzero(~simple)[0].tolist():  # one iteration per class pair, not per job
        a, b = int(ca[k]), int(cb[k])
        ma = classes.members[classes.start[a] : classes.start[a + 1]]
        mb = classes.members[classes.start[b] : classes.start[b + 1]]
        i, j, w = _ring(len(ma)) if a == b else _transport(len(ma), len(mb))
        rows_a.append(ma[i])
        rows_b.append(mb[j] if a != b else ma[j])
        fracs.append(w[:, None] * per_pair[k][None, :])
    ra, rb = np.concatenate(rows_a), np.concatenate(rows_b)
    pairs = np.stack([np.minimum(ra, rb), np.maximum(ra, rb)], axis=1).astype(np.int64)
    return x, pairs, np.concatenate(fracs)


@dataclass(frozen=True, slots=True, eq=False)
class SlotColumns:
    """The per-job formulation laid out in job slots (see :class:`costopt.gavel.lp.SlotModels`): slot
    ``s`` owns columns ``s * k .. s * k + k - 1`` — one per worker type when aware (``k = J``), one with
    the job's agnostic type mix otherwise (``k = 1``) — whether a job holds it or not, so the sparsity
    pattern of an LP over these columns depends only on ``n_slots``.

    ``slot``: each job row's slot. ``tput`` (n_slots, k): steps/s of the slot's job per unit of each
    column, 0 where it cannot run and in empty slots (``usable`` is ``tput > 0``). ``type_mix``
    (n_slots, k, J): time on each type per unit of a column. ``share_tput`` (jobs): steps/s of a job per
    unit of equal-share time fraction — a constant of the job and the cluster (its equal-share
    throughput is ``min(1, C / (n scale_factor))`` times it), so rows scaled by it do not change when
    other jobs come and go.
    """

    n_slots: int
    k: int
    slot: IntArray
    tput: FloatArray
    type_mix: FloatArray
    scale_factor: FloatArray
    share_tput: FloatArray

    @property
    def n(self) -> int:
        return self.n_slots * self.k

    @property
    def usable(self) -> npt.NDArray[np.bool_]:
        out: npt.NDArray[np.bool_] = self.tput > 0
        return out

    def per_slot(self, values: FloatArray, fill: float = 0.0) -> FloatArray:
        """Per-job ``values`` placed at their slots (``fill`` in empty ones)."""
        out = np.full(self.n_slots, fill)
        out[self.slot] = values
        return out

    def _slot_rows(self, vals: FloatArray) -> Triplets:
        """(n_slots x columns): ``vals`` (one per column) in the row of the column's slot."""
        slots = np.repeat(np.arange(self.n_slots, dtype=np.int64), self.k)
        return Triplets(slots, np.arange(self.n, dtype=np.int64), vals, self.n_slots, self.n)

    def time_rows(self) -> Triplets:
        """(n_slots x columns): a job's time, 1 per unit of each column of its slot."""
        return self._slot_rows(np.ones(self.n))

    def throughput_rows(self, scale: FloatArray) -> Triplets:
        """(n_slots x columns): a job's throughput times ``scale`` (per job row)."""
        return self._slot_rows((self.tput * self.per_slot(scale)[:, None]).ravel())

    def capacity_rows(self) -> Triplets:
        """(types x columns): GPUs of each type held per unit of each column (entries of every type a
        column of this layout can hold, zeros included, so the pattern does not depend on the jobs)."""
        nj = self.type_mix.shape[2]
        gpus = self.type_mix * self.scale_factor[:, None, None]
        if self.k == nj:  # aware: column (s, j) runs on type j
            types = np.tile(np.arange(nj, dtype=np.int64), self.n_slots)
            return Triplets(
                types, np.arange(self.n, dtype=np.int64), gpus.reshape(-1, nj)[np.arange(self.n), types], nj, self.n
            )
        cols = np.repeat(np.arange(self.n, dtype=np.int64), nj)
        types = np.tile(np.arange(nj, dtype=np.int64), self.n)
        return Triplets(types, cols, gpus.reshape(-1), nj, self.n)

    def throughput(self, y: FloatArray) -> FloatArray:
        """Each job's steps/s under column values ``y``."""
        per: FloatArray = (y.reshape(self.n_slots, self.k) * self.tput).sum(axis=1)[self.slot]
        return per

    def best_throughput(self) -> FloatArray:
        """Each job's largest steps/s per unit of one of its columns (an upper bound on its throughput)."""
        out: FloatArray = self.tput.max(axis=1)[self.slot]
        return out

    def fractions(self, y: FloatArray) -> FloatArray:
        """(jobs x types) time fractions of column values ``y`` (below :data:`MIN_FRACTION`: 0)."""
        y = np.where(y > MIN_FRACTION, y, 0.0).reshape(self.n_slots, self.k)
        out: FloatArray = np.einsum("sk,skj->sj", y, self.type_mix)[self.slot]
        return out


def slot_columns(state: ClusterState, slot: IntArray, n_slots: int, *, aware: bool) -> SlotColumns:
    """The columns of ``state``'s jobs at ``slot`` in a layout of ``n_slots`` (see :class:`SlotColumns`)."""
    nj = state.n_types
    run = runnable(state)
    if aware:
        tput_job = np.where(run, state.throughput, 0.0)
        mix_job = np.broadcast_to(np.eye(nj), (state.n_jobs, nj, nj))
        total = float(state.capacity.sum())
        share = tput_job @ state.capacity / total if total > 0 else np.zeros(state.n_jobs)
    else:
        mix = agnostic_mix(state)
        share = (mix * state.throughput).sum(axis=1)
        tput_job = share[:, None]
        mix_job = mix[:, None, :]
    k = tput_job.shape[1]
    tput = np.zeros((n_slots, k))
    tput[slot] = tput_job
    type_mix = np.zeros((n_slots, k, nj))
    type_mix[slot] = mix_job
    sf = np.zeros(n_slots)
    sf[slot] = state.scale_factor
    return SlotColumns(n_slots, k, slot, tput, type_mix, sf, share)
