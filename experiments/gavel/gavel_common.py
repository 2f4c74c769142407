"""Shared runner of the Gavel reproduction sweeps: each spec is one simulation; results are appended
to a JSON-lines file, and specs already there are skipped (a sweep can be stopped and resumed)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
DATA = Path(os.environ.get("COSTOPT_DATA_DIR", ROOT.parent / "shared" / "data"))
RESULTS = Path(__file__).resolve().parent / "results"

Spec = dict[str, Any]


def cap_s(window_end: int, rate: float) -> float:
    """``max_simulated_s`` of a continuous sweep run: the expected arrival of job ``window_end`` plus
    1000 h (a run that hits it is past the policy's saturation)."""
    return (window_end / rate + 1000) * 3600.0


def spec_key(spec: Spec) -> str:
    return json.dumps(spec, sort_keys=True)


def single_lp_las() -> Any:
    """The aware LAS solving its max-min LP alone (the solver's point of the optimum, no Pareto stage): the
    registry's ``max_min_fairness_perf`` until 2026-12-04, and the reference's formulation."""
    from costopt.gavel.policies import MaxMinFairness

    return MaxMinFairness(name="max_min_fairness_perf", aware=True, pareto=False)


def _policy(spec: Spec) -> Any:
    """The spec's policy: by registry name; ``"pareto": false`` on the aware LAS is :func:`single_lp_las`."""
    from costopt.gavel.policies import get_policy

    if spec.get("pareto") is False:
        if spec["policy"] != "max_min_fairness_perf":
            raise ValueError(f"'pareto': false applies to max_min_fairness_perf only, not {spec['policy']}")
        return single_lp_las()
    return get_policy(spec["policy"])


def _run(spec: Spec) -> dict[str, Any]:
    from costopt.gavel.simulator import parse_cluster, simulate, simulate_trace
    from costopt.gavel.trace import generate_trace
    from costopt.gavel.workload import load_workload
    from costopt.throughput import GAVEL_SIMULATION_FILE

    workload = load_workload(DATA / GAVEL_SIMULATION_FILE)
    s = dict(spec)
    policy = _policy(s)
    kind = s.pop("kind", "continuous")
    t0 = time.perf_counter()
    if kind == "static":
        trace = generate_trace(
            workload, s["jobs"], rate_per_hour=None, seed=s["seed"], multi_gpu=s.get("multi_gpu", False)
        )
        cap = parse_cluster(s.get("cluster", "36:36:36"), len(workload.worker_types))
        res = simulate_trace(
            policy,
            trace,
            workload,
            cap,
            seed=s["seed"],
            multi_gpu=s.get("multi_gpu", False),
            space_sharing=s.get("space_sharing", False),
            resolve_interval_s=s.get("resolve_interval_s"),
        )
    else:
        res = simulate(
            policy,
            s.get("cluster", "36:36:36"),
            rate=s["rate"],
            seed=s["seed"],
            window=tuple(s.get("window", (4000, 5000))),
            multi_gpu=s.get("multi_gpu", False),
            space_sharing=s.get("space_sharing", False),
            restart_overhead_s=s.get("restart_overhead_s", 0.0),
            workload=workload,
            resolve_interval_s=s.get("resolve_interval_s"),
            max_simulated_s=s.get("max_simulated_s", 5.0e7),
            slos=s.get("slos", False),
        )
    out = res.as_dict()
    out["spec"] = spec
    out["runner_wall_s"] = time.perf_counter() - t0
    return out


def run_specs(specs: Iterable[Spec], out: Path, processes: int = 2) -> None:
    """Run the specs not yet in ``out`` (JSON lines), ``processes`` at a time, appending as they finish."""
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            if line.strip():
                done.add(spec_key(json.loads(line)["spec"]))
    todo = [s for s in specs if spec_key(s) not in done]
    print(f"{out.name}: {len(done)} done, {len(todo)} to run", flush=True)
    with ProcessPoolExecutor(max_workers=processes) as pool:
        futures = {pool.submit(_run, s): s for s in todo}
        for fut in as_completed(futures):
            r = fut.result()
            with out.open("a") as f:
                f.write(json.dumps(r) + "\n")
            print(
                f"  {r['spec']} -> avg JCT {r['avg_jct_s'] / 3600:.2f} h, makespan {r['makespan_s'] / 3600:.1f} h, "
                f"complete {r['window_complete']}, wall {r['runner_wall_s']:.0f} s",
                flush=True,
            )


def load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
