"""Finish-time fairness: rho (JCT over the JCT of an isolated 1/N share) of jobs 1000-1499 under the
finish-time-fairness policy (aware and agnostic) and under LAS, at 2, 3 and 5 jobs/h on 36:36:36,
3 seeds. Run: .venv/bin/python experiments/gavel/sweep_ftf.py"""

from __future__ import annotations

import argparse

from gavel_common import RESULTS, cap_s, run_specs

POLICIES = ("finish_time_fairness", "finish_time_fairness_perf", "max_min_fairness", "max_min_fairness_perf")
RATES = (2.0, 3.0, 5.0)
SEEDS = (0, 1, 2)


def specs() -> list[dict[str, object]]:
    return [
        {"policy": p, "rate": r, "seed": s, "window": [1000, 1500], "max_simulated_s": cap_s(1500, r)}
        for r in RATES
        for s in SEEDS
        for p in POLICIES
    ]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=2)
    args = ap.parse_args()
    run_specs(specs(), RESULTS / "ftf.jsonl", args.processes)
