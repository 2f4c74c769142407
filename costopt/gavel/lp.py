"""One LP entry point over HiGHS (highspy), with typed errors for every non-optimal status.

The matrix is passed as a scipy sparse matrix (converted to compressed columns once). A HiGHS
instance is reused per thread: building one costs more than solving the small LPs the simulator
sends every round.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import highspy
import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from highspy import _core

from costopt.gavel.errors import Infeasible, SolverFailed
from costopt.highs import configure

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
INF = float("inf")
_local = threading.local()
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True, eq=False)
class LPSolution:
    """Primal values ``x`` (one per column) and the objective value (in the caller's sense)."""

    x: FloatArray
    objective: float


IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True, eq=False)
class Triplets:
    """A sparse matrix as (row, column, value) triplets without duplicate positions; cheap to build,
    scale, slice by rows and assemble into one LP matrix (scipy's block functions cost more than
    solving the small LPs of a simulation round)."""

    rows: IntArray
    cols: IntArray
    vals: FloatArray
    n_rows: int
    n_cols: int

    def scaled_rows(self, factor: FloatArray) -> Triplets:
        return Triplets(self.rows, self.cols, self.vals * factor[self.rows], self.n_rows, self.n_cols)

    def take_rows(self, keep: IntArray) -> Triplets:
        """Rows ``keep`` (in that order), renumbered from 0."""
        new = np.full(self.n_rows, -1, dtype=np.int64)
        new[keep] = np.arange(keep.shape[0])
        m = new[self.rows] >= 0
        return Triplets(new[self.rows[m]], self.cols[m], self.vals[m], int(keep.shape[0]), self.n_cols)

    def __neg__(self) -> Triplets:
        return Triplets(self.rows, self.cols, -self.vals, self.n_rows, self.n_cols)

    def col_sums(self) -> FloatArray:
        out: FloatArray = np.bincount(self.cols, weights=self.vals, minlength=self.n_cols).astype(np.float64)
        return out

    def dot(self, y: FloatArray) -> FloatArray:
        out: FloatArray = np.bincount(self.rows, weights=self.vals * y[self.cols], minlength=self.n_rows).astype(
            np.float64
        )
        return out

    @staticmethod
    def column(values: FloatArray) -> Triplets:
        """A single dense column (its nonzeros)."""
        r = np.nonzero(values)[0].astype(np.int64)
        return Triplets(r, np.zeros(r.shape[0], dtype=np.int64), values[r].astype(np.float64), values.shape[0], 1)

    @staticmethod
    def row(values: FloatArray) -> Triplets:
        """A single dense row (its nonzeros)."""
        c = np.nonzero(values)[0].astype(np.int64)
        return Triplets(np.zeros(c.shape[0], dtype=np.int64), c, values[c].astype(np.float64), 1, values.shape[0])


def assemble(parts: list[tuple[int, int, Triplets]], n_rows: int, n_cols: int) -> Triplets:
    """One matrix of ``n_rows x n_cols`` from blocks placed at (row offset, column offset)."""
    return Triplets(
        np.concatenate([p.rows + r for r, _, p in parts]).astype(np.int64),
        np.concatenate([p.cols + c for _, c, p in parts]).astype(np.int64),
        np.concatenate([p.vals for _, _, p in parts]).astype(np.float64),
        n_rows,
        n_cols,
    )


Csc = tuple[int, IntArray, IntArray, FloatArray]
"""(rows, column starts, row indices, values) of a matrix in compressed columns."""


@dataclass(frozen=True, slots=True, eq=False)
class _Layout:
    """Where the entries of one Triplets pattern go in compressed columns (reused while it stays)."""

    rows: IntArray
    cols: IntArray
    n_rows: int
    n_cols: int
    order: IntArray
    start: IntArray
    index: IntArray

    @staticmethod
    def of(a: Triplets, known: _Layout | None = None) -> _Layout:
        if (
            known is not None
            and (known.n_rows, known.n_cols) == (a.n_rows, a.n_cols)
            and np.array_equal(known.rows, a.rows)
            and np.array_equal(known.cols, a.cols)
        ):
            return known
        order = np.argsort(a.cols * max(a.n_rows, 1) + a.rows, kind="stable")  # by column, then row
        start = np.concatenate([[0], np.cumsum(np.bincount(a.cols, minlength=a.n_cols))]).astype(np.int64)
        return _Layout(a.rows, a.cols, a.n_rows, a.n_cols, order, start, a.rows[order])

    def csc(self, a: Triplets) -> Csc:
        return self.n_rows, self.start, self.index, a.vals[self.order]


