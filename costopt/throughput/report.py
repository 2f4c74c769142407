"""How wrong the throughput estimators are, measured on held-out measured cells (1 GPU).

* **Hardware model, leave one accelerator out**: for each measured accelerator (K80, P100, V100), all
  its cells are hidden, the model of :mod:`costopt.throughput.estimate` is fitted on the others and
  predicts them (anchored on the nearest remaining accelerator), as if it were a new GPU.
  Caveat, read the figures with it: with three measured generations, holding out K80 or V100 means
  *extrapolating* past the end of the feature range (older than P100 / newer than P100), with slopes
  fitted on a single pair of accelerators whose feature difference has one direction only (the prior
  decides the split between bandwidth and compute). Holding out P100 is an interpolation. Estimating
  an H100 from V100 is a larger extrapolation still than any of these, so these errors are a lower
  bound on the error for the newest GPUs. Gavel's data also holds anomalies no hardware model can
  follow (Recommendation runs slower on V100 than on K80), which dominate the 90th percentiles.
  Baselines with fixed slopes (no change from the anchor, bandwidth ratio, FP32 ratio) are reported
  alongside, so the model's value over them is visible.
* **Low-rank completion, random 20% of cells hidden** (seeded, repeated; every job type and every
  accelerator keeps at least one cell), errors pooled over the repeats.

Error = absolute percentage error ``|estimate / measured - 1| * 100``; cells measured as "cannot
run" (0) are excluded. The hyper-parameters (:class:`EstimatorConfig` defaults) were chosen among a few
values while looking at these same figures, so they are somewhat optimistic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from costopt.domain import normalize_accelerator
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.errors import InvalidThroughput
from costopt.throughput.estimate import (
    AcceleratorSpec,
    EstimatorConfig,
    complete_low_rank,
    fit_slopes,
    predict_from_anchor,
)
from costopt.throughput.registry import Measurement

FloatArray = npt.NDArray[np.float64]

BASELINE_SLOPES: Mapping[str, tuple[float, float]] = {
    "same-as-anchor": (0.0, 0.0),
    "bandwidth-ratio": (1.0, 0.0),
    "fp32-ratio": (0.0, 1.0),
}


@dataclass(frozen=True, slots=True)
class ErrorFigures:
    """Absolute percentage errors over ``n_cells`` held-out cells (``label``: what was held out)."""

    label: str
    n_cells: int
    median_ape_pct: float
    p90_ape_pct: float


@dataclass(frozen=True, slots=True)
class EstimatorReport:
    """Leave-one-accelerator-out errors of the hardware model (one row per held-out accelerator, then
    ``overall``), the same for fixed-slope baselines, and the low-rank completion's holdout errors."""

    accelerators: tuple[str, ...]
    n_job_types: int
    hardware_loao: tuple[ErrorFigures, ...]
    baselines: tuple[tuple[str, tuple[ErrorFigures, ...]], ...]
    completion: ErrorFigures
    holdout_fraction: float
    repeats: int
    seed: int
    config: EstimatorConfig


def _figures(label: str, ape: FloatArray) -> ErrorFigures:
    if ape.size == 0:
        return ErrorFigures(label, 0, float("nan"), float("nan"))
    return ErrorFigures(label, int(ape.size), float(np.median(ape)), float(np.percentile(ape, 90)))


def _ape(log_pred: FloatArray, log_true: FloatArray) -> FloatArray:
    ok = np.isfinite(log_pred) & np.isfinite(log_true)
    out: FloatArray = np.abs(np.expm1(log_pred[ok] - log_true[ok])) * 100.0
    return out


def _loao(
    y: FloatArray, x: FloatArray, accs: Sequence[str], config: EstimatorConfig, fixed: tuple[float, float] | None
) -> tuple[ErrorFigures, ...]:
    rows: list[ErrorFigures] = []
    pooled: list[FloatArray] = []
    for h, acc in enumerate(accs):
        keep = [c for c in range(len(accs)) if c != h]
        y_train, x_train = y[:, keep], x[keep]
        if fixed is None:
            slopes = fit_slopes(y_train, x_train, config).per_job
        else:
            slopes = np.tile(np.asarray(fixed, dtype=np.float64), (y.shape[0], 1))
        pred, _ = predict_from_anchor(y_train, x_train, slopes, x[h])
        ape = _ape(pred, y[:, h])
        pooled.append(ape)
        rows.append(_figures(acc, ape))
    rows.append(_figures("overall", np.concatenate(pooled) if pooled else np.array([])))
    return tuple(rows)


