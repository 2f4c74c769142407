"""Parsers of AWS wire formats, shared by the live collectors and the replay importer.

``describe_spot_price_history`` pages: ``{"SpotPriceHistory": [{AvailabilityZone, InstanceType,
ProductDescription, SpotPrice (string), Timestamp}], "NextToken": str}``, as the AWS CLI prints them
(JSON text, ISO timestamps) or as boto3 returns them (``Timestamp`` a datetime).

Price List ``GetProducts`` pages: ``{"FormatVersion": "aws_v1", "PriceList": [str], "NextToken": str}``
where each ``PriceList`` item is a JSON *string* holding ``product.attributes`` (instanceType,
regionCode, location, gpu, vcpu, memory, ...) and ``terms.OnDemand.<term>.priceDimensions.<rate>
.pricePerUnit.USD`` (a decimal string, USD per unit; unit ``Hrs`` for instances).

``describe_instance_types`` pages: ``{"InstanceTypes": [{InstanceType, VCpuInfo.DefaultVCpus,
MemoryInfo.SizeInMiB, GpuInfo.Gpus[{Name, Count, MemoryInfo.SizeInMiB}]}], "NextToken": str}``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from costopt.domain import (
    Cloud,
    InstanceType,
    Market,
    OfferKey,
    PricePoint,
    check_price,
    normalize_accelerator,
    parse_utc,
    utc,
)
from costopt.errors import BadRecord, MalformedInput
from pricing.base import ParsedPage, Problems

log = logging.getLogger("costopt.pricing.aws")

LINUX_PRODUCTS = frozenset({"Linux/UNIX", "Linux/UNIX (Amazon VPC)"})

ACCELERATOR_BY_FAMILY: Mapping[str, str] = {
    "p2": "k80", "p3": "v100", "p3dn": "v100", "p4d": "a100", "p4de": "a100-80gb",
    "p5": "h100", "p5e": "h200", "g4dn": "t4", "g5": "a10g", "g6": "l4", "g6e": "l40s", "gr6": "l4",
}  # fmt: skip
"""GPU model of each EC2 GPU family costopt knows (canonical names of :mod:`costopt.domain`)."""

LOCATION_TO_REGION: Mapping[str, str] = {
    "US East (N. Virginia)": "us-east-1", "US East (Ohio)": "us-east-2",
    "US West (N. California)": "us-west-1", "US West (Oregon)": "us-west-2",
    "Canada (Central)": "ca-central-1", "Canada West (Calgary)": "ca-west-1",
    "South America (Sao Paulo)": "sa-east-1",
    "EU (Frankfurt)": "eu-central-1", "EU (Zurich)": "eu-central-2", "EU (Ireland)": "eu-west-1",
    "EU (London)": "eu-west-2", "EU (Paris)": "eu-west-3", "EU (Stockholm)": "eu-north-1",
    "EU (Milan)": "eu-south-1", "EU (Spain)": "eu-south-2",
    "Asia Pacific (Tokyo)": "ap-northeast-1", "Asia Pacific (Seoul)": "ap-northeast-2",
    "Asia Pacific (Osaka)": "ap-northeast-3", "Asia Pacific (Singapore)": "ap-southeast-1",
    "Asia Pacific (Sydney)": "ap-southeast-2", "Asia Pacific (Jakarta)": "ap-southeast-3",
    "Asia Pacific (Mumbai)": "ap-south-1", "Asia Pacific (Hyderabad)": "ap-south-2",
    "Asia Pacific (Hong Kong)": "ap-east-1", "Middle East (Bahrain)": "me-south-1",
    "Middle East (UAE)": "me-central-1", "Africa (Cape Town)": "af-south-1",
    "Israel (Tel Aviv)": "il-central-1",
    "AWS GovCloud (US-West)": "us-gov-west-1", "AWS GovCloud (US-East)": "us-gov-east-1",
}  # fmt: skip
"""Price List ``location`` names -> region codes, for products without a ``regionCode`` attribute."""

A100_80GB_MIN_MIB = 76_000
"""An A100 with at least this much memory per GPU is the 80 GB model (the API names both "A100")."""

_HOURLY_UNITS = frozenset({"hrs", "hr", "hours", "hour"})
_NOT_APPLICABLE = frozenset({"", "na", "n/a", "none"})


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


def family_of(instance_type: str) -> str:
    """``p3.2xlarge`` -> ``p3`` (the part before the first dot)."""
    return instance_type.split(".", 1)[0]


def _attr(attrs: Mapping[str, Any], name: str) -> str | None:
    """An attribute's text, or None when absent or "NA"."""
    value = attrs.get(name)
    if value is None:
        return None
    text = str(value).strip()
    return None if text.lower() in _NOT_APPLICABLE else text


