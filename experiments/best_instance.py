"""The dynamic-pricing paper's first finding on real 2020 prices: the best instance depends on the
model and on the objective.

Run: ``.venv/bin/python experiments/best_instance.py [--at 2020-03-01T00:00:00Z] [--job-days 1]
[--out docs/best_instance.md]``. It seeds a scratch store from ../shared/data, plans each of the
paper's six models under each objective with the project's own planner, and writes a markdown
table (and prints it).
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

from api.planning import plan_single
from api.wiring import build_store, seed_if_empty
from costopt.domain import parse_utc
from costopt.planning.model import Infeasible, JobSpec, MinCost, MinCostByDeadline, MinTime, Objective, Weighted
from costopt.settings import PROJECT_ROOT, Settings
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.loaders import GAVEL_ORACLE_FILE, load_throughput_file
from costopt.throughput.model import JobType

MODELS = (
    "A3C",
    "CycleGAN",
    "LM (batch size 80)",
    "Recommendation (batch size 8192)",
    "ResNet-50 (batch size 128)",
    "Transformer (batch size 256)",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--at", default="2020-03-01T00:00:00Z")
    ap.add_argument("--job-days", type=float, default=1.0, help="job size in V100-days of work")
    ap.add_argument("--deadline-hours", type=float, default=36.0)
    ap.add_argument("--out", type=Path, default=PROJECT_ROOT / "docs" / "best_instance.md")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="costopt-best-"))
    settings = Settings(database_url=f"sqlite:///{tmp / 'store.db'}", estimate_new_accelerators=False)
    data_dir = settings.data_dir
    if data_dir is None:
        raise SystemExit("../shared/data is needed (set COSTOPT_DATA_DIR)")
    settings = settings.model_copy(update={"throughput_file": data_dir / GAVEL_ORACLE_FILE})
    store = build_store(settings)
    seed_if_empty(store, settings)
    at = parse_utc(args.at)
    catalog = ThroughputCatalog.from_measurements(load_throughput_file(data_dir / GAVEL_ORACLE_FILE))
    objectives: list[tuple[str, Objective]] = [
        ("min-cost", MinCost()),
        ("min-time", MinTime()),
        (f"min-cost, deadline {args.deadline_hours:g} h", MinCostByDeadline(args.deadline_hours, 0.95)),
        ("weighted 50/50", Weighted(0.5)),
    ]
    lines = [
        "# The best instance depends on the model and the objective",
        "",
        f"Offers in effect at {args.at} (AWS spot in 6 regions, Azure spot in 3 regions; 2020 data of the",
        "dynamic-pricing paper), single-GPU jobs of "
        f"{args.job_days:g} V100-day(s) of work each, throughputs of the paper's file",
        "(`prices/gavel_oracle_throughputs_k80_p100_v100.json`), per-GPU packing, preemption hazards",
        "from the 2020 availability logs. Produced by `.venv/bin/python experiments/best_instance.py`.",
        "",
        "| model | " + " | ".join(name for name, _ in objectives) + " |",
        "|---|" + "---|" * len(objectives),
    ]
    winners: Counter[str] = Counter()
    for model in MODELS:
        jt = JobType.parse(model)
        v100 = catalog.get(jt, "v100")
        if v100 is None:
            raise SystemExit(f"{model}: no V100 throughput in the file")
        job = JobSpec(jt, steps=v100.steps_per_s * 86400 * args.job_days)
        cells = []
        for _name, obj in objectives:
            try:
                _, plan = plan_single(store, settings, job, obj, at=at, top=1, per_gpu_packing=True)
            except Infeasible as exc:
                cells.append(f"infeasible ({exc.binding})")
                continue
            w = plan.winner
            label = f"{w.cloud} {w.instance_type} {w.market} ({w.accelerator})"
            winners[label] += 1
            cells.append(f"{label}: ${w.expected_cost_usd:.2f}, {w.expected_hours:.1f} h")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"{len(winners)} distinct winning offers across {len(MODELS)} models x {len(objectives)} objectives.",
        "",
    ]
    text = "\n".join(lines)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