def _holdout_mask(obs: npt.NDArray[np.bool_], fraction: float, rng: np.random.Generator) -> npt.NDArray[np.bool_]:
    """Hide round(fraction * observed) observed cells, never a row's or column's last observed cell."""
    hidden = np.zeros_like(obs)
    left_rows = obs.sum(axis=1)
    left_cols = obs.sum(axis=0)
    target = round(fraction * int(obs.sum()))
    for flat in rng.permutation(np.flatnonzero(obs.ravel())):
        if int(hidden.sum()) >= target:
            break
        i, j = divmod(int(flat), obs.shape[1])
        if left_rows[i] > 1 and left_cols[j] > 1:
            hidden[i, j] = True
            left_rows[i] -= 1
            left_cols[j] -= 1
    return hidden


def estimator_error_report(
    catalog: ThroughputCatalog,
    specs: Mapping[str, AcceleratorSpec],
    *,
    accelerators: Sequence[str] = ("k80", "p100", "v100"),
    holdout_fraction: float = 0.2,
    repeats: int = 10,
    seed: int = 0,
    config: EstimatorConfig | None = None,
) -> EstimatorReport:
    """Measure both estimators on the catalog's measured 1-GPU cells of ``accelerators`` (see module doc).

    Needs specs for every accelerator and at least two of them; estimated cells of the catalog are ignored.
    """
    cfg = config or EstimatorConfig()
    accs = tuple(normalize_accelerator(a) for a in accelerators)
    if len(accs) < 2:
        raise InvalidThroughput("leave-one-accelerator-out needs at least two accelerators")
    missing = [a for a in accs if a not in specs]
    if missing:
        raise InvalidThroughput(f"no accelerator specs for {missing}")
    if not 0 < holdout_fraction < 1 or repeats < 1:
        raise InvalidThroughput("holdout_fraction must be in (0, 1) and repeats >= 1")
    _, _, values = catalog.measured_only().matrix(1, "consolidated", accelerators=accs)
    y = np.full(values.shape, np.nan)
    ok = np.isfinite(values) & (values > 0)
    y[ok] = np.log(values[ok])
    y = y[np.isfinite(y).any(axis=1)]
    x = np.array([specs[a].features() for a in accs])

    hardware = _loao(y, x, accs, cfg, None)
    baselines = tuple((name, _loao(y, x, accs, cfg, slopes)) for name, slopes in BASELINE_SLOPES.items())

    rng = np.random.default_rng(seed)
    obs = np.isfinite(y)
    errors: list[FloatArray] = []
    for _ in range(repeats):
        hidden = _holdout_mask(obs, holdout_fraction, rng)
        masked = np.where(hidden, np.nan, y)
        full = complete_low_rank(masked, cfg.completion_rank, reg=cfg.completion_reg, biases=True)
        errors.append(_ape(full[hidden], y[hidden]))
    completion = _figures(f"random {holdout_fraction:.0%} of cells x {repeats}", np.concatenate(errors))
    return EstimatorReport(accs, int(y.shape[0]), hardware, baselines, completion, holdout_fraction, repeats, seed, cfg)


