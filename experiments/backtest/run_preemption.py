"""How much of the paper's saving survives preemption (issue 5, "go further than the paper").

Run from the project root: ``.venv/bin/python experiments/backtest/run_preemption.py [--docs] [--json PATH]``.
It imports the paper's price files into a scratch store, estimates the hazards from the 2020 availability
logs, runs :func:`costopt.backtest.preemption.preemption_study` (the paper's policies through the job
service's path, :func:`costopt.jobs.offline.run_offline`, on the simulated cloud, billed by the ledger; one
task per model and job length, the longest first, on ``--workers`` processes, one in-memory database per
task), prints markdown tables, draws
``docs/figures/backtest_preemption_survival.png`` and, with ``--docs``, rewrites the ``preemption-*``
sections of ``docs/backtest.md``.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import multiprocessing
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backtest_common import FIGURES, paper_inputs, replace_section, short
from run_paper import md

from api.wiring import build_hazards
from costopt.backtest.paper import PaperInputs
from costopt.backtest.preemption import (
    STUDY_JOB_DAYS,
    STUDY_MODELS,
    STUDY_POLICIES,
    STUDY_REPORT_EVERY,
    preemption_study,
)
from costopt.domain import Cloud, Market
from costopt.risk.hazard import HazardModel
from costopt.settings import Settings
from providers.sim import SimConfig, sim_factory

POLICIES = [p for p in STUDY_POLICIES if p != "on_demand"]


_SHARED: dict[str, object] = {}
"""Inputs for the worker processes, inherited through fork (PaperInputs holds read-only mappings, which
do not pickle)."""


def _one(model: str, job_days: float, regions: list[str], seeds: int, start_days: int | None) -> pd.DataFrame:
    inputs, hazards = _SHARED["inputs"], _SHARED["hazards"]
    if not isinstance(inputs, PaperInputs) or not isinstance(hazards, HazardModel):
        raise SystemExit("the worker did not inherit its inputs")
    study = preemption_study(
        inputs,
        sim_factory(SimConfig(report_every=STUDY_REPORT_EVERY)),
        hazards,
        regions=regions,
        models=(model,),
        job_days=(job_days,),
        seeds=tuple(range(seeds)),
        start_days=start_days,
    )
    frame = study.frame()
    frame.attrs["runs"] = study.runs
    frame.attrs["reused"] = study.reused
    return frame


WEIGHT = {"A3C": 1.0, "Transformer (batch size 256)": 0.9, "ResNet-50 (batch size 128)": 0.35}
"""How much work a model's runs are, roughly (A3C and the Transformer are preempted most): the tasks are
started largest first (model weight x job length), so the two processes finish together."""


SERVICE_LOGGERS = ("costopt.agent", "costopt.jobs", "costopt.migration", "providers")
"""The job service's loggers, quiet below errors during the study (its warnings are the runs' preemptions)."""


MIN_SAVING = 0.05
"""Below this saving without preemptions, the share that survives is noise: not shown."""


def main_table(f: pd.DataFrame) -> str:
    """Cost reduction over the baseline without -> with preemptions, and the share of the saving kept
    (shown where the saving without preemptions is at least 5%)."""
    rows = []
    for (region, model, n), g in f.groupby(["region", "model", "job_days"], sort=False):
        row: dict[str, object] = {"region": region, "model": short(str(model)), "V100-days": f"{n:g}"}
        for p in POLICIES[1:]:
            c = g[g["policy"] == p].iloc[0]
            kept = f" ({c['survives']:.0%})" if 1 - 1 / c["reduction_clean"] >= MIN_SAVING else ""
            row[p] = f"{c['reduction_clean']:.2f} → {c['reduction']:.2f}{kept}"
        rows.append(row)
    return md(pd.DataFrame(rows))


def on_demand_table(f: pd.DataFrame) -> str:
    """Times cheaper than on-demand p3.2xlarge (never preempted), without -> with preemptions."""
    rows = []
    for (region, model, n), g in f.groupby(["region", "model", "job_days"], sort=False):
        row: dict[str, object] = {"region": region, "model": short(str(model)), "V100-days": f"{n:g}"}
        for p in POLICIES:
            c = g[g["policy"] == p].iloc[0]
            row[p] = f"{c['vs_on_demand_clean']:.2f} → {c['vs_on_demand']:.2f}"
        rows.append(row)
    return md(pd.DataFrame(rows))


def detail_table(f: pd.DataFrame, job_days: float) -> str:
    """Preemptions, moves, hours and the lost work's share of the cost per job, with preemptions."""
    sub = f[f["job_days"] == job_days]
    rows = [
        {
            "region": c["region"],
            "model": short(str(c["model"])),
            "policy": c["policy"],
            "preemptions/job": f"{c['mean_preemptions']:.1f}",
            "moves/job": f"{c['mean_moves']:.1f}",
            "hours (clean → preempted)": f"{c['mean_hours_clean']:.0f} → {c['mean_hours']:.0f}",
            "lost work / cost": f"{c['lost_work_share']:.1%}",
            "paper engine reduction": f"{c['paper_reduction']:.2f}",
            "sim reduction (clean)": f"{c['reduction_clean']:.2f}",
        }
        for _, c in sub.iterrows()
        if c["policy"] != "on_demand"
    ]
    return md(pd.DataFrame(rows))


