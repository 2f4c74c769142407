"""Estimates of unmeasured throughputs (steps/s), each marked ``estimated`` with its estimator's name.

Three estimators, applied in this order by :func:`estimate_catalog` (measured cells are never touched):

1. ``lowrank-completion`` -- **a job type measured on some of the well-covered accelerators only**
   (at 1 GPU). In the spirit of Gavel's throughput estimator (matrix completion over job types), the
   job-types x accelerators matrix of log throughputs is completed by a low-rank model
   ``log t[j, a] = r[j] + c[a] + U[j] . V[a]`` (row and column effects plus a rank-``completion_rank``
   interaction, ridge ``completion_reg`` on U and V), fitted by alternating least squares
   (:func:`complete_low_rank`, numpy only). Columns are the accelerators measured for at least
   ``completion_min_coverage`` of the job types (K80/P100/V100 with Gavel's data). A job type with a
   single measured cell gets that cell times the accelerators' average ratio.
2. ``hardware-loglinear`` -- **accelerators no job type has been measured on** (T4, A10G, L4, L40S,
   A100, H100, ...), from published side information (``data/accelerators.csv``: peak FP32 TFLOPS,
   dense FP16 tensor TFLOPS, memory bandwidth, memory; each row names its vendor datasheet). Per job
   type ``j``::

       log t[j, a] = alpha[j] + b[j] * log(bandwidth[a]) + c[j] * log(fp32_tflops[a])

   * *Why FP32, not tensor FLOPS*: Gavel's jobs were measured in FP32 on K80/P100/V100, where tensor
     cores are absent or unused; the data cannot identify a tensor-core coefficient. The estimate is
     therefore for the same FP32 workload; TF32/AMP speed-ups of newer GPUs are not credited, so
     estimates for A100/H100/L40S are conservative for mixed-precision jobs. Register a measurement.
   * *Why shrinkage*: three points per job type (two in leave-one-out) cannot support three free
     parameters. The slopes ``(b, c)`` are fitted in two ridge stages: pooled slopes over all job types
     (job-specific intercepts; ridge toward ``prior_slopes`` = (0.5, 0.5), the geometric mean of the
     two hardware ratios, weight ``pooled_prior_weight`` per informative job type), then per-job slopes
     shrunk toward the pooled ones (ridge ``job_shrinkage``). A job type measured on one accelerator
     gets the pooled slopes.
   * *Guard against extrapolation*: slopes are constrained to ``b, c >= 0`` and ``b + c <= 1`` (faster
     memory or compute never slows a job; the speed-up never exceeds the larger hardware ratio, the
     roofline bound), solved exactly (2-D active-set enumeration). The estimate is anchored on the job's
     measured accelerator nearest in (log bandwidth, log FP32) space:
     ``t[j, a] = t[j, anchor] * exp(b*dlog_bw + c*dlog_fp32)``; it therefore lies between the anchor's
     measurement and the anchor's measurement times ``max(bandwidth ratio, FP32 ratio)``, clipped to
     that interval explicitly as a last guard. For an accelerator at least as fast as the anchor in
     both features (H100 vs V100) the estimate is never below the measurement.
   * Memory guard (``memory_guard``): a job type is not estimated on an accelerator with less memory
     than the smallest memory it was measured running on (it might not fit: left unknown, not "cannot
     run"). A job type measured only on an 80 GB H100 thus gets estimates on >= 80 GB accelerators
     only, until it is measured on a smaller one or the guard is switched off.
3. ``v100-scaling`` -- **multi-GPU cells** (both placements): the accelerator's 1-GPU value (measured
   or estimated) times the job type's measured scaling ratio ``t(n GPUs) / t(1 GPU)`` on the reference
   accelerator (V100), capped at ``n * max_scaling_efficiency`` (default: no super-linear scaling is
   transferred, although Gavel's V100 data shows some). Not estimated when the reference has no
   measurement at that GPU count (Gavel's A3C, CycleGAN and Recommendation have none), when the
   reference cannot run it, or when the other placement was measured not to run on that accelerator.

Errors of estimators 1 and 2 are measured by :mod:`costopt.throughput.report`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from costopt.domain import normalize_accelerator
from costopt.throughput.catalog import ThroughputCatalog, accelerator_order
from costopt.throughput.errors import InvalidThroughput
from costopt.throughput.model import (
    DEFAULT_PRECISION,
    JobType,
    Placement,
    Precision,
    Throughput,
    ThroughputKey,
    family_of,
)
from costopt.throughput.specs import DEFAULT_ACCELERATOR_SPECS as DEFAULT_ACCELERATOR_SPECS
from costopt.throughput.specs import SPEC_COLUMNS as SPEC_COLUMNS
from costopt.throughput.specs import AcceleratorSpec as AcceleratorSpec
from costopt.throughput.specs import load_accelerator_specs as load_accelerator_specs

if TYPE_CHECKING:
    from costopt.throughput.calibration import CalibrationRow

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]

ESTIMATOR_LOWRANK = "lowrank-completion"
ESTIMATOR_HARDWARE = "hardware-loglinear"
ESTIMATOR_SCALING = "v100-scaling"
ESTIMATOR_CALIBRATED = "family-calibrated"
HARDWARE_ESTIMATORS = (ESTIMATOR_CALIBRATED, ESTIMATOR_HARDWARE)


@dataclass(frozen=True, slots=True)
class EstimatorConfig:
    """Hyper-parameters of the estimators (see the module docstring). Weights are ridge penalties on
    slopes in log-log units."""

    prior_slopes: tuple[float, float] = (0.5, 0.5)
    pooled_prior_weight: float = 1.0
    job_shrinkage: float = 1.0
    completion_rank: int = 1
    completion_reg: float = 0.1
    completion_min_coverage: float = 0.5
    scaling_reference: str = "v100"
    max_scaling_efficiency: float = 1.0
    memory_guard: bool = True
    hardware_estimator: str = "family-calibrated"
    """Which estimator fills unmeasured accelerators: ``family-calibrated`` (fitted with the published
    calibration set, :mod:`costopt.throughput.calibrated`) or ``hardware-loglinear`` (the baseline)."""

    def __post_init__(self) -> None:
        if self.hardware_estimator not in HARDWARE_ESTIMATORS:
            raise InvalidThroughput(
                f"hardware_estimator must be one of {', '.join(HARDWARE_ESTIMATORS)}, got {self.hardware_estimator!r}"
            )
        b, c = self.prior_slopes
        if b < 0 or c < 0 or b + c > 1:
            raise InvalidThroughput(f"prior_slopes must satisfy b, c >= 0 and b + c <= 1, got {self.prior_slopes}")
        for name in ("pooled_prior_weight", "job_shrinkage", "max_scaling_efficiency"):
            if not getattr(self, name) > 0:
                raise InvalidThroughput(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.completion_rank < 0 or self.completion_reg < 0:
            raise InvalidThroughput("completion_rank and completion_reg must be >= 0")
        if not 0 < self.completion_min_coverage <= 1:
            raise InvalidThroughput(f"completion_min_coverage must be in (0, 1], got {self.completion_min_coverage}")


# --- low-rank completion ----------------------------------------------------------------------


def complete_low_rank(
    matrix: npt.ArrayLike,
    rank: int,
    *,
    reg: float = 1e-9,
    biases: bool = False,
    max_iter: int = 5000,
    tol: float = 1e-9,
) -> FloatArray:
    """Complete a matrix (NaN = missing) with ``M ~ U V^T`` (+ row and column effects if ``biases``).

    Alternating least squares with ridge ``reg`` on U and V (effects unpenalized), started from the
    truncated SVD of the mean-filled matrix; deterministic. Returns the full reconstruction (observed
    cells included, so callers choose what to keep); rows or columns without any observation are NaN.
    Stops when no entry moves by more than ``tol * (1 + max |observed|)``.
    """
    m_arr = np.asarray(matrix, dtype=np.float64)
    if m_arr.ndim != 2:
        raise InvalidThroughput(f"complete_low_rank needs a 2-D matrix, got shape {m_arr.shape}")
    if rank < 0 or reg < 0:
        raise InvalidThroughput("rank and reg must be >= 0")
    obs = np.isfinite(m_arr)
    if not obs.any():
        raise InvalidThroughput("complete_low_rank needs at least one observed cell")
    n_rows, n_cols = m_arr.shape
    w = obs.astype(np.float64)
    filled = np.where(obs, m_arr, 0.0)
    scale = 1.0 + float(np.max(np.abs(filled)))

    row_eff = np.zeros(n_rows)
    col_eff = np.zeros(n_cols)
    if biases:
        for _ in range(50):  # a few rounds of alternating means give a good start
            row_eff = _masked_mean(filled - col_eff[None, :], w, axis=1)
            col_eff = _masked_mean(filled - row_eff[:, None], w, axis=0)
    resid = np.where(obs, filled - row_eff[:, None] - col_eff[None, :], 0.0)
    start = np.where(obs, resid, _masked_mean(resid, w, axis=0)[None, :])
    k = min(rank, n_rows, n_cols)
    u_svd, s_svd, vt_svd = np.linalg.svd(start, full_matrices=False)
    u = np.zeros((n_rows, rank))
    v = np.zeros((n_cols, rank))
    u[:, :k] = u_svd[:, :k] * np.sqrt(s_svd[:k])
    v[:, :k] = vt_svd[:k].T * np.sqrt(s_svd[:k])

    extra = 1 if biases else 0
    penalty = np.diag(np.r_[np.full(rank, max(reg, 1e-12)), np.full(extra, 1e-12)])
    prev = _reconstruct(u, v, row_eff, col_eff)
    for _ in range(max_iter):
        # rows: solve [U_i, r_i] against design [V_j, 1] over observed j
        design = np.hstack([v, np.ones((n_cols, extra))])
        target = filled - col_eff[None, :]
        sol = _batched_ridge(w, target, design, penalty)
        u = sol[:, :rank]
        if biases:
            row_eff = sol[:, rank]
        # columns: solve [V_j, c_j] against design [U_i, 1] over observed i
        design = np.hstack([u, np.ones((n_rows, extra))])
        target = filled - row_eff[:, None]
        sol = _batched_ridge(w.T, target.T, design, penalty)
        v = sol[:, :rank]
        if biases:
            col_eff = sol[:, rank]
        cur = _reconstruct(u, v, row_eff, col_eff)
        if float(np.max(np.abs(cur - prev))) <= tol * scale:
            prev = cur
            break
        prev = cur
    else:
        log.debug("complete_low_rank: no convergence within %d iterations", max_iter)
    out = prev.copy()
    out[~obs.any(axis=1), :] = np.nan
    out[:, ~obs.any(axis=0)] = np.nan
    return out


def _masked_mean(values: FloatArray, w: FloatArray, axis: int) -> FloatArray:
    counts = w.sum(axis=axis)
    sums = (values * w).sum(axis=axis)
    result: FloatArray = np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)
    return result


def _reconstruct(u: FloatArray, v: FloatArray, row_eff: FloatArray, col_eff: FloatArray) -> FloatArray:
    out: FloatArray = u @ v.T + row_eff[:, None] + col_eff[None, :]
    return out


def _batched_ridge(w: FloatArray, target: FloatArray, design: FloatArray, penalty: FloatArray) -> FloatArray:
    """For every row i: argmin_x sum_j w[i,j] (target[i,j] - design[j] . x)^2 + x' penalty x."""
    if design.shape[1] == 0:
        return np.zeros((w.shape[0], 0))
    gram = np.einsum("ij,jk,jl->ikl", w, design, design) + penalty[None, :, :]
    rhs = np.einsum("ij,jk->ik", w * target, design)
    sol: FloatArray = np.linalg.solve(gram, rhs[:, :, None])[:, :, 0]
    return sol


