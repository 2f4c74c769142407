"""Offline job runs (``costopt.jobs.offline.run_offline``): the preemption study's cost per run.

Run: ``.venv/bin/python bench/offline_jobs_bench.py [--model A3C] [--days 1] [--seeds 1] [--profile]``.
Runs the study (:func:`costopt.backtest.preemption.preemption_study`, its clouds built as the study's script
builds them: ``report_every=STUDY_REPORT_EVERY``) for one model, its three lengths,
the first ``--days`` start days and ``--seeds`` seeds in this process, and prints the wall and CPU seconds
(process time: a loaded machine stretches the wall time far more than the CPU time) and the full study's
estimate at this CPU rate (11,340 runs on 2 processes; target: 10 minutes; the study's runs are 5 of 6
with preemptions, the bench's with ``--seeds 1`` half, so its estimate is low; the CPU per run counts the
runs that reused an earlier one's outcome, as the study does: a run whose placements answered alike, or a
run with hazards whose seed reclaims nothing near the same policy's run without them). ``--profile`` prints the
top of a cProfile (cumulative) of the same runs, ``--dump PATH`` writes its stats.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments" / "backtest"))

from backtest_common import paper_inputs

from api.wiring import build_hazards
from costopt.backtest.preemption import STUDY_JOB_DAYS, STUDY_REPORT_EVERY, preemption_study
from costopt.settings import Settings
from providers.sim import SimConfig, sim_factory

FULL_RUNS = 11_340


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="A3C")
    parser.add_argument("--days", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--dump", type=Path, default=None, help="write the cProfile stats here (with --profile)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    inputs, _ = paper_inputs()
    hazards = build_hazards(Settings())
    prof = cProfile.Profile() if args.profile else None
    t0 = time.perf_counter()
    c0 = time.process_time()
    if prof is not None:
        prof.enable()
    study = preemption_study(
        inputs,
        sim_factory(SimConfig(report_every=STUDY_REPORT_EVERY)),
        hazards,
        models=(args.model,),
        job_days=STUDY_JOB_DAYS,
        seeds=tuple(range(args.seeds)),
        start_days=args.days,
    )
    if prof is not None:
        prof.disable()
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - c0
    per_run = cpu / study.runs
    print(f"{study.runs} runs of {args.model} in {seconds:.1f} s wall, {cpu:.1f} s CPU: {per_run:.3f} s of CPU per run")
    print(
        f"{study.reused} of them took the outcome of an earlier run (placements answering alike, or no reclaim"
        " near the same policy's run without hazards)"
    )
    print(f"full study ({FULL_RUNS} runs) on 2 processes at this rate: {FULL_RUNS * per_run / 2 / 60:.1f} min")
    if prof is not None and args.dump is not None:
        prof.dump_stats(args.dump)
    if prof is not None:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