def hazard_note(hazards: HazardModel) -> str:
    """The rates the study's offers get (per instance-hour)."""
    parts = []
    for label, (cloud, region, zone, acc, n) in {
        "p3.2xlarge (V100) us-east-1a/b/c/d/f": (Cloud.AWS, "us-east-1", "us-east-1a", "v100", 1),
        "p2.xlarge (K80) us-east-1a": (Cloud.AWS, "us-east-1", "us-east-1a", "k80", 1),
        "p2.16xlarge (K80) us-east-1c": (Cloud.AWS, "us-east-1", "us-east-1c", "k80", 16),
        "Azure (any)": (Cloud.AZURE, "eastus", "", "p100", 1),
    }.items():
        parts.append(f"{label}: {hazards.rate(cloud, region, zone, acc, n, Market.SPOT):.4f}/h")
    b = [hazards.rate(Cloud.AWS, "us-east-1", f"us-east-1{z}", "v100", 1, Market.SPOT) for z in "abcdf"]
    parts[0] = "p3.2xlarge (V100) us-east-1a..f: " + "/".join(f"{r:.4f}" for r in b) + " per hour"
    return "; ".join(parts)


def plot(f: pd.DataFrame, path: Path) -> None:
    sub = f[(f["job_days"] == max(STUDY_JOB_DAYS)) & (f["policy"].isin(POLICIES[1:]))]
    fig, axes = plt.subplots(1, len(STUDY_MODELS), figsize=(4 * len(STUDY_MODELS), 3.6), sharey=True)
    for ax, model in zip(axes, STUDY_MODELS, strict=True):
        g = sub[sub["model"] == model].groupby("policy", sort=False)[["reduction_clean", "reduction"]].mean()
        g = g.reindex(POLICIES[1:])
        x = range(len(g))
        ax.bar([i - 0.2 for i in x], g["reduction_clean"], width=0.4, label="no preemption")
        ax.bar([i + 0.2 for i in x], g["reduction"], width=0.4, label="preemptions (hazards)")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(list(x), [p.replace("_", "\n") for p in g.index], fontsize=7)
        ax.set_title(f"{short(model)}, {max(STUDY_JOB_DAYS):g} V100-days")
    axes[0].set_ylabel("cost reduction vs baseline")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", action="store_true", help="rewrite the preemption sections of docs/backtest.md")
    parser.add_argument("--json", type=Path, help="write the cells as JSON here")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--start-days", type=int, default=None, help="only the first N start days (quick runs)")
    parser.add_argument("--region", action="append", default=None)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in SERVICE_LOGGERS:  # every simulated preemption is a warning of the service: thousands of lines
        logging.getLogger(name).setLevel(logging.ERROR)
    regions = args.region or ["us-east-1"]
    inputs, load_s = paper_inputs()
    hazards = build_hazards(Settings())
    t0 = time.perf_counter()
    _SHARED.update(inputs=inputs, hazards=hazards)
    # what the workers inherit (modules, inputs) never becomes garbage: out of their collections, which
    # otherwise walk it at every full pass (a few % of the study's CPU)
    gc.collect()
    gc.freeze()
    tasks = [(model, n) for model in STUDY_MODELS for n in STUDY_JOB_DAYS]
    largest_first = sorted(tasks, key=lambda t: -WEIGHT.get(t[0], 1.0) * t[1])
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {t: pool.submit(_one, t[0], t[1], regions, args.seeds, args.start_days) for t in largest_first}
        for done in as_completed(futures.values()):  # progress, as tasks finish
            (model, n) = next(t for t, fu in futures.items() if fu is done)
            at = time.perf_counter() - t0
            print(f"{short(model)} {n:g} V100-days: {done.result().attrs['runs']} runs done at {at:.0f} s", flush=True)
        frames = [futures[t].result() for t in tasks]  # the tables' order: model, then length
    seconds = time.perf_counter() - t0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = children.ru_utime + children.ru_stime  # the worker processes' CPU (all ended with the pool)
    runs = sum(int(fr.attrs["runs"]) for fr in frames)
    reused = sum(int(fr.attrs["reused"]) for fr in frames)
    f = pd.concat(frames, ignore_index=True)
    order = {r: i for i, r in enumerate(regions)}  # region, then model, then length (as one study orders them)
    f = f.sort_values("region", key=lambda c: c.map(order), kind="stable").reset_index(drop=True)
    days = int(f["start_days"].iloc[0])
    timing = (
        f"{runs} simulated job runs ({len(regions)} region(s) x {len(STUDY_MODELS)} models x "
        f"{len(STUDY_JOB_DAYS)} lengths x {days} start days x {len(STUDY_POLICIES)} policies x "
        f"(1 clean + {args.seeds} seeds)) in {seconds:.0f} s on {args.workers} processes ({cpu:.0f} s of CPU, "
        f"{cpu / runs:.3f} s per run; {reused} of the runs took the outcome of an earlier run whose placements "
        f"answered alike; + {load_s:.1f} s to import the prices). Hazards: {hazard_note(hazards)}."
    )
    sections = {
        "preemption-timing": timing,
        "preemption-main": main_table(f),
        "preemption-on-demand": on_demand_table(f),
        "preemption-detail": detail_table(f, max(STUDY_JOB_DAYS)),
    }
    for name, text in sections.items():
        print(f"\n## {name}\n\n{text}")
    FIGURES.mkdir(parents=True, exist_ok=True)
    plot(f, FIGURES / "backtest_preemption_survival.png")
    if args.json is not None:
        records = f.assign(
            mean_cost_usd_clean=f["mean_cost_usd_clean"].astype(str), mean_cost_usd=f["mean_cost_usd"].astype(str)
        ).to_dict(orient="records")
        args.json.write_text(json.dumps(records, indent=1))
    if args.docs:
        for name, text in sections.items():
            replace_section(name, text)


if __name__ == "__main__":
    main()