def _csc(a: Any) -> Csc:
    """``a`` (Triplets or anything scipy reads) in compressed columns."""
    if isinstance(a, Triplets):
        return _Layout.of(a).csc(a)
    mat = sp.csc_matrix(a, dtype=np.float64)
    return mat.shape[0], mat.indptr.astype(np.int64), mat.indices.astype(np.int64), mat.data


def _new_highs() -> Any:
    # The core class: highspy.Highs's wrapper prints a banner to stdout on construction, which
    # would corrupt JSON output of the CLI. Same solver, same API.
    # One thread count for the process (costopt.highs: HiGHS's scheduler is global).
    return configure(_core._Highs())


def _highs() -> Any:
    h = getattr(_local, "highs", None)
    if h is None:
        h = _new_highs()
        _local.highs = h
    return h


IPM_ABOVE_NONZEROS = 10_000
"""LPs with more nonzeros go to the interior-point solver (with crossover to a vertex): on the per-job
formulations (thousands of jobs) it is several times faster than dual simplex; small LPs stay on
simplex, which has less overhead."""


PRESOLVE_ABOVE_NONZEROS = 5_000
"""Presolve costs more than it saves on the small LPs a simulation solves every round."""
WARM_START_MAX_NONZEROS = 20_000
"""Small LPs are kept per purpose (``what``) and thread: the next LP with the same sparsity pattern
is applied as changes to the kept one and re-solved from its basis (a simulation re-solves nearly
the same LP every round). Larger LPs are solved from scratch."""
_MAX_KEPT = 16


@dataclass(slots=True, eq=False)
class _Arrays:
    """One LP in HiGHS's column-wise form (costs already in minimization sense)."""

    cost: FloatArray
    col_lower: FloatArray
    col_upper: FloatArray
    row_lower: FloatArray
    row_upper: FloatArray
    start: IntArray
    index: IntArray
    value: FloatArray
    _entry_cols: IntArray | None = None

    def entry_cols(self) -> IntArray:
        """The column of each nonzero."""
        if self._entry_cols is None:
            n = self.cost.shape[0]
            self._entry_cols = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.start))
        return self._entry_cols

    def same_pattern(self, other: _Arrays) -> bool:
        return (
            self.cost.shape == other.cost.shape
            and self.row_lower.shape == other.row_lower.shape
            and (self.start is other.start or np.array_equal(self.start, other.start))
            and (self.index is other.index or np.array_equal(self.index, other.index))
        )

    def highs_lp(self) -> Any:
        n, m = self.cost.shape[0], self.row_lower.shape[0]
        lp = highspy.HighsLp()
        lp.num_col_ = n
        lp.num_row_ = m
        lp.col_cost_ = self.cost
        lp.col_lower_ = self.col_lower
        lp.col_upper_ = self.col_upper
        lp.row_lower_ = self.row_lower
        lp.row_upper_ = self.row_upper
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.num_col_ = n
        lp.a_matrix_.num_row_ = m
        lp.a_matrix_.start_ = self.start.astype(np.int32)
        lp.a_matrix_.index_ = self.index.astype(np.int32)
        lp.a_matrix_.value_ = self.value
        return lp


def _arrays(
    cost: FloatArray,
    a: Any,
    row_lower: npt.ArrayLike,
    row_upper: npt.ArrayLike,
    col_lower: npt.ArrayLike | None,
    col_upper: npt.ArrayLike | None,
    what: str,
    csc: Csc | None = None,
) -> _Arrays:
    """The LP's arrays; ``csc``: ``a`` already in compressed columns."""
    n = cost.shape[0]
    width = a.n_cols if isinstance(a, Triplets) else a.shape[1]
    if width != n:
        raise SolverFailed(what, "bad input", f"matrix columns do not match the {n} costs")
    m, start, index, value = _csc(a) if csc is None else csc

    def vec(v: npt.ArrayLike | None, default: float, size: int) -> FloatArray:
        if v is None:
            return np.full(size, default)
        out: FloatArray = np.array(np.broadcast_to(np.asarray(v, np.float64), size))
        return out

    return _Arrays(
        cost=cost,
        col_lower=vec(col_lower, 0.0, n),
        col_upper=vec(col_upper, INF, n),
        row_lower=vec(row_lower, -INF, m),
        row_upper=vec(row_upper, INF, m),
        start=start,
        index=index,
        value=value.astype(np.float64),
    )


