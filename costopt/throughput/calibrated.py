"""The ``family-calibrated`` throughput estimator: GPU-to-GPU speed ratios by model family and precision,
fitted on Gavel's measurements and the published calibration set together.

Model (one least-squares fit over every observation, log throughput ``y``)::

    y[s, g] = a[s] + o[f, k] + b[f, k] * log(bandwidth[g] / 900) + c[f, k] * log(rate_k[g] / 15.7)

* ``s`` a *series*: one model as one source measured it (a Gavel job type; a published model in one
  source's tables). ``a[s]`` is its own speed level, in its own unit; only ratios carry over.
* ``f`` the series' model family; ``k`` the *compute class* of the observation
  (:func:`compute_class`): ``amp`` runs on FP16 tensor cores; ``tf32`` on TF32 tensor cores (asked for,
  or a conv-dominated family under PyTorch's default, on a GPU that has them); ``fp32`` otherwise.
  ``rate_k[g]`` is the GPU's peak rate for that class (FP32 / TF32 / FP16 tensor TFLOPS,
  ``data/accelerators.csv``); 900 GB/s and 15.7 TFLOPS (a V100) only centre the features.
* ``o[f, k]`` is the level of class ``k`` against ``fp32`` (``o[f, fp32] = 0``): the mixed-precision
  gain at V100-like features, learnt from series measured at both precisions.
* Hierarchy: every family's ``(o, b, c)`` is shrunk toward the class's pooled values (ridge
  ``family_shrinkage``), the pooled slopes toward ``prior_slopes`` (ridge ``prior_weight``); slopes are
  bounded to ``[0, 1]``. A family without data for a class (the calibration set has no RL or GAN
  figures) therefore gets the pooled values, and a model of unknown family the pooled ones too.

Prediction for a series on a GPU it was not measured on is ``a[s] + o + b*x_bw + c*x_rate`` with the
series' level fitted from all its other observations (not anchored on one GPU as ``hardware-loglinear``
is). Its error is measured by leaving one GPU out (:mod:`costopt.throughput.crossval`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from costopt.throughput.errors import InvalidThroughput
from costopt.throughput.model import (
    CONV_DOMINATED_FAMILIES,
    PRECISIONS,
    ModelFamily,
    Precision,
)
from costopt.throughput.specs import AcceleratorSpec

FloatArray = npt.NDArray[np.float64]

log = logging.getLogger(__name__)

ESTIMATOR_CALIBRATED = "family-calibrated"

_BW_REF = 900.0
_RATE_REF = 15.7
POOLED = "*"
"""The family key of the pooled (all families) parameters; used for a series of unknown family."""


def compute_class(precision: Precision, family: ModelFamily | None, spec: AcceleratorSpec) -> Precision:
    """What arithmetic a job of ``family`` at ``precision`` runs on this GPU (see the module doc)."""
    if precision == "amp":
        return "amp"
    if not spec.has_tf32:
        return "fp32"
    if precision == "tf32" or family in CONV_DOMINATED_FAMILIES:
        return "tf32"
    return "fp32"


def features(spec: AcceleratorSpec, compute: Precision) -> tuple[float, float, float]:
    """The centred regressors ``(log bandwidth, log rate of the compute class, log FP32 rate)`` of one
    GPU; the last is 0 for the ``fp32`` class, whose rate it already is."""
    return (
        math.log(spec.memory_bandwidth_gbps / _BW_REF),
        math.log(spec.rate_tflops(compute) / _RATE_REF),
        math.log(spec.fp32_tflops / _RATE_REF) if compute != "fp32" else 0.0,
    )


@dataclass(frozen=True, slots=True)
class Observation:
    """A measured log throughput of series ``series`` (family ``family``, None = unknown) at
    ``precision`` on ``gpu``."""

    series: str
    family: ModelFamily | None
    precision: Precision
    gpu: str
    log_throughput: float


@dataclass(frozen=True, slots=True)
class CalibratedConfig:
    """Ridge weights of the fit (see the module doc)."""

    prior_slopes: tuple[float, float] = (0.5, 0.5)
    prior_weight: float = 1.0
    family_shrinkage: float = 4.0
    offset_shrinkage: float = 1.0
    series_shrinkage: float = 2.0

    def __post_init__(self) -> None:
        for name in ("prior_weight", "family_shrinkage", "offset_shrinkage", "series_shrinkage"):
            if not getattr(self, name) > 0:
                raise InvalidThroughput(f"{name} must be > 0, got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class FamilyParams:
    """``(offset against fp32, bandwidth slope, class-rate slope, FP32-rate slope)`` of one family and
    compute class (``e`` is 0 for the ``fp32`` class)."""

    offset: float
    b: float
    c: float
    e: float = 0.0


@dataclass(frozen=True, slots=True)
class CalibratedModel:
    """A fitted model: parameters per (family or :data:`POOLED`, compute class) and each series' level."""

    params: Mapping[tuple[str, Precision], FamilyParams]
    levels: Mapping[str, float]
    families: Mapping[str, ModelFamily | None] = field(default_factory=dict)
    deviations: Mapping[tuple[str, Precision], FamilyParams] = field(default_factory=dict)
    """A series' own departure from its family's ``(offset, b, c)`` in a class it was measured in."""

    def params_for(self, family: ModelFamily | None, compute: Precision) -> FamilyParams:
        key = (family if family is not None else POOLED, compute)
        return self.params.get(key) or self.params[(POOLED, compute)]

    def predict_log(
        self, series: str, precision: Precision, spec: AcceleratorSpec, family: ModelFamily | None = None
    ) -> float | None:
        """Predicted log throughput of ``series`` at ``precision`` on ``spec``'s GPU (None: series unknown)."""
        level = self.levels.get(series)
        if level is None:
            return None
        fam = self.families.get(series, family)
        k = compute_class(precision, fam, spec)
        p = self.params_for(fam, k)
        d = self.deviations.get((series, k), FamilyParams(0.0, 0.0, 0.0))
        x_bw, x_rate, x_fp32 = features(spec, k)
        return level + p.offset + d.offset + (p.b + d.b) * x_bw + (p.c + d.c) * x_rate + p.e * x_fp32


