"""One LP entry point over HiGHS (highspy), with typed errors for every non-optimal status.

The matrix is passed as a scipy sparse matrix (converted to compressed columns once). A HiGHS
instance is reused per thread: building one costs more than solving the small LPs the simulator
sends every round.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from highspy import _core

from costopt.gavel.errors import Infeasible, SolverFailed

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
INF = float("inf")
_local = threading.local()


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


def _csc(a: Any, n: int) -> tuple[int, IntArray, IntArray, FloatArray]:
    """(rows, column starts, row indices, values) of ``a`` (Triplets or anything scipy reads)."""
    if isinstance(a, Triplets):
        order = np.lexsort((a.rows, a.cols))
        start = np.concatenate([[0], np.cumsum(np.bincount(a.cols, minlength=a.n_cols))]).astype(np.int64)
        return a.n_rows, start, a.rows[order], a.vals[order]
    mat = sp.csc_matrix(a, dtype=np.float64)
    return mat.shape[0], mat.indptr.astype(np.int64), mat.indices.astype(np.int64), mat.data


def _new_highs() -> Any:
    # The core class: highspy.Highs's wrapper prints a banner to stdout on construction, which
    # would corrupt JSON output of the CLI. Same solver, same API.
    h = _core._Highs()
    h.setOptionValue("output_flag", False)
    # One thread: the LPs here are small or solved one after another; HiGHS's worker pool would only
    # compete with the caller for the CPU.
    h.setOptionValue("threads", 1)
    return h


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

    def same_pattern(self, other: _Arrays) -> bool:
        return (
            self.cost.shape == other.cost.shape
            and self.row_lower.shape == other.row_lower.shape
            and np.array_equal(self.start, other.start)
            and np.array_equal(self.index, other.index)
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
) -> _Arrays:
    n = cost.shape[0]
    width = a.n_cols if isinstance(a, Triplets) else a.shape[1]
    if width != n:
        raise SolverFailed(what, "bad input", f"matrix columns do not match the {n} costs")
    m, start, index, value = _csc(a, n)

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
    raise SolverFailed(what, text, f"{h.getNumRow()} constraints, {h.getNumCol()} variables")


def _kept() -> dict[str, tuple[Any, _Arrays]]:
    kept: dict[str, tuple[Any, _Arrays]] | None = getattr(_local, "kept", None)
    if kept is None:
        kept = {}
        _local.kept = kept
    return kept


def forget_kept_models() -> None:
    """Drop this thread's kept LPs (benchmarks measure cold solves with it)."""
    _local.kept = {}


def _apply_changes(h: Any, old: _Arrays, new: _Arrays) -> None:
    """Turn the kept model ``old`` into ``new`` (same sparsity pattern) in place."""
    n, m = new.cost.shape[0], new.row_lower.shape[0]
    if not np.array_equal(old.cost, new.cost):
        h.changeColsCost(n, np.arange(n, dtype=np.int32), new.cost)
    if not (np.array_equal(old.col_lower, new.col_lower) and np.array_equal(old.col_upper, new.col_upper)):
        h.changeColsBounds(n, np.arange(n, dtype=np.int32), new.col_lower, new.col_upper)
    if not (np.array_equal(old.row_lower, new.row_lower) and np.array_equal(old.row_upper, new.row_upper)):
        h.changeRowsBounds(m, np.arange(m, dtype=np.int32), new.row_lower, new.row_upper)
    diff = np.nonzero(old.value != new.value)[0]
    if diff.size:
        cols = np.searchsorted(new.start, diff, side="right") - 1
        for pos, col in zip(diff.tolist(), cols.tolist(), strict=True):
            h.changeCoeff(int(new.index[pos]), int(col), float(new.value[pos]))


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
) -> LPSolution:
    """Optimize ``c @ x`` subject to ``row_lower <= a @ x <= row_upper`` and column bounds
    (default ``0 <= x``). ``±inf`` marks a free side. ``what`` names the LP in errors and keys the
    warm start of small LPs (see :data:`WARM_START_MAX_NONZEROS`).

    Raises :class:`Infeasible` when no point satisfies the constraints and :class:`SolverFailed`
    for any other non-optimal outcome (unbounded, time limit, numerical trouble), naming ``what``.
    """
    cost = np.asarray(c, dtype=np.float64)
    arr = _arrays(-cost if maximize else cost, a, row_lower, row_upper, col_lower, col_upper, what)
    nnz = arr.value.shape[0]
    if nnz <= WARM_START_MAX_NONZEROS:
        kept = _kept()
        entry = kept.pop(what, None)
        if entry is not None and entry[1].same_pattern(arr):
            h = entry[0]
            _apply_changes(h, entry[1], arr)
        else:
            h = entry[0] if entry is not None else _new_highs()
            h.setOptionValue("solver", "simplex")
            h.setOptionValue("presolve", "off" if nnz < PRESOLVE_ABOVE_NONZEROS else "choose")
            h.passModel(arr.highs_lp())
        kept[what] = (h, arr)
        while len(kept) > _MAX_KEPT:
            kept.pop(next(iter(kept)))
        sol = _run(h, what)
        dims = f"{h.getNumRow()} constraints, {h.getNumCol()} variables"
    else:
        h = _highs()
        h.setOptionValue("solver", "ipm" if nnz > IPM_ABOVE_NONZEROS else "simplex")
        h.setOptionValue("presolve", "choose")
        h.passModel(arr.highs_lp())
        try:
            sol = _run(h, what)
        finally:
            dims = f"{h.getNumRow()} constraints, {h.getNumCol()} variables"
            h.clearModel()
    if sol is None:
        raise Infeasible(what, "Infeasible", dims)
    return LPSolution(x=sol.x, objective=float(cost @ sol.x))


class IncrementalLP:
    """An LP kept in its own HiGHS instance whose row bounds change between solves; each re-solve
    starts from the previous basis (dual simplex), typically a few pivots instead of a full solve."""

    def __init__(
        self,
        c: npt.ArrayLike,
        a: Any,
        row_lower: npt.ArrayLike,
        row_upper: npt.ArrayLike,
        *,
        maximize: bool = False,
        what: str = "LP",
    ) -> None:
        self._cost = np.asarray(c, dtype=np.float64)
        self._what = what
        arr = _arrays(-self._cost if maximize else self._cost, a, row_lower, row_upper, None, None, what)
        self._h: Any = _new_highs()
        self._h.setOptionValue("solver", "ipm" if arr.value.shape[0] > IPM_ABOVE_NONZEROS else "simplex")
        if arr.value.shape[0] <= PRESOLVE_ABOVE_NONZEROS:
            self._h.setOptionValue("presolve", "off")
        self._h.passModel(arr.highs_lp())
        self._first = True

    def solve(self) -> LPSolution | None:
        """The optimum (objective in the caller's sense), or None if infeasible."""
        sol = _run(self._h, self._what)
        if self._first:
            self._first = False
            self._h.setOptionValue("solver", "simplex")
        return None if sol is None else LPSolution(x=sol.x, objective=float(self._cost @ sol.x))

    def set_row_bounds(self, rows: npt.ArrayLike, lower: npt.ArrayLike, upper: npt.ArrayLike) -> None:
        idx = np.asarray(rows, dtype=np.int32)
        self._h.changeRowsBounds(len(idx), idx, np.asarray(lower, np.float64), np.asarray(upper, np.float64))
