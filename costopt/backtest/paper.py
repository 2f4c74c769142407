"""The dynamic-pricing paper's cost analysis (DISPA 2020), reproduced on the project's own engine.

Method (as issue 5 states it):

- **Prices**: the AWS spot history of one region (us-east-1, us-west-2) for p2.xlarge/8xlarge/16xlarge
  (K80 x 1/8/16) and p3.2xlarge/8xlarge/16xlarge (V100 x 1/4/8), every availability zone, plus the Azure
  daily spot prices of eastus, northcentralus and southcentralus (NC = K80, NCv2 = P100, NCv3 = V100).
  One period is one UTC day from 00:00; an offer's price for a day is the price in effect at the end
  of the day; an offer exists from its first known price on (Azure from 2020-02-24); a job that
  outlives the data keeps the last known prices (counted in :attr:`PaperCell.outlived`).
- **Throughput**: single-GPU isolated throughputs of the paper's file for six models; a job of ``N``
  V100-days has ``N x 86,400 x`` its V100 steps/s steps.
- **Start days**: the 35th- to the 6th-latest distinct days on which the region's p3.2xlarge spot price
  changed (30 days); each job starts at 00:00 UTC. A policy's figure is its mean cost over the start
  days; its cost reduction is the baseline's mean cost over its own.
- **Policies**, choosing by throughput per dollar (per-GPU price: instance price / GPU count):
  ``baseline`` (cheapest-AZ p3.2xlarge, chosen on the start day, kept), ``gpu_type`` (p2.xlarge or
  p3.2xlarge), ``multi_gpu`` (the six AWS types), ``multi_cloud`` (also the Azure sizes, chosen once),
  ``dynamic`` (re-chosen every day, free moves), ``dynamic_migration_cost`` (the migration decision rule
  every day, each move paid: checkpoint egress, restart, overlap). Two further static baselines are
  reported apart: ``on_demand`` (the region's p3.2xlarge at its 2020 list price) and ``on_demand_best``
  (the best on-demand offer by throughput per dollar among the same AWS types and Azure sizes).

List prices: the curated ``list_prices.csv`` rows of 2020 are dated 2020-05-06 (the snapshot they come
from); they are used as the 2020 list price of their cloud/region/type for the whole study window,
regardless of that date. Each offer's earliest list price is the one taken.

The core takes price frames; :func:`load_paper_inputs` reads them from any object with the price
store's ``history`` method (:class:`PriceHistory`), so nothing here imports the pricing package.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pandas as pd

from costopt.backtest.engine import (
    BacktestResult,
    CostCube,
    JobBatch,
    PlacementPolicy,
    build_cost_cube,
    mean_usd,
    run_backtest,
)
from costopt.backtest.grid import KEY_COLUMNS, BacktestError, OfferSet, PriceGrid, build_price_grid, change_days
from costopt.domain import Cloud, Market
from costopt.migration.decision import MigrationRule
from costopt.throughput.loaders import load_throughput_file
from costopt.throughput.model import JobType, ThroughputKey

__all__ = [
    "AZURE_FIRST_DAY",
    "EXTRA_POLICIES",
    "PAPER_AWS_TYPES",
    "PAPER_AZURE_REGIONS",
    "PAPER_CHECKPOINT_GB",
    "PAPER_INSTANCE_TYPES",
    "PAPER_JOB_DAYS",
    "PAPER_MODELS",
    "PAPER_POLICIES",
    "PAPER_REGIONS",
    "STUDY_WINDOW",
    "PaperBacktest",
    "PaperCell",
    "PaperInputs",
    "PaperRow",
    "PriceHistory",
    "RegionSetup",
    "dynamic_benefit",
    "first_list_prices",
    "job_groups",
    "load_paper_inputs",
    "paper_backtest",
    "paper_jobs",
    "paper_price_files",
    "paper_start_days",
    "paper_throughputs",
    "region_setup",
    "run_paper_backtest",
]

log = logging.getLogger(__name__)

PAPER_REGIONS: tuple[str, ...] = ("us-east-1", "us-west-2")
PAPER_AZURE_REGIONS: tuple[str, ...] = ("eastus", "northcentralus", "southcentralus")
PAPER_AWS_TYPES: tuple[str, ...] = ("p2.xlarge", "p2.8xlarge", "p2.16xlarge", "p3.2xlarge", "p3.8xlarge", "p3.16xlarge")
PAPER_MODELS: tuple[str, ...] = (
    "A3C",
    "CycleGAN",
    "LM (batch size 80)",
    "Recommendation (batch size 8192)",
    "ResNet-50 (batch size 128)",
    "Transformer (batch size 256)",
)
PAPER_JOB_DAYS: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
PAPER_POLICIES: tuple[str, ...] = (
    "baseline",
    "gpu_type",
    "multi_gpu",
    "multi_cloud",
    "dynamic",
    "dynamic_migration_cost",
)
EXTRA_POLICIES: tuple[str, ...] = ("dynamic_move_cost_only", "on_demand", "on_demand_best")
"""Reported beside the paper's six: the rule without margin and dwell (moves whenever they pay for
themselves), and the two on-demand baselines."""

PAPER_INSTANCE_TYPES: Mapping[tuple[str, str], tuple[str, float]] = MappingProxyType(
    {
        ("aws", "p2.xlarge"): ("k80", 1.0),
        ("aws", "p2.8xlarge"): ("k80", 8.0),
        ("aws", "p2.16xlarge"): ("k80", 16.0),
        ("aws", "p3.2xlarge"): ("v100", 1.0),
        ("aws", "p3.8xlarge"): ("v100", 4.0),
        ("aws", "p3.16xlarge"): ("v100", 8.0),
        ("azure", "Standard_NC6"): ("k80", 1.0),
        ("azure", "Standard_NC12"): ("k80", 2.0),
        ("azure", "Standard_NC24"): ("k80", 4.0),
        ("azure", "Standard_NC24r"): ("k80", 4.0),
        ("azure", "Standard_NC6s_v2"): ("p100", 1.0),
        ("azure", "Standard_NC12s_v2"): ("p100", 2.0),
        ("azure", "Standard_NC24s_v2"): ("p100", 4.0),
        ("azure", "Standard_NC24rs_v2"): ("p100", 4.0),
        ("azure", "Standard_NC6s_v3"): ("v100", 1.0),
        ("azure", "Standard_NC12s_v3"): ("v100", 2.0),
        ("azure", "Standard_NC24s_v3"): ("v100", 4.0),
        ("azure", "Standard_NC24rs_v3"): ("v100", 4.0),
    }
)
"""The paper's conventions: p2 = K80, p3 = V100; Azure NC = K80, NCv2 = P100, NCv3 = V100 (GPU counts
from the paper's ``instance_mapping.csv``, as the curated catalog)."""