def _run(h: Any, what: str) -> LPSolution | None:
    """Run; the solution if optimal, None if infeasible, :class:`SolverFailed` otherwise."""
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kOptimal:
        x = np.asarray(h.getSolution().col_value, dtype=np.float64)
        return LPSolution(x=x, objective=float(h.getInfo().objective_function_value))
    if status == highspy.HighsModelStatus.kInfeasible:
        return None
    text = h.modelStatusToString(status)
    log.debug("%s: HiGHS status %s", what, text)
    raise SolverFailed(what, text, _dims(h))


def _dims(h: Any) -> str:
    return f"{h.getNumRow()} constraints, {h.getNumCol()} variables"


def _pass_model(h: Any, arr: _Arrays, *, ipm: bool) -> None:
    """Pass ``arr`` to ``h`` for a solve from scratch: interior point above :data:`IPM_ABOVE_NONZEROS`
    nonzeros (when ``ipm``), presolve from :data:`PRESOLVE_ABOVE_NONZEROS`."""
    nnz = arr.value.shape[0]
    h.setOptionValue("solver", "ipm" if ipm and nnz > IPM_ABOVE_NONZEROS else "simplex")
    h.setOptionValue("presolve", "off" if nnz < PRESOLVE_ABOVE_NONZEROS else "choose")
    h.passModel(arr.highs_lp())


def _recent(store_name: str, key: str, make: Callable[[], _T]) -> _T:
    """``key``'s entry of this thread's store ``store_name`` (made if missing), now the most recently
    used; beyond :data:`_MAX_KEPT` entries the least recently used is dropped."""
    store: dict[str, _T] | None = getattr(_local, store_name, None)
    if store is None:
        store = {}
        setattr(_local, store_name, store)
    item = store.pop(key, None) or make()
    store[key] = item
    while len(store) > _MAX_KEPT:
        store.pop(next(iter(store)))
    return item


def forget_kept_models() -> None:
    """Drop this thread's kept LPs, those of :func:`solve_lp` and of :func:`slot_models` (benchmarks
    measure cold solves with it)."""
    _local.kept = {}
    _local.slot_models = {}


