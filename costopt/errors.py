"""The project's typed errors. Each message says what went wrong and what to do."""

from __future__ import annotations


class CostoptError(Exception):
    """Base of every error costopt raises on purpose."""


class BadRecord(CostoptError, ValueError):
    """One record holds an invalid value (missing field, non-numeric, negative/NaN/absurd price,
    unknown timestamp format). Live collectors skip and count it; imports refuse the whole file."""


class MalformedInput(CostoptError, ValueError):
    """A file or page whose structure is wrong (not JSON/CSV, truncated, wrong shape)."""


class NotPriceData(MalformedInput):
    """A file that is not price data at all (a README, a throughput file)."""


class StoreError(CostoptError):
    """The store cannot serve the request (unreachable, not migrated)."""


class SourceUnavailable(CostoptError):
    """A price source could not be reached or kept failing after retries.

    ``refused_pages``: pages the source refused whole before giving up (a malformed first page: 1)."""

    def __init__(self, message: str, *, refused_pages: int = 0) -> None:
        super().__init__(message)
        self.refused_pages = refused_pages