PAPER_CHECKPOINT_GB: Mapping[str, float] = MappingProxyType(
    {
        "A3C": 0.05,
        "CycleGAN": 0.35,
        "LM (batch size 80)": 0.3,
        "Recommendation (batch size 8192)": 0.15,
        "ResNet-50 (batch size 128)": 0.2,
        "Transformer (batch size 256)": 0.7,
    }
)
"""Checkpoint size (GB) moved with each move: estimates, parameters x 4 bytes x (1 + optimizer state
copies), rounded up: ResNet-50 25.6 M parameters with SGD momentum (0.2 GB); the Transformer (~60 M)
with Adam (0.7 GB); CycleGAN two generators and two discriminators (~28 M) with Adam (0.35 GB); the
LSTM language model (~30 M, SGD; 0.3 GB); the recommendation autoencoder (~12 M, Adam; 0.15 GB); A3C's
small Atari network (0.05 GB). The training data is assumed present in every region (not moved)."""

STUDY_WINDOW = (datetime(2019, 12, 1, tzinfo=UTC), datetime(2020, 12, 31, 23, 59, 59, tzinfo=UTC))
"""The paper's price data lies in this window; later prices in a live store are left out."""

N_START_DAYS = 30
SKIP_LATEST = 5
SECONDS_PER_DAY = 86_400.0