def fit_calibrated(
    observations: Iterable[Observation],
    specs: Mapping[str, AcceleratorSpec],
    config: CalibratedConfig | None = None,
) -> CalibratedModel:
    """Fit the model on ``observations`` (one bounded least-squares problem, :func:`bounded_lstsq`).

    Observations on GPUs without specs are ignored. Raises :class:`InvalidThroughput` when nothing is left.
    """
    cfg = config or CalibratedConfig()
    obs = [o for o in observations if o.gpu in specs and math.isfinite(o.log_throughput)]
    if not obs:
        raise InvalidThroughput("the calibrated estimator needs at least one observation on a GPU with specs")
    series = sorted({o.series for o in obs})
    fam_of: dict[str, ModelFamily | None] = {}
    for o in obs:
        fam_of.setdefault(o.series, o.family)
    fams = sorted({f for f in fam_of.values() if f is not None})
    groups: list[tuple[str, Precision]] = [(g, k) for g in [POOLED, *fams] for k in PRECISIONS]

    # parameter layout: a[s] | per group: (o if k != fp32), b, c | per (series, class) seen: do, db, dc
    classes: dict[tuple[str, Precision], None] = {}
    for o in obs:
        classes.setdefault((o.series, compute_class(o.precision, o.family, specs[o.gpu])), None)
    index: dict[tuple[str, str, str], int] = {}
    n = 0
    for s in series:
        index[("a", s, "")] = n
        n += 1
    for g, k in groups:
        names = ("o", "b", "c", "e") if k != "fp32" else ("b", "c")
        for name in names:
            index[(name, g, k)] = n
            n += 1
    for s_name, k in classes:
        for name in ("do", "db", "dc") if k != "fp32" else ("db", "dc"):
            index[(name, s_name, k)] = n
            n += 1

    rows: list[FloatArray] = []
    targets: list[float] = []

    def row(entries: Sequence[tuple[int, float]], target: float) -> None:
        r = np.zeros(n)
        for i, v in entries:
            r[i] += v
        rows.append(r)
        targets.append(target)

    for o in obs:
        g = o.family if o.family is not None else POOLED
        k = compute_class(o.precision, o.family, specs[o.gpu])
        x_bw, x_rate, x_fp32 = features(specs[o.gpu], k)
        entries = [(index[("a", o.series, "")], 1.0), (index[("b", g, k)], x_bw), (index[("c", g, k)], x_rate)]
        entries += [(index[("db", o.series, k)], x_bw), (index[("dc", o.series, k)], x_rate)]
        if k != "fp32":
            entries += [(index[("o", g, k)], 1.0), (index[("do", o.series, k)], 1.0), (index[("e", g, k)], x_fp32)]
        row(entries, o.log_throughput)
    rho = math.sqrt(cfg.series_shrinkage)
    for (name, _, _), i in index.items():
        if name in ("do", "db", "dc"):
            row([(i, rho)], 0.0)
    lam, mu, nu = math.sqrt(cfg.family_shrinkage), math.sqrt(cfg.prior_weight), math.sqrt(cfg.offset_shrinkage)
    for k in PRECISIONS:
        row([(index[("b", POOLED, k)], mu)], mu * cfg.prior_slopes[0])
        row([(index[("c", POOLED, k)], mu)], mu * cfg.prior_slopes[1])
        if k != "fp32":
            row([(index[("o", POOLED, k)], 1e-3)], 0.0)  # pins the pooled offset when no family has class k
            row([(index[("e", POOLED, k)], mu)], 0.0)
        for f in fams:
            for name, w in (("b", lam), ("c", lam), ("o", nu), ("e", lam)):
                if name in ("o", "e") and k == "fp32":
                    continue
                row([(index[(name, f, k)], w), (index[(name, POOLED, k)], -w)], 0.0)

    lower = np.full(n, -np.inf)
    upper = np.full(n, np.inf)
    for (name, _, _), i in index.items():
        if name in ("b", "c", "e"):
            lower[i], upper[i] = 0.0, 1.0
    x = bounded_lstsq(np.vstack(rows), np.asarray(targets), lower, upper)

    params: dict[tuple[str, Precision], FamilyParams] = {}
    for g, k in groups:
        offset, e = (float(x[index[("o", g, k)]]), float(x[index[("e", g, k)]])) if k != "fp32" else (0.0, 0.0)
        params[(g, k)] = FamilyParams(offset, float(x[index[("b", g, k)]]), float(x[index[("c", g, k)]]), e)
    levels = {s: float(x[index[("a", s, "")]]) for s in series}
    deviations = {
        (s_name, k): FamilyParams(
            float(x[index[("do", s_name, k)]]) if k != "fp32" else 0.0,
            float(x[index[("db", s_name, k)]]),
            float(x[index[("dc", s_name, k)]]),
        )
        for s_name, k in classes
    }
    return CalibratedModel(params, levels, fam_of, deviations)


