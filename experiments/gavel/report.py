"""Figures (docs/figures/gavel_*.png) and markdown tables (experiments/gavel/results/summary.md)
from the sweeps' JSON-lines results. Run: .venv/bin/python experiments/gavel/report.py"""

from __future__ import annotations

from collections import defaultdict
from statistics import mean
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from gavel_common import RESULTS, ROOT, load
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

FIGURES = ROOT / "docs" / "figures"
LABEL = {
    "max_min_fairness": "LAS, heterogeneity-agnostic",
    "max_min_fairness_perf": "LAS, heterogeneity-aware (Gavel)",
    "min_total_duration": "makespan policy, agnostic",
    "min_total_duration_perf": "makespan policy, aware (Gavel)",
    "finish_time_fairness": "finish-time fairness, agnostic",
    "finish_time_fairness_perf": "finish-time fairness, aware (Gavel)",
}


def _group(rows: list[dict[str, Any]], *keys: str) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[tuple(r["spec"].get(k) for k in keys)].append(r)
    return out


def _header(title: str, column: str, policies: list[str]) -> list[str]:
    """Title and header of a table with a row per ``column`` value and a column per policy."""
    return [
        f"### {title}",
        "",
        f"| {column} | " + " | ".join(LABEL.get(p, p) for p in policies) + " | agnostic / aware |",
        "|---|" + "---|" * (len(policies) + 1),
    ]