class PriceHistory(Protocol):
    """What the backtest needs from a price store (``pricing.store.PriceStore`` has it)."""

    def history(
        self,
        start: datetime,
        end: datetime,
        *,
        cloud: Cloud | None = None,
        region: str | None = None,
        market: Market | None = None,
    ) -> pd.DataFrame: ...


# --- inputs ---------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class PaperInputs:
    """Everything the paper's backtest reads.

    ``spot``: change points (``PriceStore.history`` columns) of the paper's AWS types in its regions and
    of the Azure sizes. ``list_prices``: one on-demand list price per offer (``KEY_COLUMNS`` +
    ``usd_per_hour``). ``throughputs``: model -> accelerator -> single-GPU steps/s.
    ``instance_types``: (cloud, type) -> (accelerator, GPUs per instance).
    """

    spot: pd.DataFrame
    list_prices: pd.DataFrame
    throughputs: Mapping[str, Mapping[str, float]]
    instance_types: Mapping[tuple[str, str], tuple[str, float]] = field(default_factory=lambda: PAPER_INSTANCE_TYPES)


def paper_price_files(data_dir: Path, catalog_dir: Path) -> list[Path]:
    """The files to import into a scratch store for the paper's backtest: the normalized AWS spot
    history and Azure daily prices of ``<data_dir>/prices/`` and the curated ``list_prices.csv``."""
    prices = data_dir / "prices"
    files = [
        prices / "aws_spot_price_history_2019-12_2020-03_p2_p3.csv",
        prices / "azure_spot_price_daily_2020-02_2020-03.csv",
        catalog_dir / "list_prices.csv",
    ]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise BacktestError(f"the paper's backtest needs {missing}")
    return files


def paper_throughputs(path: Path, models: Sequence[str] = PAPER_MODELS) -> dict[str, dict[str, float]]:
    """Single-GPU isolated steps/s per model and accelerator from a throughput file (the paper used
    ``prices/gavel_oracle_throughputs_k80_p100_v100.json``)."""
    measured = load_throughput_file(path)
    out: dict[str, dict[str, float]] = {}
    for name in models:
        jt = JobType.parse(name)
        per = {
            acc: measured.isolated[ThroughputKey(jt, acc)]
            for acc in ("k80", "p100", "v100")
            if ThroughputKey(jt, acc) in measured.isolated
        }
        if "v100" not in per:
            raise BacktestError(f"{path}: no V100 throughput for {name!r} (a job's size is counted in V100-days)")
        out[name] = per
    return out


def load_paper_inputs(
    store: PriceHistory,
    throughput_file: Path,
    *,
    regions: Sequence[str] = PAPER_REGIONS,
    models: Sequence[str] = PAPER_MODELS,
    window: tuple[datetime, datetime] = STUDY_WINDOW,
) -> PaperInputs:
    """Read the paper's prices from ``store`` (spot change points within ``window``, list prices of
    any date) and its throughputs from ``throughput_file``."""
    start, end = window
    aws_types = set(PAPER_AWS_TYPES)
    azure_types = {t for c, t in PAPER_INSTANCE_TYPES if c == "azure"}
    frames = []
    for region in regions:
        h = store.history(start, end, cloud=Cloud.AWS, region=region, market=Market.SPOT)
        frames.append(h[h["instance_type"].isin(aws_types)])
    az = store.history(start, end, cloud=Cloud.AZURE, market=Market.SPOT)
    frames.append(az[az["instance_type"].isin(azure_types) & az["region"].isin(PAPER_AZURE_REGIONS)])
    spot = pd.concat(frames, ignore_index=True)
    if spot.empty:
        raise BacktestError("the store holds none of the paper's spot prices (import them first)")
    far_past, far_future = datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)
    od = pd.concat(
        [
            store.history(far_past, far_future, cloud=Cloud.AWS, market=Market.ON_DEMAND),
            store.history(far_past, far_future, cloud=Cloud.AZURE, market=Market.ON_DEMAND),
        ],
        ignore_index=True,
    )
    return PaperInputs(
        spot=spot, list_prices=first_list_prices(od), throughputs=paper_throughputs(throughput_file, models)
    )


