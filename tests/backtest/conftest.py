"""Backtest fixtures: tiny hand-made price histories and the real 2020 data of the paper."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from costopt.backtest.grid import OfferSet
from costopt.backtest.paper import PaperInputs, load_paper_inputs, paper_price_files
from costopt.settings import Settings
from costopt.throughput.loaders import GAVEL_ORACLE_FILE

DAY0 = datetime(2020, 3, 1, tzinfo=UTC)


def offer(
    name: str,
    *,
    cloud: str = "aws",
    region: str = "r1",
    zone: str = "",
    market: str = "spot",
    acc: str = "v100",
    gpus: float = 1.0,
) -> dict[str, object]:
    return {
        "cloud": cloud,
        "region": region,
        "zone": zone,
        "instance_type": name,
        "market": market,
        "accelerator": acc,
        "gpu_count": gpus,
    }


def offers(*rows: dict[str, object]) -> OfferSet:
    return OfferSet.from_frame(pd.DataFrame(list(rows)))


def history(points: list[tuple[dict[str, object], str, float]]) -> pd.DataFrame:
    """Change points ``(offer, ISO time, USD/h)`` as a ``PriceStore.history`` frame."""
    rows = [
        {
            **{k: o[k] for k in ("cloud", "region", "zone", "instance_type", "market")},
            "valid_from": pd.Timestamp(t),
            "usd_per_hour": usd,
            "source": "test",
        }
        for o, t, usd in points
    ]
    frame = pd.DataFrame(rows)
    frame["valid_from"] = pd.to_datetime(frame["valid_from"], utc=True)
    return frame


@pytest.fixture(scope="session")
def paper_inputs(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PaperInputs]:
    """The paper's prices imported into a scratch SQLite store, read back through the loader."""
    from api.wiring import build_store
    from pricing.importer import import_paths

    tmp = tmp_path_factory.mktemp("paper")
    settings = Settings(database_url=f"sqlite:///{tmp / 'store.db'}", data_dir=shared_data)
    store = build_store(settings)
    reports = import_paths(store, paper_price_files(shared_data, settings.catalog_dir))
    assert all(r.status == "imported" for r in reports)
    yield load_paper_inputs(store, shared_data / GAVEL_ORACLE_FILE)
    store.engine.dispose()
