"""Restart overhead: the same LAS runs with 0 s and 30 s charged per move (a job resumed from its
checkpoint on other GPUs), jobs 4000-4999 at 3 and 5 jobs/h, 36:36:36, seed 0.
Run: .venv/bin/python experiments/gavel/sweep_overhead.py"""

from __future__ import annotations

import argparse

from gavel_common import RESULTS, cap_s, run_specs

POLICIES = ("max_min_fairness", "max_min_fairness_perf", "fifo_perf")
RATES = (3.0, 5.0)
OVERHEADS = (0.0, 30.0)


def specs() -> list[dict[str, object]]:
    return [
        {
            "policy": p,
            "rate": r,
            "seed": 0,
            "window": [4000, 5000],
            "restart_overhead_s": o,
            "max_simulated_s": cap_s(5000, r),
        }
        for r in RATES
        for o in OVERHEADS
        for p in POLICIES
    ]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=2)
    args = ap.parse_args()
    run_specs(specs(), RESULTS / "overhead.jsonl", args.processes)