def first_list_prices(on_demand: pd.DataFrame) -> pd.DataFrame:
    """Each on-demand offer's earliest price (its 2020 list price in the curated data), one row per
    offer, restricted to the paper's instance types."""
    if on_demand.empty:
        return pd.DataFrame(columns=[*KEY_COLUMNS, "usd_per_hour"])
    known = {t for _, t in PAPER_INSTANCE_TYPES}
    od = on_demand[on_demand["instance_type"].isin(known)].sort_values([*KEY_COLUMNS, "valid_from"], kind="stable")
    return od.groupby(list(KEY_COLUMNS), as_index=False, sort=True).first().loc[:, [*KEY_COLUMNS, "usd_per_hour"]]


# --- the study --------------------------------------------------------------------------------


def paper_start_days(
    spot: pd.DataFrame, region: str, n: int = N_START_DAYS, skip_latest: int = SKIP_LATEST
) -> list[date]:
    """The 35th- to the 6th-latest distinct days on which ``region``'s p3.2xlarge spot price changed
    (with the defaults: ``n`` days, leaving out the ``skip_latest`` latest)."""
    days = change_days(spot, {"cloud": "aws", "region": region, "instance_type": "p3.2xlarge", "market": "spot"})
    if len(days) < n + skip_latest:
        raise BacktestError(
            f"{region}: only {len(days)} days with a p3.2xlarge price change; the method needs {n + skip_latest}"
        )
    return days[len(days) - n - skip_latest : len(days) - skip_latest]


@dataclass(frozen=True, eq=False)
class RegionSetup:
    """One region's offers, grid, cost cube and policies (shared by every start day and model)."""

    region: str
    start_days: tuple[date, ...]
    cube: CostCube
    policies: Mapping[str, PlacementPolicy]

    @property
    def grid(self) -> PriceGrid:
        return self.cube.grid


def _offers(inputs: PaperInputs, region: str) -> tuple[OfferSet, pd.DataFrame, pd.DataFrame]:
    spot = inputs.spot
    in_region = (spot["cloud"] == "aws") & (spot["region"] == region) & spot["instance_type"].isin(PAPER_AWS_TYPES)
    azure = (spot["cloud"] == "azure") & spot["region"].isin(PAPER_AZURE_REGIONS)
    spot = spot[in_region | azure]
    lp = inputs.list_prices
    lp = lp[
        ((lp["cloud"] == "aws") & (lp["region"] == region) & lp["instance_type"].isin(PAPER_AWS_TYPES))
        | ((lp["cloud"] == "azure") & lp["region"].isin(PAPER_AZURE_REGIONS))
    ]
    keys = pd.concat([spot.loc[:, list(KEY_COLUMNS)], lp.loc[:, list(KEY_COLUMNS)]]).drop_duplicates()
    pairs = zip(keys["cloud"].astype(str), keys["instance_type"].astype(str), strict=True)
    shapes = [inputs.instance_types.get((c, t)) for c, t in pairs]
    known = np.array([s is not None for s in shapes], dtype=bool)
    if not known.all():
        left_out = sorted(set(keys["instance_type"].astype(str).to_numpy()[~known]))
        log.warning("left out %d offers of unknown instance types: %s", int((~known).sum()), left_out)
    keys = keys[known].copy()
    keys["accelerator"] = pd.Series([s[0] for s in shapes if s is not None], index=keys.index, dtype=object)
    keys["gpu_count"] = pd.Series([s[1] for s in shapes if s is not None], index=keys.index, dtype=np.float64)
    return OfferSet.from_frame(keys), spot, lp