# --- hardware log-linear model ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlopeFit:
    """Fitted slopes (on log bandwidth, on log FP32): pooled, and one row per job type (NaN if the job
    type has no measurement among the fitted accelerators)."""

    pooled: tuple[float, float]
    per_job: FloatArray


def _constrained_quadratic(h: FloatArray, g: FloatArray) -> FloatArray:
    """argmin_b b'Hb - 2 g'b over {b >= 0, b1 + b2 <= 1} (H positive definite), by enumerating the
    interior optimum and the optimum on each edge of the triangle (exact for a convex objective)."""

    def obj(b: FloatArray) -> float:
        return float(b @ h @ b - 2.0 * g @ b)

    candidates: list[FloatArray] = [np.asarray(np.linalg.solve(h, g), dtype=np.float64)]
    for p, d in (((0.0, 0.0), (0.0, 1.0)), ((0.0, 0.0), (1.0, 0.0)), ((1.0, 0.0), (-1.0, 1.0))):
        p_arr, d_arr = np.array(p), np.array(d)
        t = float(d_arr @ (g - h @ p_arr)) / float(d_arr @ h @ d_arr)
        candidates.append(p_arr + min(max(t, 0.0), 1.0) * d_arr)
    feasible = [b for b in candidates if b[0] >= -1e-12 and b[1] >= -1e-12 and b[0] + b[1] <= 1 + 1e-12]
    best = min(feasible, key=obj)
    return np.clip(best, 0.0, 1.0)


