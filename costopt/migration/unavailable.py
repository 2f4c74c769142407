"""The unavailable-offers cache: offers recently preempted or refused at launch, kept out of plans.

An offer whose instance was interrupted (``preempted``) or whose launch failed for lack of capacity
(``capacity``) or quota (``quota``) is marked here; planners and the migrator skip it until its entry
expires. Each reason has its own time to live (defaults :data:`DEFAULT_TTL`: preempted 1 h, capacity
30 min, quota 6 h; a reason without its own TTL gets the ``"other"`` one, 1 h by default).

Entries live in the database (table ``unavailable_offers``, migration ``0005``), so they survive a
restart and are shared by every process on the same database (migrator, rebalancer, interruption
watcher). Times are tz-aware UTC. Contracts:

- :meth:`UnavailableOffers.mark` is idempotent and only ever *extends* an entry: marking an offer that
  is already unavailable keeps its ``since`` and moves ``until`` to the later of the two expiries
  (the reason and detail are those of the mark that expires last); marking an expired entry starts a
  new one.
- An entry is active at ``at`` when ``since <= at < until``.
- :meth:`UnavailableOffers.filter` keeps the order of the offers it is given.

Planners take the cache at their input, not inside: :meth:`UnavailableOffers.drop_from` removes the
unavailable offers' rows from an offer frame (the one ``OfferTable.from_frame`` reads), so any planner
runs unchanged on what is left (``api.planning.offers_at``/``plan_single`` take ``unavailable=``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import pandas as pd
from sqlalchemy import ColumnElement, Engine, and_, bindparam, case, delete, insert, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from costopt.cloud import CapacityError, QuotaError
from costopt.db.unavailable_schema import unavailable_offers as _t
from costopt.db.upserts import per_dialect
from costopt.domain import Cloud, Market, OfferKey

__all__ = [
    "DEFAULT_TTL",
    "REASON_CAPACITY",
    "REASON_OTHER",
    "REASON_PREEMPTED",
    "REASON_QUOTA",
    "UnavailableEntry",
    "UnavailableOffers",
    "reason_for_launch_error",
]

REASON_PREEMPTED = "preempted"
REASON_CAPACITY = "capacity"
REASON_QUOTA = "quota"
REASON_OTHER = "other"
"""The TTL key used for any reason that has no TTL of its own."""

DEFAULT_TTL: Mapping[str, timedelta] = MappingProxyType(
    {
        REASON_PREEMPTED: timedelta(hours=1),
        REASON_CAPACITY: timedelta(minutes=30),
        REASON_QUOTA: timedelta(hours=6),
        REASON_OTHER: timedelta(hours=1),
    }
)

_MAX_REASON = 32  # the column's width
_KEY_COLUMNS = ("cloud", "region", "zone", "instance_type", "market")


def reason_for_launch_error(exc: BaseException) -> str | None:
    """The cache reason for a failed launch (``capacity`` / ``quota``), or None when the error says
    nothing about the offer (auth, not found, a generic cloud error): such offers are not marked."""
    if isinstance(exc, CapacityError):
        return REASON_CAPACITY
    if isinstance(exc, QuotaError):
        return REASON_QUOTA
    return None


@dataclass(frozen=True, slots=True)
class UnavailableEntry:
    """``offer`` is kept out of plans from ``since`` until ``until`` (exclusive) because of ``reason``."""

    offer: OfferKey
    reason: str
    since: datetime
    until: datetime
    detail: str = ""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _key_clause(offer: OfferKey) -> list[ColumnElement[bool]]:
    return [
        _t.c.cloud == offer.cloud.value,
        _t.c.region == offer.region,
        _t.c.zone == offer.zone,
        _t.c.instance_type == offer.instance_type,
        _t.c.market == offer.market.value,
    ]


_BY_KEY = and_(*(getattr(_t.c, k) == bindparam(f"b_{k}") for k in _KEY_COLUMNS))
# The hot statements, built once (SQLAlchemy then reuses their cache keys; values are parameters).
_ENTRY = select(_t).where(_BY_KEY)
_INSERT = insert(_t)
_UPDATE = update(_t).where(_BY_KEY)
"""Executed with the columns to set as parameters besides the key's ``b_*``."""
_ACTIVE = (
    select(_t)
    .where(_t.c.since <= bindparam("b_at"), _t.c.until > bindparam("b_at"))
    .order_by(_t.c.until, _t.c.cloud, _t.c.region, _t.c.zone, _t.c.instance_type, _t.c.market)
)