def _policies(offers: OfferSet, region: str, rule: MigrationRule) -> dict[str, PlacementPolicy]:
    spot = ("spot",)
    aws = offers.mask(clouds=("aws",), markets=spot, regions=(region,))
    everything = aws | offers.mask(clouds=("azure",), markets=spot)
    od = offers.mask(markets=("on_demand",))
    return {
        "baseline": PlacementPolicy("baseline", aws & offers.mask(instance_types=("p3.2xlarge",))),
        "gpu_type": PlacementPolicy("gpu_type", aws & offers.mask(instance_types=("p2.xlarge", "p3.2xlarge"))),
        "multi_gpu": PlacementPolicy("multi_gpu", aws),
        "multi_cloud": PlacementPolicy("multi_cloud", everything),
        "dynamic": PlacementPolicy("dynamic", everything, mode="free"),
        "dynamic_migration_cost": PlacementPolicy("dynamic_migration_cost", everything, mode="rule", rule=rule),
        "dynamic_move_cost_only": PlacementPolicy(
            "dynamic_move_cost_only",
            everything,
            mode="rule",
            rule=replace(rule, margin_fraction=0.0, margin_min_usd=0.0, dwell_hours=0.0),
        ),
        "on_demand": PlacementPolicy(
            "on_demand", od & offers.mask(clouds=("aws",), regions=(region,), instance_types=("p3.2xlarge",))
        ),
        "on_demand_best": PlacementPolicy("on_demand_best", od & offers.mask(regions=(region, *PAPER_AZURE_REGIONS))),
    }


def _horizon_days(
    inputs: PaperInputs, models: Sequence[str], job_days: Sequence[float], rule: MigrationRule, period_hours: float
) -> int:
    """Days a job can need at most: on its slowest runnable GPU, with a restart in every period (the
    most a moving policy can lose), plus two days of slack."""
    worst = 0.0
    for m in models:
        per = inputs.throughputs[m]
        slowest = min(v for v in per.values() if v > 0)
        worst = max(worst, max(job_days) * per["v100"] / slowest)
    usable = max(period_hours - rule.restart_hours, period_hours / 2)
    return math.ceil(worst * period_hours / usable) + 2


def region_setup(
    inputs: PaperInputs,
    region: str,
    *,
    models: Sequence[str] = PAPER_MODELS,
    job_days: Sequence[float] = PAPER_JOB_DAYS,
    rule: MigrationRule | None = None,
    period_hours: float = 24.0,
    start_days: Sequence[date] | None = None,
) -> RegionSetup:
    """Offers, the price grid (from the first start day at 00:00 UTC, ``period_hours`` per period,
    long enough for the slowest job), the cost cube and the policies of one region."""
    r = rule or MigrationRule()
    days = tuple(start_days) if start_days is not None else tuple(paper_start_days(inputs.spot, region))
    offers, spot, lp = _offers(inputs, region)
    first = datetime(days[0].year, days[0].month, days[0].day, tzinfo=UTC)
    span_days = (days[-1] - days[0]).days + _horizon_days(inputs, models, job_days, r, period_hours)
    periods = math.ceil(span_days * 24.0 / period_hours)
    grid = build_price_grid(spot, offers, first, periods, period_hours, constant=lp)
    cube = build_cost_cube(grid, inputs.throughputs, models, r)
    return RegionSetup(region=region, start_days=days, cube=cube, policies=_policies(offers, region, r))


def paper_jobs(
    setup: RegionSetup,
    inputs: PaperInputs,
    models: Sequence[str],
    job_days: Sequence[float],
    checkpoint_gb: Mapping[str, float],
) -> tuple[JobBatch, pd.DataFrame]:
    """Every (model, job length, start day) job, and a frame naming each (columns model, job_days,
    start_day)."""
    grid = setup.grid
    rows = [(m, n, d) for m in models for n in job_days for d in setup.start_days]
    index = {m: i for i, m in enumerate(setup.cube.models)}
    start = [grid.period_of(datetime(d.year, d.month, d.day, tzinfo=UTC)) for _, _, d in rows]
    jobs = JobBatch(
        model=np.array([index[m] for m, _, _ in rows], dtype=np.int64),
        steps=np.array([inputs.throughputs[m]["v100"] * n * SECONDS_PER_DAY for m, n, _ in rows]),
        start=np.array(start, dtype=np.int64),
        checkpoint_gb=np.array([float(checkpoint_gb.get(m, 0.0)) for m, _, _ in rows]),
    )
    frame = pd.DataFrame(rows, columns=["model", "job_days", "start_day"])
    return jobs, frame