def bounded_lstsq(
    a: FloatArray, b: FloatArray, lower: FloatArray, upper: FloatArray, *, max_iter: int = 200
) -> FloatArray:
    """argmin ||a x - b||^2 subject to lower <= x <= upper (infinite bounds allowed), by an active-set
    method: solve on the free variables (numpy's ``lstsq``), fix the worst violated bound, free a fixed
    variable whose gradient points inside, until the KKT conditions hold. ``a`` must have full column
    rank on every free set (the fit's ridge rows see to it). Exact for this convex problem; on the
    fit's few hundred columns much faster than scipy's ``bvls``."""
    n = a.shape[1]
    x = np.clip(np.zeros(n), lower, upper)
    at_bound = np.zeros(n, dtype=bool)  # variables held at a bound (x holds which one)
    tol = 1e-10
    for _ in range(max_iter):
        free = ~at_bound
        rhs = b - a[:, at_bound] @ x[at_bound]
        sol, *_ = np.linalg.lstsq(a[:, free], rhs, rcond=None)
        trial = x.copy()
        trial[free] = sol
        low_viol = free & (trial < lower - tol)
        high_viol = free & (trial > upper + tol)
        if low_viol.any() or high_viol.any():
            # step from x toward the trial point until the first bound is met, and hold that variable
            step = np.ones(n)
            d = trial - x
            with np.errstate(divide="ignore", invalid="ignore"):
                step[low_viol] = np.where(d[low_viol] < 0, (lower[low_viol] - x[low_viol]) / d[low_viol], 1.0)
                step[high_viol] = np.where(d[high_viol] > 0, (upper[high_viol] - x[high_viol]) / d[high_viol], 1.0)
            i = int(np.argmin(np.where(low_viol | high_viol, step, np.inf)))
            alpha = float(np.clip(step[i], 0.0, 1.0))
            x = np.clip(x + alpha * d, lower, upper)
            x[i] = lower[i] if low_viol[i] else upper[i]
            at_bound[i] = True
            continue
        x = trial
        grad = a.T @ (a @ x - b)
        wants_in = at_bound & (((x <= lower + tol) & (grad < -tol)) | ((x >= upper - tol) & (grad > tol)))
        if not wants_in.any():
            return x
        at_bound[int(np.argmax(np.where(wants_in, np.abs(grad), -np.inf)))] = False
    log.warning("bounded_lstsq: no convergence in %d iterations", max_iter)
    return x