class KeptModel:
    """One LP kept in its own HiGHS instance between solves.

    :meth:`load` replaces the whole LP. When its sparsity pattern is the kept one's, only what differs is
    sent to HiGHS and the next solve starts from the last basis (dual simplex, usually a few pivots);
    otherwise (or with ``cold``) the model is passed anew. Costs and coefficients of columns fixed at 0,
    and coefficients in free rows, cannot change any solution: they are not sent, and the kept values
    stay (an empty slot of a :class:`SlotModels` layout costs nothing). A cold solve of more than
    :data:`IPM_ABOVE_NONZEROS` nonzeros uses the interior-point solver (``ipm_when_cold``); re-solves
    use simplex. A warm solve that ends in numerical trouble is retried once from scratch.
    """

    def __init__(self, what: str, *, ipm_when_cold: bool = True) -> None:
        self.what = what
        self._ipm_when_cold = ipm_when_cold
        self._h: Any = None
        self._arr: _Arrays | None = None
        self._cost: FloatArray = np.zeros(0)
        self._warm = False
        self._layout: _Layout | None = None

    def load(
        self,
        c: npt.ArrayLike,
        a: Any,
        row_lower: npt.ArrayLike,
        row_upper: npt.ArrayLike,
        col_lower: npt.ArrayLike | None = None,
        col_upper: npt.ArrayLike | None = None,
        *,
        maximize: bool = False,
        cold: bool = False,
    ) -> None:
        """Make the model ``c @ x`` (maximized or minimized) s.t. ``row_lower <= a @ x <= row_upper`` and
        ``col_lower <= x <= col_upper`` (default ``0 <= x``), as in :func:`solve_lp`."""
        cost = np.asarray(c, dtype=np.float64)
        csc = None
        if isinstance(a, Triplets):
            self._layout = _Layout.of(a, self._layout)
            csc = self._layout.csc(a)
        arr = _arrays(-cost if maximize else cost, a, row_lower, row_upper, col_lower, col_upper, self.what, csc)
        self._load(cost, arr, cold)

    def _load(self, cost: FloatArray, arr: _Arrays, cold: bool = False) -> None:
        self._cost = cost
        if cold or self._arr is None or not self._arr.same_pattern(arr):
            self._pass(arr)
        else:
            self._arr = _apply_changes(self._h, self._arr, arr)

    def _pass(self, arr: _Arrays) -> None:
        if self._h is None:
            self._h = _new_highs()
        _pass_model(self._h, arr, ipm=self._ipm_when_cold)
        self._arr = arr
        self._warm = False

    @property
    def dims(self) -> str:
        return _dims(self._h)

    def set_row_bounds(self, rows: npt.ArrayLike, lower: npt.ArrayLike, upper: npt.ArrayLike) -> None:
        """Change the bounds of ``rows`` (ascending indices) for the next solve. A row free at
        :meth:`load` must stay free (its coefficients may not have been sent)."""
        if self._arr is None:
            raise ValueError(f"{self.what}: load a model first")
        idx = np.asarray(rows, dtype=np.int64)
        lo = np.broadcast_to(np.asarray(lower, np.float64), idx.shape)
        up = np.broadcast_to(np.asarray(upper, np.float64), idx.shape)
        was_free = (self._arr.row_lower[idx] == -INF) & (self._arr.row_upper[idx] == INF)
        if np.any(was_free & ((lo > -INF) | (up < INF))):
            raise ValueError(f"{self.what}: a row free at load cannot be bounded by set_row_bounds")
        self._arr.row_lower[idx] = lo
        self._arr.row_upper[idx] = up
        self._h.changeRowsBounds(idx.shape[0], idx.astype(np.int32), np.ascontiguousarray(lo), np.ascontiguousarray(up))

    def solve(self) -> LPSolution | None:
        """The optimum (objective in the caller's sense), or None if infeasible; :class:`SolverFailed`
        for any other outcome."""
        if self._arr is None:
            raise ValueError(f"{self.what}: load a model first")
        try:
            sol = _run(self._h, self.what)
        except SolverFailed:
            if not self._warm:
                raise
            log.debug("%s: warm re-solve failed; solving from scratch", self.what)
            self._pass(self._arr)
            sol = _run(self._h, self.what)
        if not self._warm:
            self._warm = True
            self._h.setOptionValue("solver", "simplex")
        return None if sol is None else LPSolution(x=sol.x, objective=float(self._cost @ sol.x))


MIN_SLOTS = 16
"""Fewest slots of a :class:`SlotModels` layout."""


