"""Savings reports for finance, read from the ledger (docs/ledger.md, "Reports").

- :mod:`.model`: the query, rows (pieces of actual cost), baselines, each job's figures, group sums;
- :mod:`.baselines`: how each baseline is chosen (on-demand reference per team, static spot from the
  quote) and priced over the price history of the job's run;
- :mod:`.data`: what a report reads from the database (:func:`load_report_data`);
- :mod:`.savings`: the report itself (:func:`build_report`), computed from that data;
- :mod:`.apportion`: exact integer splits (days, baselines over rows);
- :mod:`.render`: the JSON document; :mod:`.focus`: FinOps FOCUS exports (CSV, Parquet);
  :mod:`.charts`: PNG charts and the mailable HTML.
"""

from costopt.reports.baselines import (
    BaselineChoice,
    BaselineSource,
    QuoteBaselines,
    Reference,
    ReferenceRules,
    price_baseline,
    static_spot_from_quote,
)
from costopt.reports.data import ReportData, load_report_data
from costopt.reports.model import (
    DIMENSIONS,
    BaselineKind,
    BaselineRun,
    Figures,
    JobFigures,
    NoBaseline,
    ReportError,
    ReportQuery,
    Row,
    SavingsReport,
)
from costopt.reports.render import report_doc
from costopt.reports.savings import build_report

__all__ = [
    "DIMENSIONS",
    "BaselineChoice",
    "BaselineKind",
    "BaselineRun",
    "BaselineSource",
    "Figures",
    "JobFigures",
    "NoBaseline",
    "QuoteBaselines",
    "Reference",
    "ReferenceRules",
    "ReportData",
    "ReportError",
    "ReportQuery",
    "Row",
    "SavingsReport",
    "build_report",
    "load_report_data",
    "price_baseline",
    "report_doc",
    "static_spot_from_quote",
]
