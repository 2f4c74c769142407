"""What every price source shares: the source protocol, fetch results, and problem counting.

Three kinds of bad input are kept apart (see docs/architecture.md):
- *skipped*: an empty price meaning "not offered there" -> counted, not an error;
- *bad record*: one record with an invalid value -> live collectors skip and count it with a log
  line naming the source and the reason; imports refuse the whole file;
- *malformed*: a page or file of the wrong structure -> :class:`costopt.errors.MalformedInput`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from costopt.domain import Cloud, InstanceType, Market, PricePoint
from costopt.errors import MalformedInput

log = logging.getLogger("costopt.pricing")

MAX_PROBLEMS_KEPT = 50


@dataclass
class Problems:
    """Counts and first reasons of skipped and bad records seen while reading one source/file."""

    source: str
    skipped: int = 0
    bad: int = 0
    reasons: list[str] = field(default_factory=list)

    def skip(self, where: str, why: str) -> None:
        """An empty price: the offer is not sold there (not an error)."""
        self.skipped += 1
        log.debug("%s: skipped %s: %s", self.source, where, why)

    def bad_record(self, where: str, why: str) -> None:
        """An invalid record: counted and logged, never stored."""
        self.bad += 1
        msg = f"{where}: {why}"
        if len(self.reasons) < MAX_PROBLEMS_KEPT:
            self.reasons.append(msg)
        log.warning("%s: bad record skipped at %s", self.source, msg)


@dataclass
class ParsedPage:
    """The good records of one page plus what was wrong with the others.

    ``next_token`` is the page's continuation token ("" or None when it is the last page).
    """

    points: list[PricePoint]
    problems: Problems
    next_token: str | None = None
    instance_types: list[InstanceType] = field(default_factory=list)


@dataclass
class FetchResult:
    """What one collection run of a source produced.

    ``partial`` is True when the run stopped before the source's last page (an error mid-way, or a
    page with a continuation token that could not be followed); the good points are still stored.
    ``refused_pages`` counts pages refused whole (malformed: not JSON, cut short, wrong structure,
    duplicated keys); nothing of such a page is kept, and its reason is in ``reasons``.
    """

    source: str
    points: list[PricePoint] = field(default_factory=list)
    instance_types: list[InstanceType] = field(default_factory=list)
    skipped: int = 0
    bad_records: int = 0
    reasons: list[str] = field(default_factory=list)
    partial: bool = False
    pages: int = 0
    errors: list[str] = field(default_factory=list)
    refused_pages: int = 0

    def refuse_page(self, where: str, why: str) -> None:
        """A page refused whole: counted, its reason kept first among the reasons, logged with the source."""
        self.refused_pages += 1
        self.reasons.insert(0, f"{where}: page refused: {why}")
        del self.reasons[MAX_PROBLEMS_KEPT:]
        log.warning("%s: page refused at %s: %s", self.source, where, why)

    def stop_early(self, why: str) -> None:
        """The run stops before the source's last page: partial, ``why`` kept in ``errors`` and logged."""
        self.partial = True
        self.errors.append(why)
        log.warning("%s: fetch stopped after %d pages, keeping what was read: %s", self.source, self.pages, why)

    def add_page(self, page: ParsedPage) -> None:
        self.points.extend(page.points)
        self.instance_types.extend(page.instance_types)
        self.skipped += page.problems.skipped
        self.bad_records += page.problems.bad
        room = MAX_PROBLEMS_KEPT - len(self.reasons)
        if room > 0:
            self.reasons.extend(page.problems.reasons[:room])
        self.pages += 1


@dataclass
class PageWalk:
    """The guard of a walk over a source's pages: it stops at ``max_pages`` pages read, or at a
    continuation (``link``: the source's name for it) met before, a loop. ``seen``: continuations
    already followed (the first page's own, when it has one)."""

    max_pages: int
    link: str
    seen: set[str] = field(default_factory=set)

    def why_stop(self, pages: int, following: str) -> str | None:
        """Why the page ``following`` must not be fetched after ``pages`` pages (None: fetch it; it is
        then remembered as seen)."""
        if pages >= self.max_pages:
            return f"stopped at max_pages={self.max_pages}; {self.link} not followed"
        if following in self.seen:
            return f"page {pages}: {self.link} repeats an earlier page (a loop): {following:.80}"
        self.seen.add(following)
        return None


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out and out[key] != value:
            raise MalformedInput(f"duplicated key {key!r} with different values ({out[key]!r:.40} and {value!r:.40})")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise MalformedInput(f"{name} is not JSON (a number must be finite)")


def strict_json(text: str | bytes) -> Any:
    """Parse a price page's JSON strictly: a key given twice with different values, or the non-standard
    ``NaN``/``Infinity`` literals, raise :class:`MalformedInput` (``json`` would silently keep the last
    value); invalid or cut-short JSON raises :class:`json.JSONDecodeError` (a ``ValueError``)."""
    return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)


class PriceHistoryView(Protocol):
    """What a collector may ask the store, to fetch incrementally."""

    def last_change(
        self,
        cloud: Cloud,
        *,
        region: str | None = None,
        market: Market | None = None,
        instance_types: Sequence[str] | None = None,
    ) -> datetime | None:
        """The newest ``valid_from`` stored for the matching offers (None: nothing stored)."""
        ...


class PriceSource(Protocol):
    """A collector. ``fetch`` never raises for bad records or a partial fetch (they are in the
    result); it raises :class:`costopt.errors.SourceUnavailable` when nothing could be fetched."""

    name: str

    def fetch(self, history: PriceHistoryView) -> FetchResult: ...
