"""Parsers of AWS wire formats, shared by the live collectors and the replay importer.

``describe_spot_price_history`` pages: ``{"SpotPriceHistory": [{AvailabilityZone, InstanceType,
ProductDescription, SpotPrice (string), Timestamp}], "NextToken": str}``, as the AWS CLI prints them
(JSON text, ISO timestamps) or as boto3 returns them (``Timestamp`` a datetime).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from costopt.domain import Cloud, Market, OfferKey, PricePoint, check_price, parse_utc, utc
from costopt.errors import BadRecord, MalformedInput
from pricing.base import ParsedPage, Problems

LINUX_PRODUCTS = frozenset({"Linux/UNIX", "Linux/UNIX (Amazon VPC)"})


def region_of_zone(zone: str) -> str:
    """``us-east-1b`` -> ``us-east-1`` (AWS zone names are the region plus one letter)."""
    if len(zone) < 2 or not zone[-1].isalpha() or not zone[-2].isdigit():
        raise BadRecord(f"not an AWS availability zone: {zone!r}")
    return zone[:-1]


def _timestamp(value: Any) -> datetime:
    if isinstance(value, datetime):
        return utc(value)
    if isinstance(value, str):
        return parse_utc(value)
    raise BadRecord(f"Timestamp is neither text nor a datetime: {value!r}")


def parse_spot_record(rec: Any, *, source: str, observed_at: datetime | None = None) -> PricePoint | None:
    """One ``SpotPriceHistory`` entry -> a spot :class:`PricePoint` (None: not Linux/UNIX).

    Raises :class:`BadRecord` naming the field that is wrong.
    """
    if not isinstance(rec, Mapping):
        raise BadRecord(f"record is not an object: {rec!r:.80}")
    for f in ("AvailabilityZone", "InstanceType", "SpotPrice", "Timestamp"):
        if rec.get(f) in (None, ""):
            raise BadRecord(f"missing field {f}")
    product = rec.get("ProductDescription", "Linux/UNIX")
    if product not in LINUX_PRODUCTS:
        return None
    try:
        price = float(rec["SpotPrice"])
    except (TypeError, ValueError) as exc:
        raise BadRecord(f"SpotPrice is not a number: {rec['SpotPrice']!r}") from exc
    check_price(price)
    zone = str(rec["AvailabilityZone"])
    key = OfferKey(Cloud.AWS, region_of_zone(zone), zone, str(rec["InstanceType"]), Market.SPOT)
    return PricePoint(key, _timestamp(rec["Timestamp"]), price, source, observed_at)


def parse_spot_page(
    page: Any, *, source: str = "aws-spot", observed_at: datetime | None = None, where: str = "page"
) -> ParsedPage:
    """Parse one ``describe_spot_price_history`` page; bad records are counted in ``problems``.

    Raises :class:`MalformedInput` when the page is not of that shape at all.
    """
    if not isinstance(page, Mapping) or not isinstance(page.get("SpotPriceHistory"), list):
        raise MalformedInput(f"{where}: not a describe-spot-price-history page (no SpotPriceHistory list)")
    problems = Problems(source)
    points: list[PricePoint] = []
    for i, rec in enumerate(page["SpotPriceHistory"]):
        try:
            point = parse_spot_record(rec, source=source, observed_at=observed_at)
        except BadRecord as exc:
            problems.bad_record(f"{where} record {i}", str(exc))
            continue
        if point is not None:
            points.append(point)
    token = page.get("NextToken")
    return ParsedPage(points, problems, next_token=str(token) if token else None)
