"""The effect of space sharing: LAS aware with and without co-location (pairs from Gavel's measured
co-located throughputs), with and without the Pareto second stage (the registry's aware LAS takes it
since 2026-12-04; ``"pareto": false`` is its single LP), jobs 4000-4999, 36:36:36, 3 seeds.
Run: .venv/bin/python experiments/gavel/sweep_space_sharing.py"""

from __future__ import annotations

import argparse

from gavel_common import RESULTS, cap_s, run_specs

RATES = (3.0, 5.0, 6.0)
SEEDS = (0, 1, 2)
VARIANTS = (
    {"policy": "max_min_fairness_perf", "pareto": False, "space_sharing": False},
    {"policy": "max_min_fairness_perf", "pareto": False, "space_sharing": True},
    {"policy": "max_min_fairness_perf", "space_sharing": False},
    {"policy": "max_min_fairness_perf", "space_sharing": True},
)


def specs() -> list[dict[str, object]]:
    return [
        {**v, "rate": r, "seed": s, "window": [4000, 5000], "max_simulated_s": cap_s(5000, r)}
        for r in RATES
        for s in SEEDS
        for v in VARIANTS
    ]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=2)
    args = ap.parse_args()
    run_specs(specs(), RESULTS / "space_sharing.jsonl", args.processes)
