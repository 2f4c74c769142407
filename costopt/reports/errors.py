"""The reports' error (a light module: the settings check the report rules at start-up)."""

from __future__ import annotations

from costopt.errors import CostoptError

__all__ = ["ReportError"]


class ReportError(CostoptError, ValueError):
    """A report cannot be made as asked (the message says what to fix)."""
