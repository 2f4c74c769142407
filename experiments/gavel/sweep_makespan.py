"""Makespan on static traces (all jobs at t = 0): the makespan policy (min_total_duration), aware vs
agnostic, plus max-min fairness for reference; 100-500 jobs, 3 seeds, 36:36:36 (or --cluster).
Run: .venv/bin/python experiments/gavel/sweep_makespan.py [--multi-gpu] [--cluster 12:12:12]"""

from __future__ import annotations

import argparse

from gavel_common import RESULTS, run_specs

POLICIES = ("min_total_duration", "min_total_duration_perf", "max_min_fairness", "max_min_fairness_perf")
SIZES = (100, 200, 300, 400, 500)
SEEDS = (0, 1, 2)


def specs(multi_gpu: bool, cluster: str) -> list[dict[str, object]]:
    extra = {} if cluster == "36:36:36" else {"cluster": cluster}
    return [
        {"kind": "static", "policy": p, "jobs": n, "seed": s, "multi_gpu": multi_gpu, **extra}
        for n in SIZES
        for s in SEEDS
        for p in POLICIES
    ]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--multi-gpu", action="store_true")
    ap.add_argument("--cluster", default="36:36:36", help="V100:P100:K80 GPU counts")
    ap.add_argument("--processes", type=int, default=2)
    args = ap.parse_args()
    name = "makespan_multi_gpu" if args.multi_gpu else "makespan_single_gpu"
    if args.cluster != "36:36:36":
        name += "_" + args.cluster.replace(":", "_")
    run_specs(specs(args.multi_gpu, args.cluster), RESULTS / f"{name}.jsonl", args.processes)