def _number(text: str | None) -> float | None:
    """``"61 GiB"`` -> 61.0, ``"1,152 GiB"`` -> 1152.0, ``"8"`` -> 8.0; None when not a number."""
    if text is None:
        return None
    m = re.match(r"^\s*([0-9][0-9,]*(?:\.[0-9]+)?)", text)
    return float(m.group(1).replace(",", "")) if m else None


def _region_of_product(attrs: Mapping[str, Any]) -> str:
    code = _attr(attrs, "regionCode")
    if code:
        return code
    location = _attr(attrs, "location")
    if location is None:
        raise BadRecord("product has neither regionCode nor location")
    if location not in LOCATION_TO_REGION:
        raise BadRecord(f"unknown location {location!r} (add it to LOCATION_TO_REGION)")
    return LOCATION_TO_REGION[location]


def _instance_type_of_product(attrs: Mapping[str, Any], name: str, source: str) -> InstanceType | None:
    """The GPU shape described by a product's attributes (None: not a GPU type, or GPU model unknown)."""
    gpus = _number(_attr(attrs, "gpu"))
    if not gpus:
        return None
    model = _attr(attrs, "physicalGpu")  # carried by some Price List products; EC2 usually has only the count
    accelerator = normalize_accelerator(model) if model else ACCELERATOR_BY_FAMILY.get(family_of(name))
    if accelerator is None:
        log.debug("%s: GPU model of %s unknown (family not in ACCELERATOR_BY_FAMILY)", source, name)
        return None
    vcpus = _number(_attr(attrs, "vcpu"))
    return InstanceType(
        cloud=Cloud.AWS,
        name=name,
        accelerator=accelerator,
        gpu_count=gpus,
        vcpus=int(vcpus) if vcpus is not None else None,
        memory_gib=_number(_attr(attrs, "memory")),
        source=source,
    )


def _hourly_usd(term: Mapping[str, Any]) -> float:
    """The USD/hour price of one OnDemand term (its hourly price dimensions must agree)."""
    dims = term.get("priceDimensions")
    if not isinstance(dims, Mapping) or not dims:
        raise BadRecord("on-demand term has no priceDimensions")
    prices: set[float] = set()
    for dim in dims.values():
        if not isinstance(dim, Mapping) or str(dim.get("unit", "")).strip().lower() not in _HOURLY_UNITS:
            continue
        per_unit = dim.get("pricePerUnit")
        raw = per_unit.get("USD") if isinstance(per_unit, Mapping) else None
        if raw in (None, ""):
            raise BadRecord("price dimension has no pricePerUnit.USD")
        try:
            price = float(raw)
        except (TypeError, ValueError) as exc:
            raise BadRecord(f"pricePerUnit.USD is not a number: {raw!r}") from exc
        if price != 0.0:  # $0.00: not offered there, skipped by the caller
            check_price(price)
        prices.add(price)
    if not prices:
        raise BadRecord("on-demand term has no hourly (unit Hrs) price dimension")
    if len(prices) > 1:
        raise BadRecord(f"on-demand term has several hourly prices {sorted(prices)}")
    return prices.pop()


def parse_price_list_page(
    page: Any,
    *,
    source: str = "aws-on-demand",
    observed_at: datetime | None = None,
    where: str = "page",
) -> ParsedPage:
    """Parse one Price List ``GetProducts`` page into regional on-demand points (``zone == ""``).

    Each point holds from its term's ``effectiveDate`` (converted to UTC) at the hourly USD price.
    A $0.00 price means "not offered" and is skipped; so are products of another location type (Local
    Zones, Wavelength, Outposts) or of a ``marketoption`` other than ``OnDemand``, and products with
    no on-demand term. Invalid records are counted in ``problems``. GPU shapes
    found in product attributes come back in ``instance_types`` (one per name).
    Raises :class:`MalformedInput` when the page is not a ``GetProducts`` page at all.
    """
    if not isinstance(page, Mapping) or not isinstance(page.get("PriceList"), list):
        raise MalformedInput(f"{where}: not a Price List GetProducts page (no PriceList list)")
    problems = Problems(source)
    points: list[PricePoint] = []
    shapes: dict[str, InstanceType] = {}
    for i, item in enumerate(page["PriceList"]):
        at = f"{where} product {i}"
        try:
            rec = json.loads(item) if isinstance(item, str | bytes) else item
        except ValueError as exc:
            problems.bad_record(at, f"PriceList item is not JSON: {exc}")
            continue
        try:
            if not isinstance(rec, Mapping) or not isinstance(rec.get("product"), Mapping):
                raise BadRecord("PriceList item has no product object")
            attrs = rec["product"].get("attributes")
            if not isinstance(attrs, Mapping):
                raise BadRecord("product has no attributes")
            name = _attr(attrs, "instanceType")
            if name is None:
                raise BadRecord("product has no instanceType attribute")
            at = f"{where} product {i} ({name})"
            location_type = _attr(attrs, "locationType")
            if location_type is not None and location_type != "AWS Region":
                problems.skip(at, f"location type {location_type!r} is not a region")
                continue
            market_option = _attr(attrs, "marketoption")
            if market_option is not None and market_option != "OnDemand":
                problems.skip(at, f"market option {market_option!r} is not on-demand (e.g. a capacity block)")
                continue
            region = _region_of_product(attrs)
            terms = rec.get("terms")
            on_demand = terms.get("OnDemand") if isinstance(terms, Mapping) else None
            if not isinstance(on_demand, Mapping) or not on_demand:
                problems.skip(at, "no on-demand term")
                continue
            key = OfferKey(Cloud.AWS, region, "", name, Market.ON_DEMAND)
            found: list[PricePoint] = []
            for term in on_demand.values():
                if not isinstance(term, Mapping):
                    raise BadRecord("on-demand term is not an object")
                if term.get("effectiveDate") in (None, ""):
                    raise BadRecord("on-demand term has no effectiveDate")
                valid_from = parse_utc(str(term["effectiveDate"]))
                price = _hourly_usd(term)
                if price == 0.0:
                    problems.skip(at, f"$0.00 in {region}: not offered")
                    continue
                found.append(PricePoint(key, valid_from, price, source, observed_at))
        except BadRecord as exc:
            problems.bad_record(at, str(exc))
            continue
        points.extend(found)
        if name not in shapes:
            shape = _instance_type_of_product(attrs, name, source)
            if shape is not None:
                shapes[name] = shape
    token = page.get("NextToken")
    return ParsedPage(points, problems, next_token=str(token) if token else None, instance_types=list(shapes.values()))


