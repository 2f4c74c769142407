"""Reproduce the dynamic-pricing paper's cost analysis (and the on-demand baseline) on the 2020 data.

Run from the project root: ``.venv/bin/python experiments/backtest/run_paper.py [--docs] [--json PATH]``.
It imports the paper's price files into a scratch store, runs :func:`costopt.backtest.paper.paper_backtest`
for both regions, every model, job length and policy, prints markdown tables, draws
``docs/figures/backtest_paper_*.png`` and, with ``--docs``, rewrites the generated sections of
``docs/backtest.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backtest_common import FIGURES, paper_inputs, replace_section, short

from costopt.backtest.paper import (
    AZURE_FIRST_DAY,
    PAPER_JOB_DAYS,
    PAPER_MODELS,
    PAPER_POLICIES,
    PAPER_REGIONS,
    PaperBacktest,
    dynamic_benefit,
    paper_backtest,
)


def cells_frame(result: PaperBacktest) -> pd.DataFrame:
    f = pd.DataFrame([{k: getattr(c, k) for k in c.__slots__} for c in result.cells])
    f["cost"] = f["mean_cost_usd"].astype(float)
    f["move_cost"] = f["mean_move_cost_usd"].astype(float)
    return f


def md(frame: pd.DataFrame, floatfmt: str = "{:.2f}") -> str:
    cols = list(frame.columns)
    lines = ["| " + " | ".join(str(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    for row in frame.itertuples(index=False):
        cells = [floatfmt.format(v) if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def key_table(f: pd.DataFrame, job_days: float) -> str:
    out = []
    for region in PAPER_REGIONS:
        sub = f[(f["region"] == region) & (f["job_days"] == job_days)]
        wide = sub.pivot_table(index="model", columns="policy", values="cost_reduction").reindex(PAPER_MODELS)
        wide = wide[[*PAPER_POLICIES, "dynamic_move_cost_only", "on_demand", "on_demand_best"]]
        wide.index = [short(m) for m in wide.index]
        table = wide.reset_index().rename(columns={"index": f"{region}, {job_days:g} V100-days"})
        out.append(md(table))
    return "\n\n".join(out)


def full_table(f: pd.DataFrame) -> str:
    out = []
    for region in PAPER_REGIONS:
        sub = f[(f["region"] == region) & f["policy"].isin(PAPER_POLICIES)]
        wide = sub.pivot_table(index=["model", "job_days"], columns="policy", values="cost_reduction")[
            list(PAPER_POLICIES)
        ]
        wide = wide.reindex(pd.MultiIndex.from_product([PAPER_MODELS, PAPER_JOB_DAYS]))
        rows = wide.reset_index()
        rows.columns = ["model", "V100-days", *PAPER_POLICIES]
        rows["model"] = [short(m) for m in rows["model"]]
        rows["V100-days"] = [f"{v:g}" for v in rows["V100-days"]]
        out.append(f"**{region}**\n\n" + md(rows))
    return "\n\n".join(out)


def benefit_table(result: PaperBacktest) -> str:
    per_model = dynamic_benefit(result, "dynamic").rename(columns={m: short(m) for m in PAPER_MODELS})
    per_model["job_days"] = [f"{v:g}" for v in per_model["job_days"]]
    variants = {
        "dynamic, all 30 start days": dynamic_benefit(result, "dynamic"),
        "dynamic, 24 start days from 2020-02-24": dynamic_benefit(result, "dynamic", since=AZURE_FIRST_DAY),
        "dynamic, 6 start days before 2020-02-24": dynamic_benefit(result, "dynamic", until=AZURE_FIRST_DAY),
        "dynamic_migration_cost, all": dynamic_benefit(result, "dynamic_migration_cost"),
        "dynamic_migration_cost, from 2020-02-24": dynamic_benefit(
            result, "dynamic_migration_cost", since=AZURE_FIRST_DAY
        ),
    }
    rows = []
    for name, b in variants.items():
        for region in PAPER_REGIONS:
            sub = b[b["region"] == region].set_index("job_days")
            rows.append(
                {
                    "policy, start days": name,
                    "region": region,
                    **{f"{d:g} d": f"{sub['mean'].loc[d]:.3f} / {sub['max'].loc[d]:.3f}" for d in PAPER_JOB_DAYS},
                }
            )
    return (
        "`multi_cloud` mean cost / `dynamic` mean cost, per model (all start days):\n\n"
        + md(per_model, "{:.3f}")
        + "\n\nMean / max over the six models, by which start days are counted:\n\n"
        + md(pd.DataFrame(rows))
    )


def moves_table(f: pd.DataFrame) -> str:
    rule = f[f["policy"] == "dynamic_migration_cost"].groupby("job_days")
    free = f[f["policy"] == "dynamic"].groupby("job_days")
    only = f[f["policy"] == "dynamic_move_cost_only"].set_index(["region", "model", "job_days"])["cost"]
    dyn = f[f["policy"] == "dynamic"].set_index(["region", "model", "job_days"])["cost"]
    mig = f[f["policy"] == "dynamic_migration_cost"].set_index(["region", "model", "job_days"])["cost"]
    t = pd.DataFrame(
        {
            "moves/job (free)": free["mean_moves"].mean(),
            "moves/job (rule)": rule["mean_moves"].mean(),
            "move USD/job (rule)": rule["move_cost"].mean(),
            "move cost / job cost (rule)": (rule["move_cost"].sum() / rule["cost"].sum()),
            "rule / free cost (max)": (mig / dyn).groupby("job_days").max(),
            "move-cost-only / free (max)": (only / dyn).groupby("job_days").max(),
        }
    ).reset_index()
    t["job_days"] = [f"{v:g}" for v in t["job_days"]]
    return md(t, "{:.3f}")


def outlived_table(f: pd.DataFrame) -> str:
    t = f.pivot_table(index="policy", columns="job_days", values="outlived", aggfunc="sum")
    t = t.reindex([*PAPER_POLICIES, "dynamic_move_cost_only", "on_demand", "on_demand_best"])
    t.columns = [f"{c:g} d" for c in t.columns]
    jobs = int(f.groupby(["policy", "job_days"])["jobs"].sum().iloc[0])
    return f"Jobs (of {jobs} per cell: 2 regions x 6 models x 30 start days) that ran past the data's end:\n\n" + md(
        t.reset_index().astype({c: int for c in t.columns}), "{:d}"
    )


def on_demand_table(f: pd.DataFrame, job_days: float) -> str:
    sub = f[f["job_days"] == job_days]
    od = sub[sub["policy"] == "on_demand"].set_index(["region", "model"])["cost"]
    rows = []
    for p in ["on_demand_best", *PAPER_POLICIES]:
        ratio = od / sub[sub["policy"] == p].set_index(["region", "model"])["cost"]
        rows.append({"policy": p, **{short(m): float(ratio.xs(m, level="model").mean()) for m in PAPER_MODELS}})
    return md(pd.DataFrame(rows))


def plot_reduction(f: pd.DataFrame, job_days: float, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    policies = list(PAPER_POLICIES)
    width = 0.8 / len(policies)
    for ax, region in zip(axes, PAPER_REGIONS, strict=True):
        sub = f[(f["region"] == region) & (f["job_days"] == job_days)]
        wide = sub.pivot_table(index="model", columns="policy", values="cost_reduction").reindex(PAPER_MODELS)
        x = np.arange(len(PAPER_MODELS))
        for i, p in enumerate(policies):
            ax.bar(x + (i - len(policies) / 2 + 0.5) * width, wide[p], width, label=p)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(3.5, color="grey", lw=0.8, ls="--")
        ax.text(len(PAPER_MODELS) - 0.5, 3.55, "paper: up to 3.5x", ha="right", fontsize=8, color="grey")
        ax.set_xticks(x, [short(m) for m in PAPER_MODELS], rotation=20)
        ax.set_title(f"{region}, jobs of {job_days:g} V100-days")
    axes[0].set_ylabel("cost reduction vs baseline (x)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(policies), fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_benefit(result: PaperBacktest, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    free = dynamic_benefit(result, "dynamic")
    rule = dynamic_benefit(result, "dynamic_migration_cost")
    for ax, region in zip(axes, PAPER_REGIONS, strict=True):
        a, b = free[free["region"] == region], rule[rule["region"] == region]
        for m in PAPER_MODELS:
            (line,) = ax.plot(a["job_days"], a[m], marker="o", label=short(m))
            ax.plot(b["job_days"], b[m], ls="--", color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(PAPER_JOB_DAYS), [f"{d:g}" for d in PAPER_JOB_DAYS])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xlabel("job length (V100-days)")
        ax.set_title(f"{region}: dynamic (solid) and with migration cost (dashed)")
    axes[0].set_ylabel("static multi-cloud cost / dynamic cost (x)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_on_demand(f: pd.DataFrame, job_days: float, path: Path) -> None:
    sub = f[f["job_days"] == job_days]
    od = sub[sub["policy"] == "on_demand"].set_index(["region", "model"])["cost"]
    policies = ["on_demand", "on_demand_best", *PAPER_POLICIES]
    fig, ax = plt.subplots(figsize=(10, 4))
    x = np.arange(len(policies))
    for k, region in enumerate(PAPER_REGIONS):
        vals = [
            float((sub[sub["policy"] == p].set_index(["region", "model"])["cost"] / od).xs(region).mean())
            for p in policies
        ]
        ax.bar(x + (k - 0.5) * 0.4, vals, 0.4, label=region)
    ax.set_xticks(x, policies, rotation=20)
    ax.set_ylabel("cost / on-demand p3.2xlarge cost")
    ax.set_title(f"What a job of {job_days:g} V100-days costs relative to on-demand (mean over the six models)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", type=Path, default=None, help="the shared data folder (default ../shared/data)")
    ap.add_argument("--docs", action="store_true", help="rewrite the generated sections of docs/backtest.md")
    ap.add_argument("--json", type=Path, default=None, help="write the paper rows as JSON here")
    ap.add_argument("--key-days", type=float, default=4.0, help="job length of the key table and plots")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    inputs, load_s = paper_inputs(args.data)
    result = paper_backtest(inputs)
    print(f"# inputs loaded in {load_s:.2f} s; full paper table in {result.seconds:.2f} s")
    f = cells_frame(result)
    sections = {
        "paper-key": key_table(f, args.key_days),
        "paper-full": full_table(f),
        "paper-benefit": benefit_table(result),
        "paper-moves": moves_table(f),
        "paper-outlived": outlived_table(f),
        "paper-on-demand": on_demand_table(f, args.key_days),
    }
    for name, text in sections.items():
        print(f"\n## {name}\n\n{text}")
    FIGURES.mkdir(parents=True, exist_ok=True)
    plot_reduction(f, args.key_days, FIGURES / "backtest_paper_reduction.png")
    plot_benefit(result, FIGURES / "backtest_paper_dynamic_benefit.png")
    plot_on_demand(f, args.key_days, FIGURES / "backtest_paper_on_demand.png")
    if args.json is not None:
        args.json.write_text(json.dumps([r.as_dict() for r in result.rows], indent=1))
    if args.docs:
        for name, text in sections.items():
            replace_section(name, text)
        replace_section("paper-timing", f"Full table (2 regions, 9 policies) in {result.seconds:.2f} s.")


if __name__ == "__main__":
    main()
