"""The project's typed errors. Each message says what went wrong and what to do."""

from __future__ import annotations


class CostoptError(Exception):
    """Base of every error costopt raises on purpose."""


class BadRecord(CostoptError, ValueError):
    """One record holds an invalid value (missing field, non-numeric, negative/NaN/absurd price,
    unknown timestamp format). Live collectors skip and count it; imports refuse the whole file.

    ``count``: how many bad records the refusal stands for (its message names the first)."""

    def __init__(self, message: str, *, count: int = 1) -> None:
        super().__init__(message)
        self.count = count

    @classmethod
    def first_of(cls, first: str, count: int, what: str = "bad records") -> BadRecord:
        """The refusal of ``count`` bad records, told by the first one's reason (``first``)."""
        more = f" (first of {count} {what})" if count > 1 else ""
        return cls(f"{first}{more}", count=count)


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