def _save(fig: Figure, ax: Axes, name: str, title: str, xlabel: str, ylabel: str) -> list[str]:
    """Label and save the figure as docs/figures/gavel_{name}.png; the markdown lines showing it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(FIGURES / f"gavel_{name}.png", dpi=120)
    plt.close(fig)
    return ["", f"![{title}](figures/gavel_{name}.png)", ""]


def las(name: str, title: str) -> list[str]:
    rows = load(RESULTS / f"{name}.jsonl")
    if not rows:
        return []
    groups = _group(rows, "policy", "rate")
    policies = sorted({k[0] for k in groups})
    rates = sorted({k[1] for k in groups})
    fig, ax = plt.subplots(figsize=(6, 4))
    lines = _header(title, "jobs/h", policies)
    for p in policies:
        xs, ys, lo, hi, open_x, open_y = [], [], [], [], [], []
        for r in rates:
            g = groups.get((p, r), [])
            if not g:
                continue
            jct = [x["avg_jct_s"] / 3600 for x in g]
            if all(x["window_complete"] for x in g):
                xs.append(r)
                ys.append(mean(jct))
                lo.append(mean(jct) - min(jct))
                hi.append(max(jct) - mean(jct))
            else:
                open_x.append(r)
                open_y.append(mean(jct))
        line = ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=LABEL.get(p, p))
        if open_x:
            ax.scatter(
                open_x,
                open_y,
                marker="^",
                color=line[0].get_color(),
                label=f"{LABEL.get(p, p)}: window not done by the cap",
            )
    for r in rates:
        cells = []
        means = {}
        for p in policies:
            g = groups.get((p, r), [])
            if not g:
                cells.append("-")
                continue
            m = mean(x["avg_jct_s"] / 3600 for x in g)
            means[p] = m
            done = all(x["window_complete"] for x in g)
            finished = min(x["jobs_completed"] for x in g)
            note = "" if done else f" (>= lower bound: as few as {finished} of 1000 done by the cap)"
            cells.append(f"{m:.1f} h{note} [{len(g)} seeds]")
        ratio = "-"
        if "max_min_fairness" in means and "max_min_fairness_perf" in means:
            ratio = f"{means['max_min_fairness'] / means['max_min_fairness_perf']:.2f}x"
        lines.append(f"| {r:g} | " + " | ".join(cells) + f" | {ratio} |")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    return [*lines, *_save(fig, ax, name, title, "input job rate (jobs/hour)", "average JCT of jobs 4000-4999 (hours)")]


def makespan(name: str, title: str) -> list[str]:
    rows = load(RESULTS / f"{name}.jsonl")
    if not rows:
        return []
    groups = _group(rows, "policy", "jobs")
    policies = sorted({k[0] for k in groups})
    sizes = sorted({k[1] for k in groups})
    fig, ax = plt.subplots(figsize=(6, 4))
    lines = _header(title, "jobs", policies)
    for p in policies:
        xs = [n for n in sizes if (p, n) in groups]
        ax.plot(
            xs, [mean(x["makespan_s"] / 3600 for x in groups[(p, n)]) for n in xs], marker="o", label=LABEL.get(p, p)
        )
    for n in sizes:
        means = {p: mean(x["makespan_s"] / 3600 for x in groups[(p, n)]) for p in policies if (p, n) in groups}
        ratio = "-"
        if "min_total_duration" in means and "min_total_duration_perf" in means:
            ratio = f"{means['min_total_duration'] / means['min_total_duration_perf']:.2f}x"
        cells = [f"{means[p]:.1f} h" if p in means else "-" for p in policies]
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {ratio} |")
    return [*lines, *_save(fig, ax, name, title, "jobs (static trace, all at t = 0)", "makespan (hours)")]


def table(name: str, title: str, keys: tuple[str, ...], metrics: tuple[tuple[str, str, float], ...]) -> list[str]:
    rows = load(RESULTS / f"{name}.jsonl")
    if not rows:
        return []
    groups = _group(rows, *keys)
    lines = [
        f"### {title}",
        "",
        "| " + " | ".join(keys) + " | " + " | ".join(m[1] for m in metrics) + " | seeds |",
        "|" + "---|" * (len(keys) + len(metrics) + 1),
    ]
    for k in sorted(groups, key=lambda t: tuple(str(v) for v in t)):
        g = groups[k]
        cells = [f"{mean(x[m] for x in g) / scale:.3g}" for m, _, scale in metrics]
        shown = ("-" if v is None else str(v) for v in k)  # a key the spec does not have (e.g. no "pareto")
        lines.append("| " + " | ".join(shown) + " | " + " | ".join(cells) + f" | {len(g)} |")
    return [*lines, ""]


def main() -> None:
    FIGURES.mkdir(parents=True, exist_ok=True)
    out: list[str] = ["<!-- generated by experiments/gavel/report.py -->", ""]
    out += las("las_single_gpu", "LAS: average JCT vs load, single-GPU jobs, 36:36:36")
    out += las("las_multi_gpu", "LAS: average JCT vs load, multi-GPU mix, 36:36:36")
    out += makespan("makespan_single_gpu", "Makespan on static traces, single-GPU jobs, 36:36:36")
    out += makespan("makespan_single_gpu_12_12_12", "Makespan on static traces, single-GPU jobs, 12:12:12")
    out += makespan("makespan_multi_gpu", "Makespan on static traces, multi-GPU mix, 36:36:36")
    out += table(
        "ftf",
        "Finish-time fairness of jobs 1000-1499 (rho = JCT / isolated-share JCT)",
        ("policy", "rate"),
        (
            ("ftf_rho_mean", "mean rho", 1.0),
            ("ftf_rho_max", "max rho", 1.0),
            ("ftf_unfair_fraction", "share rho > 1", 1.0),
            ("avg_jct_s", "avg JCT (h)", 3600.0),
        ),
    )
    out += table(
        "space_sharing",
        "Space sharing and the Pareto stage (jobs 4000-4999; pareto False: the max-min LP alone)",
        ("policy", "pareto", "space_sharing", "rate"),
        (
            ("avg_jct_s", "avg JCT (h)", 3600.0),
            ("utilization", "utilization", 1.0),
            ("moves_per_job", "moves/job", 1.0),
            ("window_complete", "window complete", 1.0),
        ),
    )
    out += table(
        "overhead",
        "Restart overhead per move (jobs 4000-4999, seed 0)",
        ("policy", "rate", "restart_overhead_s"),
        (
            ("avg_jct_s", "avg JCT (h)", 3600.0),
            ("moves_per_job", "moves/job", 1.0),
            ("utilization", "utilization", 1.0),
        ),
    )
    out += table(
        "reference_comparison",
        "Aware LAS against an emulation of the reference's mechanism (compare_reference.py; 5 jobs/h, jobs 4000-4999)",
        ("variant",),
        (
            ("avg_jct_s", "avg JCT (h)", 3600.0),
            ("makespan_s", "makespan (h)", 3600.0),
            ("moves_per_job", "moves/job", 1.0),
            ("utilization", "utilization", 1.0),
        ),
    )
    path = RESULTS / "summary.md"
    path.write_text("\n".join(out))
    print(path.read_text())


if __name__ == "__main__":
    main()
