"""Savings reports for finance, read from the ledger (docs/ledger.md, "Reports").

- :mod:`.references`: each team's on-demand reference (a light module, checked by the settings);
- :mod:`.model`: the query, rows (pieces of actual cost), baselines, each job's figures, group sums;
- :mod:`.baselines`: how each baseline is chosen (on-demand reference per team, static spot from the
  quote) and priced over the price history of the job's run;
- :mod:`.data`: what a report reads from the database (:func:`load_report_data`);
- :mod:`.savings`: the report itself (:func:`build_report`), computed from that data;
- :mod:`.apportion`: exact integer splits (days, baselines over rows);
- :mod:`.render`: the JSON document; :mod:`.focus`: FinOps FOCUS exports (CSV, Parquet);
  :mod:`.charts`: PNG charts and the mailable HTML.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BaselineChoice": "baselines",
    "BaselineSource": "baselines",
    "QuoteBaselines": "baselines",
    "price_baseline": "baselines",
    "static_spot_from_quote": "baselines",
    "Reference": "references",
    "ReferenceRules": "references",
    "ReportData": "data",
    "load_report_data": "data",
    "DIMENSIONS": "model",
    "BaselineKind": "model",
    "BaselineRun": "model",
    "Figures": "model",
    "JobFigures": "model",
    "NoBaseline": "model",
    "ReportQuery": "model",
    "Row": "model",
    "SavingsReport": "model",
    "ReportError": "errors",
    "report_doc": "render",
    "build_report": "savings",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """The names above, imported on first use: the package itself stays light (the settings import
    :mod:`.references` at start-up, and the CLI must start without pandas)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
