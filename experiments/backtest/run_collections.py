"""A collection with a shared deadline planned together vs one by one, backtested on the 2020 prices.

Run from the project root: ``.venv/bin/python experiments/backtest/run_collections.py [--docs]``. Runs
:func:`costopt.backtest.together.collection_sweep` for mixed collections of 6 to 30 jobs (the six
models in equal parts, 0.5 V100-days each) with deadlines of 24 h and 36 h, arriving in the listed
order and in reverse, plus a homogeneous sweep of 16 ResNet-50 jobs; both regions, every start day.
Prints markdown tables, draws ``docs/figures/backtest_collections.png`` and, with ``--docs``,
rewrites the generated sections of ``docs/backtest.md``.
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
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backtest_common import FIGURES, paper_inputs, replace_section
from run_paper import md

from costopt.backtest.together import CollectionCase, collection_sweep, mixed_collection

SIZES = (6, 12, 18, 24, 30)
DEADLINES = (24.0, 36.0)


def cases() -> list[CollectionCase]:
    out = []
    for d in DEADLINES:
        for n in SIZES:
            c = mixed_collection(n, deadline_hours=d)
            out.append(CollectionCase(f"mixed {n} jobs, {d:g} h", c.jobs, c.job_days, d))
            out.append(CollectionCase(f"mixed {n} jobs, {d:g} h, reversed", tuple(reversed(c.jobs)), c.job_days, d))
    out.append(CollectionCase("16 ResNet-50, 24 h", (("ResNet-50 (batch size 128)", 16),), 0.5, 24.0))
    return out


def table(summary: pd.DataFrame) -> str:
    wide = summary.pivot_table(
        index=["region", "case"], columns="planner", values=["realized", "planned", "late", "infeasible", "days"]
    )
    rows = []
    for key, r in wide.iterrows():
        region, case = cast(tuple[str, str], key)  # the (region, case) index; pandas-stubs type it Hashable
        together, alone = r[("realized", "together")], r[("realized", "one_by_one")]
        rows.append(
            {
                "region": region,
                "collection": case,
                "days placed": f"{r[('days', 'together')]:.0f}" if pd.notna(r[("days", "together")]) else "0",
                "together USD": together,
                "one by one USD": alone,
                "one by one / together": alone / together if together > 0 else float("nan"),
                "late (one by one)": f"{r[('late', 'one_by_one')]:.0f}",
                "days infeasible (together)": f"{r[('infeasible', 'together')]:.0f}",
            }
        )
    names = [c.name for c in cases()]
    out = pd.DataFrame(rows)
    out["_order"] = [names.index(c) for c in out["collection"]]
    out = out.sort_values(["region", "_order"]).drop(columns="_order")
    return md(out)


def plot(summary: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 4.2))
    s = summary.copy()
    for region, marker in (("us-east-1", "o"), ("us-west-2", "s")):
        for d in DEADLINES:
            for rev, style in ((False, "-"), (True, "--")):
                xs, ys = [], []
                for n in SIZES:
                    name = f"mixed {n} jobs, {d:g} h" + (", reversed" if rev else "")
                    g = s[(s["region"] == region) & (s["case"] == name)].set_index("planner")["realized"]
                    if len(g) == 2 and pd.notna(g).all():
                        xs.append(n)
                        ys.append(g["one_by_one"] / g["together"])
                order = "reversed" if rev else "listed"
                ax.plot(xs, ys, style, marker=marker, label=f"{region}, {d:g} h, {order} order")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xlabel("jobs in the collection (six models in equal parts, 0.5 V100-days each)")
    ax.set_ylabel("one-by-one cost / together cost")
    ax.set_title("Planning a collection together (MILP) vs one by one, realized on 2020 prices")
    ax.legend(fontsize=7)
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
    sweep = collection_sweep(inputs, cases())
    print(f"# {len(sweep.outcomes)} plans in {sweep.seconds:.1f} s")
    summary = sweep.summary()
    text = table(summary)
    print(text)
    FIGURES.mkdir(parents=True, exist_ok=True)
    plot(summary, FIGURES / "backtest_collections.png")
    if args.docs:
        replace_section("collections", text)
        replace_section("collections-timing", f"{len(sweep.outcomes)} plans and backtests in {sweep.seconds:.0f} s.")


if __name__ == "__main__":
    main()