def render_markdown(report: EstimatorReport) -> str:
    """The report as a small markdown document (tables of median and 90th-percentile APE, %)."""

    def table(rows: Sequence[ErrorFigures], first: str) -> list[str]:
        out = [f"| {first} | cells | median APE % | p90 APE % |", "|---|---:|---:|---:|"]
        out += [f"| {r.label} | {r.n_cells} | {r.median_ape_pct:.1f} | {r.p90_ape_pct:.1f} |" for r in rows]
        return out

    cfg = report.config
    lines = [
        "# Throughput estimator error",
        "",
        f"{report.n_job_types} job types measured on {', '.join(report.accelerators)} (1 GPU).",
        "",
        "## Hardware model, leave one accelerator out",
        "",
        f"Slopes on (log bandwidth, log FP32): prior {cfg.prior_slopes}, pooled weight "
        f"{cfg.pooled_prior_weight}, per-job shrinkage {cfg.job_shrinkage}. Held-out K80 and V100 are "
        "extrapolations at the ends of the feature range.",
        "",
        *table(report.hardware_loao, "held out"),
        "",
        "### Fixed-slope baselines (same anchor)",
        "",
    ]
    for name, rows in report.baselines:
        overall = rows[-1]
        per_acc = ", ".join(f"{r.label} {r.median_ape_pct:.0f}/{r.p90_ape_pct:.0f}" for r in rows[:-1])
        lines.append(
            f"- {name}: overall median {overall.median_ape_pct:.1f}%, p90 {overall.p90_ape_pct:.1f}% "
            f"(median/p90 per accelerator: {per_acc})"
        )
    lines += [
        "",
        "## Low-rank completion, random holdout",
        "",
        f"Rank {cfg.completion_rank} interaction + row/column effects in log space, ridge {cfg.completion_reg}; "
        f"{report.holdout_fraction:.0%} of cells hidden, {report.repeats} repeats, seed {report.seed}.",
        "",
        *table([report.completion], "held out"),
        "",
    ]
    return "\n".join(lines)


# --- measured (by users and running jobs) vs what the catalog said before -----------------------


@dataclass(frozen=True, slots=True)
class ObservedRow:
    """Measurements of a job type on ``gpu_count`` GPUs of an accelerator at a precision (users' and
    jobs', count-weighted mean of ``n_measurements`` windows) against the *prior*: what the catalog held
    for that cell from everything else (the file and every measurement on other accelerators), measured
    (a file value) or estimated (named estimator, interval when it has one). ``ratio`` = measured / prior."""

    job_type: str
    accelerator: str
    gpu_count: int
    precision: str
    measured: float
    n_measurements: int
    prior: float | None
    prior_provenance: str | None
    prior_estimator: str | None
    prior_interval: tuple[float, float] | None

    @property
    def ratio(self) -> float | None:
        return self.measured / self.prior if self.prior else None


def measured_vs_prior(
    base: ThroughputCatalog, measurements: Sequence[Measurement], specs: Mapping[str, AcceleratorSpec]
) -> list[ObservedRow]:
    """One row per measured cell (see :class:`ObservedRow`); the prior of the cells on one accelerator
    comes from one estimate of ``base`` plus the measurements on the other accelerators."""
    from costopt.throughput.estimate import estimate_catalog
    from costopt.throughput.registry import source_precision

    by_group: dict[tuple[str, str], list[Measurement]] = {}
    for m in measurements:
        by_group.setdefault((source_precision(m.source), normalize_accelerator(m.accelerator)), []).append(m)
    rows: list[ObservedRow] = []
    for (precision, acc), here in sorted(by_group.items()):
        catalog = base
        for m in measurements:
            if source_precision(m.source) == precision and normalize_accelerator(m.accelerator) != acc:
                catalog = catalog.with_measurement(
                    m.job_type, m.accelerator, m.gpu_count, m.steps_per_s, placement=m.placement,
                    n_measurements=m.n_measurements,
                )  # fmt: skip
        prior_catalog = estimate_catalog(catalog, specs, precision=precision)  # type: ignore[arg-type]
        cells: dict[tuple[str, int, str], list[Measurement]] = {}
        for m in here:
            cells.setdefault((m.job_type.name, m.gpu_count, m.placement), []).append(m)
        for (name, gpus, placement), ms in sorted(cells.items()):
            n = sum(m.n_measurements for m in ms)
            mean = sum(m.steps_per_s * m.n_measurements for m in ms) / n
            prior = prior_catalog.get(name, acc, gpus, placement)  # type: ignore[arg-type]
            rows.append(
                ObservedRow(
                    name, acc, gpus, precision, mean, n,
                    prior.steps_per_s if prior is not None else None,
                    prior.provenance if prior is not None else None,
                    prior.estimator if prior is not None else None,
                    prior.interval if prior is not None else None,
                )
            )  # fmt: skip
    return rows
