"""CPU time of a throughput catalog rebuild's fold of the recorded measurements
(:meth:`costopt.throughput.registry.MeasurementRegistry.apply`) over the Gavel file's catalog, with N job
measurements in a scratch SQLite database (a running job records one per 15-minute window: 10 jobs over 10
days are ~10,000). Run: ``.venv/bin/python bench/catalog_rebuild_bench.py --measurements 2000,10000``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
DATA = Path(os.environ.get("COSTOPT_DATA_DIR", ROOT.parent / "shared" / "data"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--measurements", default="2000,10000", help="comma-separated counts")
    args = ap.parse_args()

    from costopt.db.engine import make_engine, migrate
    from costopt.db.schema import throughput_measurements
    from costopt.throughput import GAVEL_SIMULATION_FILE, ThroughputCatalog, load_gavel_throughputs
    from costopt.throughput.registry import MeasurementRegistry

    base = ThroughputCatalog.from_measurements(load_gavel_throughputs(DATA / GAVEL_SIMULATION_FILE))
    job_types = sorted({k.job_type.name for k in base.cells})
    at = datetime(2026, 1, 1, tzinfo=UTC)
    for n in (int(x) for x in args.measurements.split(",") if x):
        rows = [
            {
                "job_type": job_types[i % len(job_types)],
                "accelerator": ("v100", "p100", "k80")[i % 3],
                "gpu_count": 1,
                "placement": "consolidated",
                "steps_per_s": 1.0 + i % 7,
                "n_measurements": 1,
                "provenance": "user",
                "source": f"job:j{i % 50}:fp32",
                "measured_at": at,
            }
            for i in range(n)
        ]
        with tempfile.TemporaryDirectory() as tmp:
            engine = make_engine(f"sqlite:///{tmp}/bench.db")
            migrate(engine)
            with engine.begin() as conn:
                conn.execute(throughput_measurements.insert(), rows)
            t0 = time.process_time()
            MeasurementRegistry(engine).apply(base)
            cpu = time.process_time() - t0
            engine.dispose()
        print(
            f"{n:,} measurements over {len(base.cells)} cells and {len(base.pairs):,} pairs: "
            f"apply {cpu:.3f} s CPU (load {os.getloadavg()[0]:.1f})"
        )


if __name__ == "__main__":
    main()
