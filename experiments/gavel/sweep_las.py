"""Average JCT vs input load for least-attained-service (max-min fairness), heterogeneity-agnostic
vs aware, on 36 V100 / 36 P100 / 36 K80 (Gavel's continuous-trace experiment): jobs 4000-4999 of a
Poisson trace, 3 seeds per point. Run: .venv/bin/python experiments/gavel/sweep_las.py [--multi-gpu]

A run stops when the window's jobs are done or after (arrival of job 5000 + 1000 h) of simulated time:
a point that hits the cap is past the policy's saturation (``window_complete`` false; its JCT is a
lower bound).
"""

from __future__ import annotations

import argparse

from gavel_common import RESULTS, cap_s, run_specs

POLICIES = ("max_min_fairness", "max_min_fairness_perf")
SINGLE_RATES = (0.4, 1.0, 2.0, 3.0, 4.0, 4.5, 5.0, 5.25, 5.5, 5.75, 6.0)
MULTI_RATES = (0.4, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5)
SEEDS = (0, 1, 2)


def specs(multi_gpu: bool) -> list[dict[str, object]]:
    rates = MULTI_RATES if multi_gpu else SINGLE_RATES
    return [
        {
            "policy": p,
            "rate": r,
            "seed": s,
            "window": [4000, 5000],
            "multi_gpu": multi_gpu,
            "max_simulated_s": cap_s(5000, r),
        }
        for r in rates
        for s in SEEDS
        for p in POLICIES
    ]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--multi-gpu", action="store_true")
    ap.add_argument("--processes", type=int, default=2)
    args = ap.parse_args()
    name = "las_multi_gpu.jsonl" if args.multi_gpu else "las_single_gpu.jsonl"
    run_specs(specs(args.multi_gpu), RESULTS / name, args.processes)
