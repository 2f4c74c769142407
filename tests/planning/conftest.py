"""Shared planning fixtures: a real throughput catalog and synthetic offer frames."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.loaders import GAVEL_ORACLE_FILE, GAVEL_SIMULATION_FILE, load_throughput_file

ACCS = ("k80", "p100", "v100")


@pytest.fixture(scope="session")
def oracle_catalog(shared_data: Path) -> ThroughputCatalog:
    return ThroughputCatalog.from_measurements(load_throughput_file(shared_data / GAVEL_ORACLE_FILE))


@pytest.fixture(scope="session")
def sim_catalog(shared_data: Path) -> ThroughputCatalog:
    return ThroughputCatalog.from_measurements(load_throughput_file(shared_data / GAVEL_SIMULATION_FILE))


def synthetic_offers(n: int, seed: int = 0) -> pd.DataFrame:
    """``n`` offers over 3 clouds, 20 regions, K80/P100/V100 instances of 1..8 GPUs, both markets."""
    rng = np.random.default_rng(seed)
    acc = rng.choice(ACCS, size=n)
    gpus = rng.choice([1, 2, 4, 8], size=n)
    base = {"k80": 0.9, "p100": 1.46, "v100": 3.06}
    market = rng.choice(["spot", "on_demand"], size=n)
    factor = np.where(market == "spot", rng.uniform(0.25, 0.45, size=n), 1.0)
    price = np.round(np.array([base[a] for a in acc]) * gpus * factor * rng.uniform(0.9, 1.2, size=n), 6)
    cloud = rng.choice(["aws", "gcp", "azure"], size=n)
    region = np.array([f"{c}-region-{i}" for c, i in zip(cloud, rng.integers(0, 20, size=n), strict=True)])
    return pd.DataFrame(
        {
            "cloud": cloud,
            "region": region,
            "zone": [f"{r}-{k}" for r, k in zip(region, rng.integers(0, 3, size=n), strict=True)],
            "instance_type": [f"{a}x{g}-{i}" for i, (a, g) in enumerate(zip(acc, gpus, strict=True))],
            "market": market,
            "accelerator": acc,
            "gpu_count": gpus.astype(float),
            "usd_per_hour": price,
        }
    )
