"""Decisions finer than daily: hourly prices, decision intervals 1 h / 6 h / 24 h / 72 h / never.

Run from the project root: ``.venv/bin/python experiments/backtest/run_intervals.py [--docs]``. Runs
:func:`costopt.backtest.intervals.interval_sweep` for both regions, every model and job length, prints
markdown tables, draws ``docs/figures/backtest_intervals.png`` and, with ``--docs``, rewrites the
generated sections of ``docs/backtest.md``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import cast

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backtest_common import FIGURES, paper_inputs, replace_section, short
from run_paper import md

from costopt.backtest.intervals import interval_sweep
from costopt.backtest.paper import PAPER_MODELS

LABELS = {1: "1 h", 6: "6 h", 24: "24 h", 72: "72 h", 0: "never"}


def summary_table(f: pd.DataFrame) -> str:
    """Cost at each interval relative to daily decisions (daily mean / interval mean; > 1: cheaper than
    daily), worst and best over the 2 regions x 6 models x 7 lengths, and moves per job at 8 days."""
    out = []
    for offer_set in ("multi_cloud", "baseline"):
        sub = f[(f["offer_set"] == offer_set) & (f["mode"] != "static")]
        rows = []
        for (mode, iv), g in sub.groupby(["mode", "iv"], sort=True):
            rows.append(
                {
                    "mode": mode,
                    "interval": LABELS[int(cast(int, iv))],  # pandas-stubs type group keys Hashable
                    "vs daily (worst)": float(g["vs_daily"].min()),
                    "vs daily (best)": float(g["vs_daily"].max()),
                    "vs static (mean)": float(g["vs_static"].mean()),
                    "moves/job at 8 d": float(g[g["job_days"] == 8.0]["mean_moves"].mean()),
                }
            )
        out.append(f"**offer set `{offer_set}`**\n\n" + md(pd.DataFrame(rows), "{:.4f}"))
    return "\n\n".join(out)


def per_model_table(f: pd.DataFrame) -> str:
    """Rule mode, multi-cloud offers, 8 V100-day jobs: daily mean / interval mean per model (both regions)."""
    sub = f[(f["offer_set"] == "multi_cloud") & (f["job_days"] == 8.0) & (f["mode"].isin(["rule", "static"]))]
    wide = sub.pivot_table(index="model", columns="iv", values="vs_daily", aggfunc="mean").reindex(PAPER_MODELS)
    wide = wide[[1, 6, 24, 72, 0]]
    wide.columns = [LABELS[int(c)] for c in wide.columns]
    wide.index = [short(m) for m in wide.index]
    return md(wide.reset_index().rename(columns={"index": "model (rule, 8 V100-days)"}), "{:.4f}")


def plot(f: pd.DataFrame, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    order = [1, 6, 24, 72, 0]
    for ax, offer_set in zip(axes, ("multi_cloud", "baseline"), strict=True):
        sub = f[(f["offer_set"] == offer_set) & (f["job_days"] == 8.0)]
        for mode, style in (("free", "-"), ("rule", "--"), ("move_cost_only", ":")):
            g = sub[sub["mode"].isin([mode, "static"])]
            for i, m in enumerate(PAPER_MODELS):
                vals = (
                    g[g["model"] == m].groupby("iv")["mean_cost_usd"].apply(lambda s: float(np.mean(s.astype(float))))
                )
                daily = float(vals[24])
                ax.plot(
                    range(len(order)),
                    [float(vals[i]) / daily for i in order],
                    style,
                    color=f"C{i}",
                    marker="o",
                    ms=3,
                    label=f"{short(m)} ({mode})" if offer_set == "multi_cloud" else None,
                )
        ax.set_xticks(range(len(order)), [LABELS[i] for i in order])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xlabel("decision interval (hourly prices)")
        ax.set_title(
            f"offers: {offer_set}; 8 V100-day jobs (solid free, dashed rule, dotted move cost only)", fontsize=9
        )
    axes[0].set_ylabel("mean cost / mean cost with daily decisions")
    axes[0].legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--docs", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    inputs, _ = paper_inputs(args.data)
    sweep = interval_sweep(inputs)
    print(f"# hourly sweep in {sweep.seconds:.1f} s ({len(sweep.cells)} cells)")
    f = sweep.frame()
    f["iv"] = f["interval_hours"].fillna(0).astype(int)
    sections = {"intervals-summary": summary_table(f), "intervals-models": per_model_table(f)}
    for name, text in sections.items():
        print(f"\n## {name}\n\n{text}")
    FIGURES.mkdir(parents=True, exist_ok=True)
    plot(f, FIGURES / "backtest_intervals.png")
    if args.docs:
        for name, text in sections.items():
            replace_section(name, text)
        replace_section("intervals-timing", f"Hourly sweep ({len(sweep.cells)} cells) in {sweep.seconds:.1f} s.")


if __name__ == "__main__":
    main()
