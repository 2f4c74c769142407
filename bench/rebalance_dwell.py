"""Does the service's rebalancer move a ``make run`` job? The decision rule's dwell against the seeded prices.

Two parts, both on the real data folder:

- ``backtest`` (default): one job through the job service's path (``run_job_backtest``: engine,
  rebalancer, migrator, watcher, ledger over the simulated cloud) on the prices ``make run`` seeds, from
  ``COSTOPT_SIM_START``, with hourly rebalancer passes, for several dwell times and seeds: moves,
  preemptions, cost and the first move's simulated time.
- ``live``: ``costopt serve`` on a fresh SQLite database with the service's settings (extra ``KEY=VALUE``
  settings after ``--env``), one job submitted over REST, its moves, preemptions and recoveries printed
  with the wall time since submission, for ``--seconds`` of wall time.

Run: ``.venv/bin/python bench/rebalance_dwell.py [backtest] [--steps 300000] [--dwell 24 1 6] [--seeds 0 1 2]``
or ``.venv/bin/python bench/rebalance_dwell.py live [--seconds 360] [--env COSTOPT_REBALANCE_DWELL=PT24H]``.
Figures and the machine's load are in docs/migration.md ("Why the service's dwell is 1 h").
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

JOB_TYPE = "ResNet-50 (batch size 128)"


def backtest(steps: float, dwells: list[float], seeds: list[int], days: float) -> None:
    from api.wiring import build_catalog, build_hazards, build_store, seed_paths
    from costopt.backtest.job import run_job_backtest
    from costopt.ledger.prices import StepPrices
    from costopt.migration.decision import MigrationRule
    from costopt.settings import Settings
    from pricing.importer import import_paths
    from providers.sim import SimConfig, sim_factory

    settings = Settings()
    scratch = Path(tempfile.mkdtemp(prefix="costopt-dwell-"))
    store = build_store(settings.model_copy(update={"database_url": f"sqlite:///{scratch / 'prices.db'}"}))
    import_paths(store, seed_paths(settings))  # what `make run` seeds
    t0 = settings.sim_start
    t1 = t0 + timedelta(days=days)
    prices = StepPrices.load(store, t0 - timedelta(days=8), t1)
    catalog = build_catalog(settings, store.engine)
    hazards = build_hazards(settings)
    timing = SimConfig().timing
    rule0 = MigrationRule()
    print(
        f"{steps:.0f} steps of {JOB_TYPE} from {t0:%Y-%m-%d %H:%M}, margin {rule0.margin_fraction:.0%} / "
        f"${rule0.margin_min_usd:g}, hourly passes"
    )
    for dwell in dwells:
        for seed in seeds:
            rule = MigrationRule(
                dwell_hours=dwell, restart_hours=timing.restart_hours, checkpoint_overlap_hours=timing.checkpoint_hours
            )
            t = time.perf_counter()
            d = run_job_backtest(
                prices,
                catalog,
                sim_factory(),
                job_type=JOB_TYPE,
                steps=steps,
                start=t0,
                end=t1,
                hazards=hazards,
                rebalance_hours=1.0,
                seed=seed,
                rule=rule,
            ).as_dict()
            moved = [x["at"] for x in d["decisions"] if x["event"] == "rebalance" and x["action"] != "stayed"]
            print(
                f"dwell {dwell:4g} h seed {seed}: {d['moves']} moves, {d['preemptions']} preemptions, "
                f"${d['total_cost_usd']}, {d['hours']} h, first move {moved[0] if moved else None} "
                f"({time.perf_counter() - t:.0f} s)",
                flush=True,
            )


def live(seconds: float, steps: int, extra: dict[str, str]) -> None:
    import httpx

    root = Path(__file__).resolve().parent.parent
    tmp = tempfile.mkdtemp(prefix="costopt-dwell-live-")
    port = "8791"
    env = {
        **os.environ,
        "COSTOPT_DATABASE_URL": f"sqlite:///{tmp}/run.db",
        "COSTOPT_API_PORT": port,
        "COSTOPT_CHECKPOINT_ROOT": f"file://{tmp}/ckpt",
        **extra,
    }
    costopt = str(root / ".venv" / "bin" / "costopt")
    subprocess.run([costopt, "db", "migrate"], env=env, check=True, capture_output=True)
    proc = subprocess.Popen(
        [costopt, "serve", "--no-collect"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        key = None
        assert proc.stdout is not None
        while key is None:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit("the service exited before printing its admin key")
            if m := re.search(r"admin key \(shown once\): (\S+)", line):
                key = m.group(1)
        base, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {key}"}
        while True:
            try:
                if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        body = {"name": "demo", "job_type": JOB_TYPE, "steps": steps, "command": ["python", "train.py"]}
        job = httpx.post(base + "/v1/jobs", headers=auth, json=body, timeout=60).json()
        t0, seen, doc = time.monotonic(), 0, job
        while time.monotonic() - t0 < seconds and doc["state"] not in ("succeeded", "failed", "cancelled"):
            time.sleep(2)
            doc = httpx.get(f"{base}/v1/jobs/{job['id']}", headers=auth, timeout=60).json()
            for m in doc["moves"][seen:]:
                to = (m.get("to") or {}).get("region")
                print(f"+{time.monotonic() - t0:6.1f} s: {m['kind']:10s} at {m['at']} -> {to}", flush=True)
            seen = len(doc["moves"])
        kinds = [m["kind"] for m in doc["moves"]]
        print(
            f"after {time.monotonic() - t0:.0f} s: {doc['state']}, {doc['steps_done']}/{doc['steps_total']} steps, "
            f"{kinds.count('move')} moves, {kinds.count('preemption')} preemptions, ${doc['cost_so_far_usd']}"
        )
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", nargs="?", choices=("backtest", "live"), default="backtest")
    p.add_argument("--steps", type=int, default=300_000)
    p.add_argument("--dwell", type=float, nargs="+", default=[24.0, 1.0, 6.0], help="dwell hours (backtest)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="sim seeds (backtest)")
    p.add_argument("--days", type=float, default=4.0, help="simulated days at most (backtest)")
    p.add_argument("--seconds", type=float, default=360.0, help="wall seconds to watch (live)")
    p.add_argument("--env", nargs="*", default=[], metavar="KEY=VALUE", help="extra settings (live)")
    args = p.parse_args()
    logging.disable(logging.WARNING)
    if args.mode == "live":
        live(args.seconds, args.steps, dict(kv.split("=", 1) for kv in args.env))
    else:
        backtest(args.steps, args.dwell, args.seeds, args.days)


if __name__ == "__main__":
    main()
