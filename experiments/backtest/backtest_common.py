"""Shared by the backtest experiment scripts: the paper's inputs from a scratch store, docs sections.

The scripts run from the project root (``.venv/bin/python experiments/backtest/<script>.py``).
"""

from __future__ import annotations

import logging
import re
import tempfile
import time
from pathlib import Path

from api.wiring import build_store
from costopt.backtest.paper import PaperInputs, load_paper_inputs, paper_price_files
from costopt.settings import PROJECT_ROOT, Settings
from costopt.throughput.loaders import GAVEL_ORACLE_FILE
from pricing.importer import import_paths

DOC = PROJECT_ROOT / "docs" / "backtest.md"
FIGURES = PROJECT_ROOT / "docs" / "figures"

log = logging.getLogger("experiments.backtest")


def paper_inputs(data_dir: Path | None = None) -> tuple[PaperInputs, float]:
    """Import the paper's price files into a scratch SQLite store and read them back through the
    backtest's loader (the same path as ``costopt backtest paper``). Returns the inputs and the seconds
    it took."""
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="costopt-backtest-"))
    settings = Settings(database_url=f"sqlite:///{tmp / 'store.db'}")
    data = data_dir or settings.data_dir
    if data is None:
        raise SystemExit("../shared/data is needed (set COSTOPT_DATA_DIR or pass --data)")
    store = build_store(settings)
    reports = import_paths(store, paper_price_files(data, settings.catalog_dir))
    failed = [r for r in reports if r.status not in ("imported",)]
    if failed:
        raise SystemExit(f"import failed: {[(str(r.path), r.error) for r in failed]}")
    inputs = load_paper_inputs(store, data / GAVEL_ORACLE_FILE)
    store.engine.dispose()
    return inputs, time.perf_counter() - t0


def replace_section(name: str, text: str, path: Path = DOC) -> None:
    """Replace what lies between ``<!-- {name}:start -->`` and ``<!-- {name}:end -->`` in ``path``."""
    doc = path.read_text()
    pattern = re.compile(rf"(<!-- {re.escape(name)}:start -->\n).*?(<!-- {re.escape(name)}:end -->)", re.S)
    if not pattern.search(doc):
        raise SystemExit(f"{path} has no section {name!r}")
    path.write_text(pattern.sub(lambda m: m.group(1) + text.rstrip("\n") + "\n" + m.group(2), doc))


def short(model: str) -> str:
    """``ResNet-50 (batch size 128)`` -> ``ResNet-50``."""
    return model.split(" (")[0]