def _upsert(insert_of: Callable[[Any], Any]) -> Any:
    """A mark in one statement (what :meth:`UnavailableOffers._write_mark` does with a read first): insert the
    entry, or merge it into the stored one by the same rules, in the same statement: an expired entry is
    replaced; a later expiry extends the entry (reason, detail and expiry from the mark, the earlier start
    kept); an earlier start only widens it; anything else leaves the row unwritten. The ``SET`` expressions
    read the stored row (``t``) and the mark (``x``, the row proposed)."""
    stmt = insert_of(_t)
    x = stmt.excluded
    expired = _t.c.until <= x.since
    replace = or_(expired, x.until > _t.c.until)
    return stmt.on_conflict_do_update(
        index_elements=list(_KEY_COLUMNS),
        set_={
            "reason": case((replace, x.reason), else_=_t.c.reason),
            "detail": case((replace, x.detail), else_=_t.c.detail),
            "until": case((replace, x.until), else_=_t.c.until),
            "since": case((expired, x.since), (x.since < _t.c.since, x.since), else_=_t.c.since),
        },
        where=or_(replace, x.since < _t.c.since),
    )


_UPSERT = per_dialect(_upsert)
"""The one-statement mark per dialect (others read the entry first)."""


def _key_params(offer: OfferKey) -> dict[str, str]:
    return {
        "b_cloud": offer.cloud.value,
        "b_region": offer.region,
        "b_zone": offer.zone,
        "b_instance_type": offer.instance_type,
        "b_market": offer.market.value,
    }


def _offer_of(row: Any) -> OfferKey:
    """The offer of a row of ``unavailable_offers``."""
    return OfferKey(Cloud(row.cloud), row.region, row.zone, row.instance_type, Market(row.market))