def job_groups(frame: pd.DataFrame) -> list[tuple[str, float, npt.NDArray[np.int64]]]:
    """(model, job length, row indices of its jobs) for each group of :func:`paper_jobs`' frame, in
    the frame's order."""
    out: list[tuple[str, float, npt.NDArray[np.int64]]] = []
    models = frame["model"].astype(str).to_numpy()
    lengths = frame["job_days"].to_numpy(dtype=np.float64)
    seen: dict[tuple[str, float], list[int]] = {}
    for i, key in enumerate(zip(models.tolist(), lengths.tolist(), strict=True)):
        seen.setdefault(key, []).append(i)
    for (model, n), rows in seen.items():
        out.append((model, n, np.array(rows, dtype=np.int64)))
    return out


# --- results --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PaperRow:
    """One figure of the paper's table: ``cost_reduction`` = baseline mean cost / ``policy`` mean cost
    for jobs of ``job_days`` V100-days of ``model`` in ``region``."""

    region: str
    model: str
    policy: str
    job_days: float
    cost_reduction: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "region": self.region,
            "model": self.model,
            "policy": self.policy,
            "job_days": self.job_days,
            "cost_reduction": self.cost_reduction,
        }


@dataclass(frozen=True, slots=True)
class PaperCell:
    """Detailed figures of one (region, model, policy, job length) over its start days.

    ``mean_cost_usd``: mean cost of a job (USD, Decimal of the exact float sums). ``cost_reduction``:
    baseline mean / this mean. ``mean_moves``, ``mean_move_cost_usd``: per job. ``outlived``: jobs
    that ran past the data's end (on the last known prices). ``mean_hours``: mean run time.
    """

    region: str
    model: str
    policy: str
    job_days: float
    jobs: int
    mean_cost_usd: Decimal
    cost_reduction: float
    mean_hours: float
    mean_moves: float
    mean_move_cost_usd: Decimal
    outlived: int
    first_choice: str


@dataclass(frozen=True, eq=False)
class PaperBacktest:
    """The paper's table (``rows``, six policies), detailed ``cells`` (on-demand baselines included),
    each region's start days, where the data ends, and the per-job results of each region and policy
    (``results[region][policy]``, aligned with ``jobs[region]``)."""

    rows: tuple[PaperRow, ...]
    cells: tuple[PaperCell, ...]
    start_days: Mapping[str, tuple[date, ...]]
    data_end: Mapping[str, datetime]
    jobs: Mapping[str, pd.DataFrame]
    results: Mapping[str, Mapping[str, BacktestResult]]
    seconds: float