def fit_slopes(log_tput: npt.ArrayLike, features: npt.ArrayLike, config: EstimatorConfig) -> SlopeFit:
    """Fit the constrained, shrunk slopes of the hardware model.

    ``log_tput``: job types x accelerators, log steps/s, NaN where not measured (or cannot run);
    ``features``: accelerators x 2, ``(log bandwidth, log FP32)``.
    """
    y = np.asarray(log_tput, dtype=np.float64)
    x = np.asarray(features, dtype=np.float64)
    obs = np.isfinite(y)
    prior = np.asarray(config.prior_slopes, dtype=np.float64)
    centred: list[tuple[FloatArray, FloatArray] | None] = []
    h_pool = np.zeros((2, 2))
    g_pool = np.zeros(2)
    informative = 0
    for j in range(y.shape[0]):
        cols = obs[j]
        if not cols.any():
            centred.append(None)
            continue
        yc = y[j, cols] - y[j, cols].mean()
        xc = x[cols] - x[cols].mean(axis=0)
        centred.append((yc, xc))
        h_pool += xc.T @ xc
        g_pool += xc.T @ yc
        informative += int(cols.sum() >= 2)
    mu = config.pooled_prior_weight * max(informative, 1)
    pooled = _constrained_quadratic(h_pool + mu * np.eye(2), g_pool + mu * prior)
    lam = config.job_shrinkage
    per_job = np.full((y.shape[0], 2), np.nan)
    for j, item in enumerate(centred):
        if item is None:
            continue
        yc, xc = item
        per_job[j] = _constrained_quadratic(xc.T @ xc + lam * np.eye(2), xc.T @ yc + lam * pooled)
    return SlopeFit((float(pooled[0]), float(pooled[1])), per_job)


