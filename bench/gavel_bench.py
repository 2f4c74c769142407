"""Gavel policy and simulator benchmarks (issue 4). Run: .venv/bin/python bench/gavel_bench.py [--sim | --sim-only]

Each solver case runs in its own process so that its peak memory is its own. Targets (2-core box):
max-min fairness (aware, Gavel's setting) 2048 jobs <= 50 ms, 100,000 jobs <= 5 s; with space sharing
512 jobs <= 1 s, 2048 jobs <= 5 s and <= 2 GB; per-job-state policies 2048 jobs <= 1 s; the 1000-job
window at 5 jobs/h on 36:36:36 <= 20 s per policy run (``--sim``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from costopt.gavel.workload import Workload

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = Path(os.environ.get("COSTOPT_DATA_DIR", ROOT.parent / "shared" / "data"))

SOLVER_CASES: list[tuple[str, int, bool, float]] = [
    ("max_min_fairness_perf", 2048, False, 0.05),
    ("max_min_fairness_perf", 100_000, False, 5.0),
    ("max_min_fairness_perf", 512, True, 1.0),
    ("max_min_fairness_perf", 2048, True, 5.0),
    ("max_min_fairness", 2048, False, 1.0),
    ("finish_time_fairness_perf", 2048, False, 1.0),
    ("finish_time_fairness", 2048, False, 1.0),
    ("min_total_duration_perf", 2048, False, 1.0),
    ("fifo_perf", 2048, False, 1.0),
    ("fifo", 2048, False, 1.0),
    ("max_sum_throughput_perf", 2048, False, 1.0),
    ("max_sum_throughput_normalized_by_cost_perf_SLOs", 2048, False, 1.0),
    ("hierarchical_fairness_perf", 2048, False, 1.0),
]
SIM_TARGET_S = 20.0
SIM_POLICIES = [
    "max_min_fairness",
    "max_min_fairness_perf",
    "finish_time_fairness",
    "finish_time_fairness_perf",
    "min_total_duration_perf",
    "fifo",
    "fifo_perf",
    "max_sum_throughput_perf",
    "max_sum_throughput_normalized_by_cost_perf_SLOs",
    "hierarchical_fairness_perf",
]


def _workload() -> Workload:
    from costopt.gavel.workload import load_workload
    from costopt.throughput import GAVEL_SIMULATION_FILE

    return load_workload(DATA / GAVEL_SIMULATION_FILE)


def one_case(policy: str, jobs: int, space_sharing: bool) -> dict[str, Any]:
    from costopt.gavel.bench import bench_policy

    return bench_policy(policy, jobs, space_sharing, workload=_workload()).as_dict()


def merged_vs_per_job(sizes: list[int]) -> list[dict[str, Any]]:
    from costopt.gavel.bench import benchmark_state
    from costopt.gavel.policies import MaxMinFairness

    w = _workload()
    rows = []
    for n in sizes:
        st = benchmark_state(w, n, seed=n, space_sharing=True)
        t0 = time.perf_counter()
        merged = MaxMinFairness(merge=True).allocate(st)
        t1 = time.perf_counter()
        per_job = MaxMinFairness(merge=False).allocate(st)
        t2 = time.perf_counter()
        rows.append(
            {
                "jobs": n,
                "merged": merged.objective,
                "per_job": per_job.objective,
                "abs_diff": abs(merged.objective - per_job.objective),
                "merged_s": t1 - t0,
                "per_job_s": t2 - t1,
                "per_job_columns": per_job.stats["lp_columns"],
            }
        )
    return rows


def run_sim(policy: str, restart_overhead_s: float = 0.0) -> dict[str, Any]:
    from costopt.gavel.simulator import simulate

    return simulate(
        policy,
        "36:36:36",
        rate=5.0,
        seed=0,
        window=(4000, 5000),
        workload=_workload(),
        restart_overhead_s=restart_overhead_s,
        slos=policy.endswith("_SLOs"),
    ).as_dict()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--one", nargs=3, metavar=("POLICY", "JOBS", "SPACE_SHARING"), help=argparse.SUPPRESS)
    ap.add_argument("--sim", action="store_true", help="also run the 1000-job window per policy (slow)")
    ap.add_argument("--sim-only", action="store_true", help="only the 1000-job window per policy (no solver cases)")
    ap.add_argument("--merge-sizes", default="16,64,128,256", help="sizes for the merged vs per-job check")
    ap.add_argument("--out", type=Path, help="write all results as JSON here")
    ap.add_argument(
        "--json", action="store_true", help="print all results as one JSON object (the table goes to stderr)"
    )
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_case(args.one[0], int(args.one[1]), args.one[2] == "1")))
        return
    if args.json:
        with contextlib.redirect_stdout(sys.stderr):
            results = run_all(args)
        print(json.dumps(results))
    else:
        run_all(args)


def run_all(args: argparse.Namespace) -> dict[str, object]:
    """Run the cases ``args`` select, print their table, write ``args.out`` if given; return the results."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    results: dict[str, object] = {}
    rows = []
    if not args.sim_only:
        print(f"{'policy':50s} {'jobs':>7s} {'ss':>3s} {'solve_s':>9s} {'target':>7s} {'peak_MB':>8s}  objective")
        for policy, jobs, ss, target in SOLVER_CASES:
            out = subprocess.run(
                [sys.executable, __file__, "--one", policy, str(jobs), "1" if ss else "0"],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r["target_s"] = target
            rows.append(r)
            ok = "ok" if r["solve_s"] <= target else "SLOW"
            print(
                f"{policy:50s} {jobs:7d} {('yes' if ss else 'no'):>3s} {r['solve_s']:9.4f} {target:7.2f} "
                f"{r['peak_mem_mb']:8.0f}  {r['objective']:.6g}  {ok}"
            )
        results["solver"] = rows
        sizes = [int(s) for s in args.merge_sizes.split(",") if s]
        print("\nmerged (job classes) vs per-job max-min LP with space sharing:")
        merge_rows = merged_vs_per_job(sizes)
        for m in merge_rows:
            print(
                f"  {m['jobs']:4d} jobs: merged {m['merged']:.9f} ({m['merged_s']:.3f} s)  per-job {m['per_job']:.9f} "
                f"({m['per_job_s']:.2f} s, {m['per_job_columns']:.0f} columns)  |diff| {m['abs_diff']:.1e}"
            )
        results["merge"] = merge_rows
    if args.sim or args.sim_only:
        print("\n1000-job window (jobs 4000-4999), 5 jobs/h, 36:36:36, seed 0:")
        sims = []
        for policy in SIM_POLICIES:
            r = run_sim(policy)
            sims.append(r)
            print(
                f"  {policy:48s} wall {r['wall_s']:6.1f} s  avg JCT {r['avg_jct_s'] / 3600:7.2f} h  "
                f"makespan {r['makespan_s'] / 3600:7.1f} h  util {r['utilization']:.3f}  solves {r['solves']}  "
                + ("ok" if r["wall_s"] <= SIM_TARGET_S else "SLOW")
            )
        results["sim"] = sims
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