def paper_backtest(
    inputs: PaperInputs,
    *,
    regions: Sequence[str] = PAPER_REGIONS,
    models: Sequence[str] = PAPER_MODELS,
    job_days: Sequence[float] = PAPER_JOB_DAYS,
    policies: Sequence[str] = (*PAPER_POLICIES, *EXTRA_POLICIES),
    rule: MigrationRule | None = None,
    checkpoint_gb: Mapping[str, float] = PAPER_CHECKPOINT_GB,
) -> PaperBacktest:
    """Run the paper's method (module docstring) for every region, model, job length and policy.
    ``baseline`` is always run (the reductions are relative to it)."""
    t0 = time.perf_counter()
    r = rule or MigrationRule()
    unknown = [p for p in policies if p not in (*PAPER_POLICIES, *EXTRA_POLICIES)]
    if unknown:
        raise BacktestError(f"unknown policies {unknown}; choose from {[*PAPER_POLICIES, *EXTRA_POLICIES]}")
    missing = [m for m in models if m not in inputs.throughputs]
    if missing:
        raise BacktestError(f"no throughput for models {missing}")
    run = ["baseline", *[p for p in policies if p != "baseline"]]
    rows: list[PaperRow] = []
    cells: list[PaperCell] = []
    starts: dict[str, tuple[date, ...]] = {}
    ends: dict[str, datetime] = {}
    frames: dict[str, pd.DataFrame] = {}
    results: dict[str, dict[str, BacktestResult]] = {}
    for region in regions:
        setup = region_setup(inputs, region, models=models, job_days=job_days, rule=r)
        jobs, frame = paper_jobs(setup, inputs, models, job_days, checkpoint_gb)
        starts[region], ends[region], frames[region] = setup.start_days, setup.grid.data_end, frame
        res = {p: run_backtest(setup.cube, jobs, setup.policies[p]) for p in run}
        results[region] = res
        for model, n, idx in job_groups(frame):
            base = float(np.mean(res["baseline"].cost[idx]))
            for p in run:
                sr = res[p]
                mean = float(np.mean(sr.cost[idx]))
                reduction = base / mean if mean > 0 else math.inf
                firsts = pd.Series(sr.first_offer[idx]).value_counts()
                cells.append(
                    PaperCell(
                        region=region,
                        model=str(model),
                        policy=p,
                        job_days=float(n),
                        jobs=len(idx),
                        mean_cost_usd=mean_usd(sr.cost[idx]),
                        cost_reduction=reduction,
                        mean_hours=float(np.mean(sr.finish_hours[idx] - jobs.start[idx] * setup.grid.period_hours)),
                        mean_moves=float(np.mean(sr.moves[idx])),
                        mean_move_cost_usd=mean_usd(sr.move_cost[idx]),
                        outlived=int(sr.outlived[idx].sum()),
                        first_choice=setup.cube.offers.label(int(firsts.index[0])),
                    )
                )
                if p in PAPER_POLICIES and p in policies:
                    rows.append(PaperRow(region, str(model), p, float(n), reduction))
        log.info("%s: %d jobs x %d policies", region, len(jobs), len(run))
    return PaperBacktest(
        rows=tuple(rows),
        cells=tuple(cells),
        start_days=starts,
        data_end=ends,
        jobs=frames,
        results=results,
        seconds=time.perf_counter() - t0,
    )


def run_paper_backtest(
    inputs: PaperInputs,
    *,
    regions: Sequence[str] = PAPER_REGIONS,
    job_days: Sequence[float] = PAPER_JOB_DAYS,
    models: Sequence[str] = PAPER_MODELS,
    rule: MigrationRule | None = None,
) -> list[PaperRow]:
    """The paper's table as JSON-able rows (``PaperRow.as_dict``): one per region, model, policy (the
    six of the paper) and job length, in that nesting order (models, then lengths, then policies)."""
    result = paper_backtest(
        inputs, regions=regions, models=models, job_days=job_days, policies=PAPER_POLICIES, rule=rule
    )
    return list(result.rows)


def dynamic_benefit(
    result: PaperBacktest,
    policy: str = "dynamic",
    *,
    reference: str = "multi_cloud",
    since: date | None = None,
    until: date | None = None,
) -> pd.DataFrame:
    """The benefit of ``policy`` over ``reference`` (static multi-cloud by default): the reference's
    mean cost / the policy's mean cost per region, job length and model, over the start days in
    ``[since, until)`` (None: no bound), with the mean and max over models (columns region, job_days,
    one per model, mean, max)."""
    rows = []
    for region, frame in result.jobs.items():
        days = frame["start_day"].to_numpy()
        keep = np.ones(len(frame), dtype=bool)
        if since is not None:
            keep &= days >= since
        if until is not None:
            keep &= days < until
        ref, pol = result.results[region][reference].cost, result.results[region][policy].cost
        for model, n, idx in job_groups(frame):
            chosen = idx[keep[idx]]
            if len(chosen):
                ratio = float(np.mean(ref[chosen]) / np.mean(pol[chosen]))
                rows.append((region, n, model, ratio))
    table = pd.DataFrame(rows, columns=["region", "job_days", "model", "ratio"])
    wide = table.pivot_table(index=["region", "job_days"], columns="model", values="ratio", sort=False)
    wide.columns.name = None
    models = list(wide.columns)
    wide["mean"] = wide[models].mean(axis=1)
    wide["max"] = wide[models].max(axis=1)
    return wide.reset_index()


AZURE_FIRST_DAY = date(2020, 2, 24)
"""The first day of the Azure price sheets: earlier start days have AWS offers only."""
