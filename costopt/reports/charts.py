"""The report's charts as PNG (matplotlib, for mail) and a self-contained HTML file (the PNG inline and
the tables), both drawn from the JSON document (:func:`costopt.reports.render.report_doc`), so the CLI
draws them from the REST answer.

Charts: spend against each baseline, cumulative by day; savings by team; spend by cloud and by
accelerator; moves and preemptions per day.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from decimal import Decimal
from itertools import accumulate
from typing import Any

__all__ = ["charts_png", "report_html"]


def _f(value: Any) -> float:
    return float(Decimal(str(value))) if value is not None else 0.0


def charts_png(doc: Mapping[str, Any], *, dpi: int = 110) -> bytes:
    """The four charts of the report, on one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    fig.suptitle(
        f"costopt savings {doc['from'][:10]} to {doc['to'][:10]} (UTC): spent {_usd(doc['totals']['actual_cost'])}, "
        f"saved {_usd(doc['totals']['savings'])} against on-demand ({_pct(doc['totals']['savings_rate'])})",
        fontsize=12,
    )
    days: Sequence[Mapping[str, Any]] = doc.get("days", [])
    labels = [d["day"][5:] for d in days]
    ax = axes[0][0]
    for key, name, style in (
        ("actual_cost", "actual", "-"),
        ("baseline_static_spot_cost", "static spot baseline", "--"),
        ("baseline_on_demand_cost", "on-demand baseline", ":"),
    ):
        ax.plot(labels, list(accumulate(_f(d[key]) for d in days)), style, marker="o", markersize=3, label=name)
    ax.set_title("Cumulative spend against the baselines (USD)")
    ax.legend(loc="upper left")
    _ticks(ax, labels)
    ax = axes[0][1]
    teams = doc.get("by", {}).get("team", [])
    names = doc.get("teams", {})
    ax.bar([names.get(t["key"], t["key"]) for t in teams], [_f(t["savings"]) for t in teams], color="tab:green")
    ax.set_title("Savings against on-demand by team (USD)")
    ax = axes[1][0]
    clouds = doc.get("by", {}).get("cloud", [])
    accs = doc.get("by", {}).get("accelerator", [])
    keys = [f"{c['key']}" for c in clouds] + [f"{a['key'] or '(egress)'}" for a in accs]
    values = [_f(c["actual_cost"]) for c in clouds] + [_f(a["actual_cost"]) for a in accs]
    colors = ["tab:blue"] * len(clouds) + ["tab:orange"] * len(accs)
    ax.bar(keys, values, color=colors)
    ax.set_title("Spend by cloud (blue) and by accelerator (orange), USD")
    ax = axes[1][1]
    act = doc.get("activity", [])
    a_labels = [a["day"][5:] for a in act]
    ax.bar(a_labels, [a["moves"] for a in act], label="moves", color="tab:purple")
    ax.bar(
        a_labels,
        [a["preemptions"] for a in act],
        bottom=[a["moves"] for a in act],
        label="preemptions",
        color="tab:red",
    )
    ax.set_title("Moves and preemptions per day")
    ax.legend(loc="upper left")
    _ticks(ax, a_labels)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=dpi)
    plt.close(fig)
    return out.getvalue()


def _ticks(ax: Any, labels: Sequence[str]) -> None:
    step = max(1, len(labels) // 10)
    ax.set_xticks(range(0, len(labels), step))
    ax.set_xticklabels([labels[i] for i in range(0, len(labels), step)], rotation=45, ha="right")


def _usd(value: Any) -> str:
    return f"${Decimal(str(value)):,.2f}"


def _pct(value: Any) -> str:
    return "-" if value is None else f"{Decimal(str(value)) * 100:.1f} %"


def _listed(doc: Mapping[str, Any]) -> str:
    """Which of the report's jobs the table lists (the JSON answer's ``jobs_page``)."""
    page = doc.get("jobs_page")
    total = doc["totals"]["jobs"]
    if not page or len(doc["jobs"]) >= total:
        return f"All {total} job(s)."
    first = page["offset"] + 1
    return (
        f"Jobs {first} to {page['offset'] + len(doc['jobs'])} of {total}, by {page['sort']} "
        "(--sort, --offset and --limit list others)."
    )


def report_html(doc: Mapping[str, Any]) -> str:
    """A self-contained HTML page of the report (for mail or a file): headline figures, the charts as an
    inline PNG, and the jobs."""
    t = doc["totals"]
    png = base64.b64encode(charts_png(doc)).decode("ascii")
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(v))}</td>"
            for v in (
                j["job_id"],
                j["name"],
                doc.get("teams", {}).get(j["team"], j["team"]),
                j["state"],
                _usd(j["period"]["actual_cost"]),
                _usd(j["period"]["baseline_on_demand_cost"]),
                _usd(j["period"]["baseline_static_spot_cost"]),
                _usd(j["period"]["savings"]),
                _pct(j["period"]["savings_rate"]),
                ", ".join(f"{o['baseline']}: {o['reason']}" for o in j["over_baseline"]) or "",
            )
        )
        + "</tr>"
        for j in doc["jobs"]
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "job",
            "name",
            "team",
            "state",
            "actual",
            "on-demand baseline",
            "static spot baseline",
            "savings",
            "rate",
            "over a baseline because",
        )
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>costopt savings {html.escape(doc["from"][:10])}</title>
<style>body{{font-family:sans-serif;margin:2em}} td,th{{padding:2px 8px;border-bottom:1px solid #ddd;text-align:left}}
.big{{font-size:1.4em}}</style></head><body>
<h1>Savings report, {html.escape(doc["from"])} to {html.escape(doc["to"])} (UTC)</h1>
<p class="big">Spent <b>{_usd(t["actual_cost"])}</b>. On on-demand instances the same work would have cost
<b>{_usd(t["baseline_on_demand_cost"])}</b>: saved <b>{_usd(t["savings"])}</b> ({_pct(t["savings_rate"])}).
On the cheapest spot offer at submission, never moved: {_usd(t["baseline_static_spot_cost"])}
(saved {_usd(t["savings_vs_static_spot"])}, {_pct(t["savings_rate_vs_static_spot"])}).</p>
<p>Moves cost {_usd(t["move_cost"])} and preemptions {_usd(t["preemption_cost"])} (already in what was spent).
Amounts are exact to the micro-dollar in the JSON and CSV exports; shown here to the cent.</p>
<img alt="charts" src="data:image/png;base64,{png}" style="max-width:100%">
<p>{html.escape(_listed(doc))}</p>
<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>
</body></html>
"""
