"""Simulated agents benchmark: how much wall time a simulated month of jobs costs on the simulated cloud.

Run: ``.venv/bin/python bench/sim_agents_bench.py [--jobs 50] [--days 30] [--tick-minutes 2] [--state-file]``. Launches
``--jobs`` jobs (on-demand, each long enough to train the whole month at 2 steps/s) with simulated agents
writing to local checkpoint locations, then advances the clock through the month in ticks of
``--tick-minutes`` simulated minutes (what the service's driver does: 0.2 s x 600 = 2 min), and prints the
wall time (and the process's CPU time), the progress records and checkpoints written, and the audit time of
one job. ``--state-file``: the cloud keeps its state in a file (``COSTOPT_SIM_STATE_FILE``,
:meth:`SimCloud.persist_to`), saved after every tick; it prints the saves and the file's final size.
Target on a 2-core machine: a simulated month of 50 jobs in under 60 s of wall time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from costopt.agent import control, job_env
from costopt.agent.contract import contract_env
from costopt.cloud import LaunchSpec
from costopt.domain import Cloud, Market, OfferKey
from costopt.ledger import StepPrices
from costopt.risk.hazard import HazardModel
from providers.sim import SimCloud

START = datetime(2020, 3, 1, tzinfo=UTC)
OFFER = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--tick-minutes", type=float, default=2.0)
    parser.add_argument("--state-file", action="store_true", help="keep the cloud's state in a file (persist_to)")
    args = parser.parse_args()
    frame = pd.DataFrame(
        [
            {
                "cloud": "aws",
                "region": OFFER.region,
                "zone": OFFER.zone,
                "instance_type": OFFER.instance_type,
                "market": "on_demand",
                "valid_from": START - timedelta(days=1),
                "usd_per_hour": 3.06,
            }
        ]
    )
    prices = StepPrices.from_history(frame, {("aws", "p3.2xlarge"): ("v100", 1.0)})
    cloud = SimCloud(prices, HazardModel(defaults=dict.fromkeys(Cloud, 0.0)), start=START)
    steps = int(2.0 * 86400 * args.days)
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "sim-state.pickle"
        if args.state_file:
            cloud.persist_to(state)
        uris = [f"{tmp}/job-{i}" for i in range(args.jobs)]
        for i, uri in enumerate(uris):
            env = {**contract_env(f"job-{i}", uri, 1), **job_env(steps, steps_per_second=2.0)}
            cloud.launch(LaunchSpec(offer=OFFER, env=env), f"job-{i}:1")
        end = START + timedelta(days=args.days)
        tick = timedelta(minutes=args.tick_minutes)
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        ticks = 0
        while cloud.now() < end:
            cloud.run_to(min(end, cloud.now() + tick))
            ticks += 1
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        state_bytes = state.stat().st_size if args.state_file else 0
        records = control.records(uris[0])
        t1 = time.perf_counter()
        audit = control.audit_job(uris[0])
        audit_s = time.perf_counter() - t1
    span = f"{args.jobs} jobs x {args.days:g} simulated days"
    print(f"{span} in {ticks} ticks of {args.tick_minutes:g} min: {wall:.2f} s wall, {cpu:.2f} s CPU")
    if args.state_file:
        print(f"state file: {cloud.saves} saves, {state_bytes / 1e6:.2f} MB at the end")
    print(f"per job: {len(records)} progress records, {sum(r['event'] == 'checkpoint' for r in records)} checkpoints")
    print(f"audit of one job: {audit_s * 1000:.1f} ms ({audit.steps_done} steps counted)")


if __name__ == "__main__":
    main()