class SlotModels:
    """The kept LPs of one policy laid out in job *slots*, and which job holds which slot.

    An LP laid out in slots (a fixed block of columns and rows per slot, whether a job holds it or
    not) keeps its sparsity pattern while jobs come and go, so each :class:`KeptModel` re-solves from
    its last basis with only the changed slots sent. A job keeps its slot while it stays; new jobs take
    the lowest free slots in the order given; when the slots are full their number doubles.

    So that results depend only on the states since the last cold start, :meth:`assign` starts cold
    (drops the models, numbers the slots anew) when its clock is not later than the last call's (a new
    simulation, or the same state again), when no job stays, and when at most a quarter of the slots
    would be used.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._holder: IntArray = np.zeros(0, dtype=np.int64)  # job id per slot, -1 = empty
        self._clock = -INF
        self._models: dict[str, KeptModel] = {}

    @property
    def n_slots(self) -> int:
        return int(self._holder.shape[0])

    def assign(self, ids: npt.ArrayLike, clock: float) -> IntArray:
        """The slot of each of the distinct job ``ids`` at time ``clock``; see :attr:`n_slots`."""
        ids = np.asarray(ids, dtype=np.int64)
        n = ids.shape[0]
        stays = np.isin(self._holder, ids)  # per slot
        cold = not clock > self._clock or not stays.any() or (4 * n <= self.n_slots and self.n_slots > MIN_SLOTS)
        self._clock = clock
        if cold:
            self._models.clear()
            self._holder = np.full(max(MIN_SLOTS, 1 << max(n - 1, 0).bit_length()), -1, dtype=np.int64)
            self._holder[:n] = ids
            return np.arange(n, dtype=np.int64)
        size = self.n_slots
        while size < n:
            size *= 2
        holder = np.full(size, -1, dtype=np.int64)
        holder[: self.n_slots] = np.where(stays, self._holder, -1)  # the departed free their slots
        taken = np.nonzero(holder >= 0)[0]
        order = np.argsort(holder[taken])
        held, at = holder[taken][order], taken[order]
        slot = np.full(n, -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(held, ids), held.shape[0] - 1)  # some job stays: held is not empty
        found = held[pos] == ids
        slot[found] = at[pos[found]]
        new = np.nonzero(~found)[0]
        slot[new] = np.nonzero(holder < 0)[0][: new.shape[0]]
        holder[slot[new]] = ids[new]
        self._holder = holder
        return slot

    def model(self, stage: str) -> KeptModel:
        """The kept model of ``stage`` (created empty on first use and after a cold start)."""
        model = self._models.get(stage)
        if model is None:
            model = self._models[stage] = KeptModel(f"{self.what}: {stage}")
        return model


def slot_models(what: str) -> SlotModels:
    """This thread's :class:`SlotModels` for ``what`` (at most :data:`_MAX_KEPT`, least recently used
    dropped first; :func:`forget_kept_models` drops them all)."""
    return _recent("slot_models", what, lambda: SlotModels(what))


def _apply_changes(h: Any, old: _Arrays, new: _Arrays) -> _Arrays:
    """Turn the kept model ``old`` into ``new`` (same sparsity pattern) in place; the arrays now kept
    (``new``, except for the costs and coefficients that cannot matter, see :class:`KeptModel`)."""
    live = (new.col_lower != 0) | (new.col_upper != 0)
    cost = np.where(live, new.cost, old.cost)
    changed = np.nonzero(cost != old.cost)[0]
    if changed.size:
        h.changeColsCost(changed.size, changed.astype(np.int32), cost[changed])
    changed = np.nonzero((old.col_lower != new.col_lower) | (old.col_upper != new.col_upper))[0]
    if changed.size:
        h.changeColsBounds(changed.size, changed.astype(np.int32), new.col_lower[changed], new.col_upper[changed])
    changed = np.nonzero((old.row_lower != new.row_lower) | (old.row_upper != new.row_upper))[0]
    if changed.size:
        h.changeRowsBounds(changed.size, changed.astype(np.int32), new.row_lower[changed], new.row_upper[changed])
    bounded_row = (new.row_lower > -INF) | (new.row_upper < INF)
    col = old.entry_cols()
    value = np.where(live[col] & bounded_row[new.index], new.value, old.value)
    changed = np.nonzero(value != old.value)[0]
    if changed.size:
        rows, cols, vals = new.index[changed].tolist(), col[changed].tolist(), value[changed].tolist()
        for r, c, v in zip(rows, cols, vals, strict=True):
            h.changeCoeff(r, c, v)
    return _Arrays(cost, new.col_lower, new.col_upper, new.row_lower, new.row_upper, old.start, old.index, value, col)


def solve_lp(
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
    """Optimize ``c @ x`` subject to ``row_lower <= a @ x <= row_upper`` and column bounds
    (default ``0 <= x``). ``±inf`` marks a free side. ``what`` names the LP in errors and keys the
    warm start of small LPs (see :data:`WARM_START_MAX_NONZEROS`); ``warm=False`` solves from scratch
    (for a degenerate optimum that should not depend on earlier calls).

    Raises :class:`Infeasible` when no point satisfies the constraints and :class:`SolverFailed`
    for any other non-optimal outcome (unbounded, time limit, numerical trouble), naming ``what``.
    """
    cost = np.asarray(c, dtype=np.float64)
    arr = _arrays(-cost if maximize else cost, a, row_lower, row_upper, col_lower, col_upper, what)
    nnz = arr.value.shape[0]
    if warm and nnz <= WARM_START_MAX_NONZEROS:
        model = _recent("kept", what, lambda: KeptModel(what, ipm_when_cold=False))
        model._load(cost, arr)
        sol = model.solve()
        dims = model.dims
    else:
        h = _highs()
        _pass_model(h, arr, ipm=True)
        try:
            sol = _run(h, what)
        finally:
            dims = _dims(h)
            h.clearModel()
    if sol is None:
        raise Infeasible(what, "Infeasible", dims)
    return LPSolution(x=sol.x, objective=float(cost @ sol.x))