def predict_from_anchor(
    log_tput: npt.ArrayLike, features: npt.ArrayLike, slopes: npt.ArrayLike, target: npt.ArrayLike
) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    """Predicted log steps/s of every job type on an accelerator with features ``target``.

    Anchored on each job type's measured accelerator nearest to ``target`` in feature space (first on
    ties); the log ratio is clipped to the interval spanned by 0 and the two feature differences.
    Returns (predictions, anchor column index); NaN / -1 for job types without a usable measurement.
    """
    y = np.asarray(log_tput, dtype=np.float64)
    x = np.asarray(features, dtype=np.float64)
    b = np.asarray(slopes, dtype=np.float64)
    t = np.asarray(target, dtype=np.float64)
    obs = np.isfinite(y)
    dist = np.linalg.norm(x - t[None, :], axis=1)
    pred = np.full(y.shape[0], np.nan)
    anchor = np.full(y.shape[0], -1, dtype=np.int64)
    for j in range(y.shape[0]):
        if not obs[j].any() or not np.all(np.isfinite(b[j])):
            continue
        cols = np.flatnonzero(obs[j])
        a = int(cols[np.argmin(dist[cols])])
        delta = t - x[a]
        ratio = float(np.clip(b[j] @ delta, min(0.0, float(delta.min())), max(0.0, float(delta.max()))))
        pred[j] = y[j, a] + ratio
        anchor[j] = a
    return pred, anchor