def _accelerator_of_gpu(gpu: Mapping[str, Any]) -> str:
    name = normalize_accelerator(str(gpu["Name"]))
    memory = gpu.get("MemoryInfo")
    mib = memory.get("SizeInMiB") if isinstance(memory, Mapping) else None
    if name == "a100" and isinstance(mib, int | float) and mib >= A100_80GB_MIN_MIB:
        return "a100-80gb"
    return name


def parse_instance_type_record(rec: Any, *, source: str = "aws-api") -> InstanceType | None:
    """One ``describe_instance_types`` entry -> an :class:`InstanceType` (None: it has no GPU).

    ``accelerator`` is the first GPU group's model (A100 with 80 GB per GPU -> ``a100-80gb``),
    ``gpu_count`` the sum of the groups' counts, ``memory_gib`` the MiB size / 1024.
    Raises :class:`BadRecord` naming the field that is wrong.
    """
    if not isinstance(rec, Mapping):
        raise BadRecord(f"record is not an object: {rec!r:.80}")
    name = rec.get("InstanceType")
    if not name:
        raise BadRecord("missing field InstanceType")
    gpu_info = rec.get("GpuInfo")
    if gpu_info is None:
        return None
    gpus = gpu_info.get("Gpus") if isinstance(gpu_info, Mapping) else None
    if not isinstance(gpus, list) or not gpus:
        raise BadRecord("GpuInfo has no Gpus")
    try:
        count = float(sum(float(g["Count"]) for g in gpus))
        accelerator = _accelerator_of_gpu(gpus[0])
    except (KeyError, TypeError, ValueError) as exc:
        raise BadRecord(f"GpuInfo.Gpus entry lacks a numeric Count or a Name: {exc!r}") from exc
    if count <= 0:
        raise BadRecord(f"GPU count is {count}")
    vcpu_info = rec.get("VCpuInfo")
    vcpus = vcpu_info.get("DefaultVCpus") if isinstance(vcpu_info, Mapping) else None
    mem_info = rec.get("MemoryInfo")
    mib = mem_info.get("SizeInMiB") if isinstance(mem_info, Mapping) else None
    return InstanceType(
        cloud=Cloud.AWS,
        name=str(name),
        accelerator=accelerator,
        gpu_count=count,
        vcpus=int(vcpus) if isinstance(vcpus, int | float) else None,
        memory_gib=float(mib) / 1024 if isinstance(mib, int | float) else None,
        source=source,
    )


def parse_instance_types_page(page: Any, *, source: str = "aws-api", where: str = "page") -> ParsedPage:
    """Parse one ``describe_instance_types`` page; types without a GPU are counted as skipped.

    Raises :class:`MalformedInput` when the page is not of that shape at all.
    """
    if not isinstance(page, Mapping) or not isinstance(page.get("InstanceTypes"), list):
        raise MalformedInput(f"{where}: not a describe-instance-types page (no InstanceTypes list)")
    problems = Problems(source)
    shapes: list[InstanceType] = []
    for i, rec in enumerate(page["InstanceTypes"]):
        at = f"{where} record {i}"
        try:
            shape = parse_instance_type_record(rec, source=source)
        except BadRecord as exc:
            problems.bad_record(at, str(exc))
            continue
        if shape is None:
            problems.skip(at, "no GPU")
        else:
            shapes.append(shape)
    token = page.get("NextToken")
    return ParsedPage([], problems, next_token=str(token) if token else None, instance_types=shapes)