class UnavailableOffers:
    """The database-backed cache of offers to keep out of plans for a while (see the module doc).

    ``ttl`` overrides :data:`DEFAULT_TTL` per reason (keys not given keep their default); ``clock``
    gives "now" (tz-aware UTC) when a call passes no ``at``.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        ttl: Mapping[str, timedelta] | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        merged = {**DEFAULT_TTL, **(ttl or {})}
        for reason, span in merged.items():
            if span <= timedelta(0):
                raise ValueError(f"the TTL of reason {reason!r} must be positive, got {span}; remove it or fix it")
        self.engine = engine
        self.ttl: Mapping[str, timedelta] = MappingProxyType(merged)
        self.clock: Callable[[], datetime] = clock or _utcnow
        self._marked: dict[OfferKey, tuple[str, datetime, datetime]] = {}
        """Per offer, the last mark this object wrote or found covered: ``(reason, since, until)``."""

    # -- helpers -----------------------------------------------------------------------------------------

    def _at(self, at: datetime | None) -> datetime:
        value = self.clock() if at is None else at
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a tz-aware UTC time")
        return value.astimezone(UTC)

    def ttl_for(self, reason: str) -> timedelta:
        """How long a mark with ``reason`` keeps an offer out (the ``other`` TTL for unknown reasons)."""
        return self.ttl.get(reason, self.ttl[REASON_OTHER])

    # -- writes ------------------------------------------------------------------------------------------

    def mark(self, offer: OfferKey, reason: str, *, at: datetime | None = None, detail: str = "") -> None:
        """Keep ``offer`` out of plans from ``at`` (default now) for ``reason``'s TTL.

        Idempotent; extends an active entry to the later expiry (never shortens it). A repeat of the last
        mark this object made of the offer (same reason and time: a preemption seen by the watcher, then by
        the migrator stopping the copy) is not read or written again while that entry is active by the
        clock: the row holds it, since another mark can only widen it (a new entry replaces one only once
        expired, at a later time than now).
        """
        if not reason or len(reason) > _MAX_REASON:
            raise ValueError(f"reason must be 1..{_MAX_REASON} characters (e.g. 'capacity'), got {reason!r}")
        since = self._at(at)
        until = since + self.ttl_for(reason)
        last = self._marked.get(offer)
        if last is not None and last[:2] == (reason, since) and self._at(None) < last[2]:
            return
        self._write_mark(offer, reason, since, until, detail)
        self._marked[offer] = (reason, since, until)

    def _write_mark(self, offer: OfferKey, reason: str, since: datetime, until: datetime, detail: str) -> None:
        entry = {
            "cloud": offer.cloud.value,
            "region": offer.region,
            "zone": offer.zone,
            "instance_type": offer.instance_type,
            "market": offer.market.value,
            "reason": reason,
            "since": since,
            "until": until,
            "detail": detail,
        }
        upsert = _UPSERT.get(self.engine.dialect.name)
        if upsert is not None:  # one statement: the database merges the mark into a stored entry (or a racer's)
            with self.engine.begin() as conn:
                conn.execute(upsert, entry)
            return
        for _ in range(3):  # an insert race with another process: read again and merge
            try:
                with self.engine.begin() as conn:
                    key = _key_params(offer)
                    row = conn.execute(_ENTRY, key).first()
                    if row is None:
                        conn.execute(_INSERT, entry)
                        return
                    values: dict[str, object]
                    if row.until <= since:  # expired: a new entry
                        values = {"reason": reason, "since": since, "until": until, "detail": detail}
                    elif until > row.until:  # active: extend, keep since
                        values = {"reason": reason, "until": until, "detail": detail, "since": min(row.since, since)}
                    elif since < row.since:  # an earlier mark arriving late: only widen the start
                        values = {"since": since}
                    else:
                        return
                    conn.execute(_UPDATE, {**key, **values})
                    return
            except IntegrityError:
                continue
        raise RuntimeError(f"could not mark {offer} unavailable: the row kept changing under concurrent writers")

    def purge(self, *, at: datetime | None = None) -> int:
        """Delete entries expired at ``at`` (housekeeping; readers ignore them anyway). Returns the count."""
        self._marked.clear()
        with self.engine.begin() as conn:
            return int(conn.execute(delete(_t).where(_t.c.until <= self._at(at))).rowcount)

    # -- reads -------------------------------------------------------------------------------------------

    def is_unavailable(self, offer: OfferKey, *, at: datetime | None = None) -> bool:
        """True when ``offer`` has an entry active at ``at`` (default now)."""
        when = self._at(at)
        with self.engine.connect() as conn:
            row = conn.execute(
                select(_t.c.until).where(and_(*_key_clause(offer)), _t.c.since <= when, _t.c.until > when)
            ).first()
        return row is not None

    def active(self, *, at: datetime | None = None, conn: Connection | None = None) -> list[UnavailableEntry]:
        """Every entry active at ``at`` (default now), soonest expiry first; read on ``conn`` when given
        (a caller's, which reads more on it), else on a connection of its own."""
        when = self._at(at)
        if conn is not None:
            rows = conn.execute(_ACTIVE, {"b_at": when}).all()
        else:
            with self.engine.connect() as own:
                rows = own.execute(_ACTIVE, {"b_at": when}).all()
        return [UnavailableEntry(_offer_of(r), r.reason, r.since, r.until, r.detail or "") for r in rows]

    def unavailable_set(self, *, at: datetime | None = None, conn: Connection | None = None) -> frozenset[OfferKey]:
        """The offers unavailable at ``at`` (one query; for filtering many offer tables; ``conn``: as
        :meth:`active`)."""
        return frozenset(e.offer for e in self.active(at=at, conn=conn))

    def filter(self, offers: Sequence[OfferKey], *, at: datetime | None = None) -> list[OfferKey]:
        """``offers`` without the unavailable ones, in the order given."""
        if not offers:
            return []
        out = self.unavailable_set(at=at)
        return [o for o in offers if o not in out]

    def drop_from(self, frame: pd.DataFrame, *, at: datetime | None = None) -> pd.DataFrame:
        """The rows of an offer frame (columns ``cloud, region, zone, instance_type, market``, as a price
        snapshot or ``OfferTable`` has them) whose offer is not unavailable at ``at``; order and index
        kept. This is the planners' seam: filter the frame, then plan on it."""
        out = self.unavailable_set(at=at)
        if not out or frame.empty:
            return frame
        missing = [c for c in _KEY_COLUMNS if c not in frame.columns]
        if missing:
            raise ValueError(f"the offer frame lacks columns {missing}; pass a price snapshot or offer table frame")
        keys = {(o.cloud.value, o.region, o.zone, o.instance_type, o.market.value) for o in out}
        rows = zip(*(frame[c].astype(str).to_numpy() for c in _KEY_COLUMNS), strict=True)
        keep = [tuple(r) not in keys for r in rows]
        return frame[keep]