# --- the catalog-level estimator --------------------------------------------------------------


def _log_positive(values: FloatArray) -> FloatArray:
    """log of positive finite entries; NaN for unknown and for 0 (cannot run: not a speed sample)."""
    out = np.full(values.shape, np.nan)
    ok = np.isfinite(values) & (values > 0)
    out[ok] = np.log(values[ok])
    return out


def estimate_catalog(
    catalog: ThroughputCatalog,
    specs: Mapping[str, AcceleratorSpec],
    *,
    accelerators: Iterable[str] | None = None,
    config: EstimatorConfig | None = None,
    precision: Precision = DEFAULT_PRECISION,
    calibration: Iterable[CalibrationRow] | None = None,
) -> ThroughputCatalog:
    """The catalog's measured/user cells plus estimates for every unknown cell the estimators can fill.

    ``accelerators``: targets of the hardware model (default: every accelerator in ``specs``). Previous
    estimates in ``catalog`` are discarded and refitted. Only accelerators with a row in ``specs`` get
    hardware estimates; without specs for the measured accelerators, no hardware model is fitted.

    ``precision``: the jobs' precision. The file's ``measured`` cells are taken to be at the default
    ``fp32`` (Gavel's jobs ran in FP32), ``user`` cells at ``precision`` (:func:`valid_at_precision`); a
    file cell is kept only where the job computes the same way at both (``tf32`` on a GPU without TF32;
    see :func:`costopt.throughput.calibrated.compute_class`) and the others are estimated, which only the
    ``family-calibrated`` estimator does with precision (the baseline estimates every precision as
    ``fp32``). Multi-GPU cells scale by the reference's measured ratio at the measured precision.
    ``calibration``: the published rows the calibrated estimator fits on (default: the shipped set).
    """
    cfg = config or EstimatorConfig()
    measured = catalog.measured_only()
    base = valid_at_precision(measured, specs, precision)
    jobs = base.job_types()
    if not jobs:
        return base
    _, accs, measured_1gpu = base.matrix(1, "consolidated", accelerators=base.accelerators())
    estimates: dict[ThroughputKey, Throughput] = {}

    # 1. low-rank completion over the well-covered accelerators
    logs = _log_positive(measured_1gpu)
    runs = np.isfinite(logs)
    n_rows = int(runs.any(axis=1).sum())
    cover = runs.sum(axis=0)
    comp_cols = [c for c in range(len(accs)) if cover[c] >= max(2, cfg.completion_min_coverage * n_rows)]
    if len(comp_cols) >= 2:
        sub = logs[:, comp_cols]
        rows = np.flatnonzero(np.isfinite(sub).any(axis=1))
        full = complete_low_rank(sub[rows], cfg.completion_rank, reg=cfg.completion_reg, biases=True)
        for ri, row in enumerate(rows):
            for ci, col in enumerate(comp_cols):
                if np.isnan(measured_1gpu[row, col]) and np.isfinite(full[ri, ci]):
                    value = float(np.exp(full[ri, ci]))
                    estimates[ThroughputKey(jobs[row], accs[col])] = Throughput(
                        value, "estimated", 0, ESTIMATOR_LOWRANK
                    )

    # 2. accelerators the job type was not measured on, from specs (and the calibration set)
    # (fitted on every measured cell, at the measurement precision, whatever ``precision`` is)
    _, m_accs, m_values = measured.matrix(1, "consolidated", accelerators=measured.accelerators())
    m_logs = _log_positive(m_values)
    fit_cols = [c for c in range(len(m_accs)) if m_accs[c] in specs and np.isfinite(m_logs[:, c]).any()]
    fit_accs = [m_accs[c] for c in fit_cols]
    targets = [normalize_accelerator(a) for a in (accelerators if accelerators is not None else specs)]
    if fit_cols:
        y = m_logs[:, fit_cols]
        mem = np.array([specs[a].memory_gb for a in fit_accs])
        min_mem = np.array(
            [mem[np.isfinite(y[j])].min() if np.isfinite(y[j]).any() else np.inf for j in range(len(jobs))]
        )
        if cfg.hardware_estimator == ESTIMATOR_CALIBRATED:
            user = np.array(
                [[_provenance(measured, jt, acc) == "user" for acc in fit_accs] for jt in jobs], dtype=bool
            ).reshape(len(jobs), len(fit_accs))
            predict = _calibrated_predictor(jobs, fit_accs, y, user, specs, precision, calibration)
        else:
            predict = _loglinear_predictor(y, fit_accs, specs, cfg)
        from costopt.throughput.uncertainty import error_factor, load_error_factors, with_interval

        factors = load_error_factors()
        job_factor = [error_factor(cfg.hardware_estimator, family_of(jt), factors) for jt in jobs]
        for target in targets:
            if target not in specs:
                log.warning("no accelerator specs for %s: not estimated", target)
                continue
            pred = predict(target)
            for j, jt in enumerate(jobs):
                key = ThroughputKey(jt, target)
                if key in base.cells or key in estimates or not np.isfinite(pred[j]):
                    continue
                if cfg.memory_guard and specs[target].memory_gb < min_mem[j]:
                    continue
                estimate = Throughput(float(np.exp(pred[j])), "estimated", 0, cfg.hardware_estimator)
                estimates[key] = with_interval(estimate, job_factor[j])
    else:
        log.warning("no measured accelerator has specs: no hardware estimates")

    # 3. multi-GPU cells by the reference accelerator's measured scaling ratio
    ref = normalize_accelerator(cfg.scaling_reference)
    all_accs = accelerator_order([*m_accs, *(t for t in targets if t in specs)])

    def one_gpu(key: ThroughputKey) -> Throughput | None:
        return base.cells.get(key) or estimates.get(key)

    for ref_key, ref_cell in measured.cells.items():
        if ref_key.accelerator != ref or ref_key.gpu_count == 1 or not ref_cell.can_run:
            continue
        jt, n, placement = ref_key.job_type, ref_key.gpu_count, ref_key.placement
        ref_one = measured.cells.get(ThroughputKey(jt, ref))
        if ref_one is None or not ref_one.can_run:
            continue
        ratio = min(ref_cell.steps_per_s / ref_one.steps_per_s, n * cfg.max_scaling_efficiency)
        other: Placement = "spread" if placement == "consolidated" else "consolidated"
        for acc in all_accs:
            t1 = one_gpu(ThroughputKey(jt, acc))
            key = ThroughputKey(jt, acc, n, placement)
            other_cell = base.cells.get(ThroughputKey(jt, acc, n, other))
            if t1 is None or not t1.can_run or key in base.cells or (other_cell is not None and not other_cell.can_run):
                continue
            interval = (t1.interval[0] * ratio, t1.interval[1] * ratio) if t1.interval is not None else None
            estimates[key] = Throughput(t1.steps_per_s * ratio, "estimated", 0, ESTIMATOR_SCALING, interval)

    log.info(
        "estimated %d cells (%s)",
        len(estimates),
        ", ".join(
            f"{name}: {sum(1 for v in estimates.values() if v.estimator == name)}"
            for name in (ESTIMATOR_LOWRANK, *HARDWARE_ESTIMATORS, ESTIMATOR_SCALING)
        ),
    )
    return base.with_estimates(estimates)


def _provenance(catalog: ThroughputCatalog, job_type: JobType, accelerator: str) -> str | None:
    cell = catalog.cells.get(ThroughputKey(job_type, accelerator))
    return None if cell is None else cell.provenance


def valid_at_precision(
    measured: ThroughputCatalog, specs: Mapping[str, AcceleratorSpec], precision: Precision
) -> ThroughputCatalog:
    """The cells that hold at ``precision``: every ``user`` cell (users' and jobs' measurements, folded in
    at the catalog's precision) and the file's ``measured`` cells (taken at ``fp32``) where the job
    computes the same way at both (a cell on a GPU without specs is kept for ``tf32`` only). The
    registry never averages a measurement of another precision with an ``fp32`` file value
    (:meth:`~costopt.throughput.registry.MeasurementRegistry.apply`)."""
    if precision == DEFAULT_PRECISION:
        return measured
    from costopt.throughput.calibrated import compute_class

    def same(key: ThroughputKey) -> bool:
        spec = specs.get(key.accelerator)
        if spec is None:
            return precision == "tf32"
        fam = family_of(key.job_type)
        return compute_class(precision, fam, spec) == compute_class(DEFAULT_PRECISION, fam, spec)

    cells = {k: v for k, v in measured.cells.items() if v.provenance == "user" or same(k)}
    return ThroughputCatalog(cells, measured.pairs, measured.job_type_order)


def _loglinear_predictor(
    y: FloatArray, fit_accs: list[str], specs: Mapping[str, AcceleratorSpec], cfg: EstimatorConfig
) -> Callable[[str], FloatArray]:
    x = np.array([specs[a].features() for a in fit_accs])
    fit = fit_slopes(y, x, cfg)
    log.info("hardware model: pooled slopes (bandwidth, fp32) = (%.3f, %.3f) over %s", *fit.pooled, fit_accs)

    def predict(target: str) -> FloatArray:
        pred, _ = predict_from_anchor(y, x, fit.per_job, np.array(specs[target].features()))
        return pred

    return predict


def _calibrated_predictor(
    jobs: Sequence[JobType],
    fit_accs: list[str],
    y: FloatArray,
    user: npt.NDArray[np.bool_],
    specs: Mapping[str, AcceleratorSpec],
    precision: Precision,
    calibration: Iterable[CalibrationRow] | None,
) -> Callable[[str], FloatArray]:
    """The family-calibrated model fitted on the catalog's measured 1-GPU cells (the file's at ``fp32``,
    the ``user`` ones at ``precision``) and the calibration set; predicts every job type at ``precision``."""
    from costopt.throughput.calibrated import Observation, fit_calibrated
    from costopt.throughput.calibration import cells_from, load_calibration

    rows = load_calibration(specs=specs) if calibration is None else calibration
    obs = [Observation(c.series, c.family, c.precision, c.gpu, c.log_throughput) for c in cells_from(rows, None, specs)]
    fams = [family_of(jt) for jt in jobs]
    for j, jt in enumerate(jobs):
        for col, acc in enumerate(fit_accs):
            if np.isfinite(y[j, col]):
                at = precision if user[j, col] else DEFAULT_PRECISION
                obs.append(Observation(f"catalog|{jt.name}", fams[j], at, acc, float(y[j, col])))
    model = fit_calibrated(obs, specs)

    def predict(target: str) -> FloatArray:
        out = np.full(len(jobs), np.nan)
        for j, jt in enumerate(jobs):
            value = model.predict_log(f"catalog|{jt.name}", precision, specs[target], fams[j])
            if value is not None:
                out[j] = value
        return out

    return predict
