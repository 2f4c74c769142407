"""Live AWS collectors: spot price history, on-demand list prices and the GPU instance catalog.

Every collector talks to AWS through boto3 with the SDK's default credential chain (profile,
``AWS_*`` environment, instance/container role); no credential is ever passed in or stored here.
Clients come from :mod:`costopt.aws_clients` (botocore's *standard* retry mode, explicit connect/read
timeouts). ``endpoint_url`` (or a ``client_factory``) points them at a local fake in tests.

Prices are USD per instance-hour; every time is tz-aware UTC.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from costopt.aws_clients import ClientFactory, aws_client_config, boto3_client_factory, describe_aws_error
from costopt.domain import Cloud, InstanceType, Market
from costopt.errors import MalformedInput, SourceUnavailable
from costopt.settings import DEFAULT_AWS_REGIONS, Settings
from pricing.aws_pages import (
    ACCELERATOR_BY_FAMILY,
    parse_instance_types_page,
    parse_price_list_page,
    parse_spot_page,
)
from pricing.base import FetchResult, ParsedPage, PriceHistoryView

log = logging.getLogger("costopt.pricing.aws")

_SIZES_G = ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")

AWS_GPU_INSTANCE_TYPES: tuple[str, ...] = (
    "p2.xlarge", "p2.8xlarge", "p2.16xlarge",
    "p3.2xlarge", "p3.8xlarge", "p3.16xlarge",
    "p3dn.24xlarge",
    "p4d.24xlarge",
    "p4de.24xlarge",
    "p5.4xlarge", "p5.48xlarge",
    "p5e.48xlarge",
    "g4dn.xlarge", "g4dn.2xlarge", "g4dn.4xlarge", "g4dn.8xlarge", "g4dn.12xlarge", "g4dn.16xlarge",
    "g4dn.metal",
    *(f"g5.{size}" for size in _SIZES_G),
    *(f"g6.{size}" for size in _SIZES_G),
    *(f"g6e.{size}" for size in _SIZES_G),
    "gr6.4xlarge", "gr6.8xlarge",
)  # fmt: skip
"""Every concrete EC2 GPU instance type costopt collects by default (families of ACCELERATOR_BY_FAMILY)."""

AWS_GPU_FAMILIES: tuple[str, ...] = tuple(ACCELERATOR_BY_FAMILY)
"""The EC2 GPU families costopt knows (``p3``, ``g5``, ...)."""

SPOT_LOOKBACK = timedelta(days=90)
"""How far back a first spot fetch starts (AWS keeps 90 days of spot price history)."""

PRICE_LIST_REGION = "us-east-1"
"""The Price List API answers in us-east-1 (for every region's prices)."""

PRICE_LIST_FILTERS: Mapping[str, str] = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}
"""TERM_MATCH filters selecting the plain Linux, shared-tenancy, on-demand instance-hour products."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


_REGION_ERRORS = (ClientError, BotoCoreError, ResponseParserError, MalformedInput)
"""What makes one region (or one query) fail without stopping the others: AWS errors, connection
problems and timeouts once retries are spent, and answers that cannot be parsed."""


def _per_region(regions: Sequence[str], result: FetchResult, fetch_one: Callable[[str], None]) -> list[str]:
    """Run ``fetch_one`` for each region; a failing region is recorded and the others still run.

    Returns the regions that failed.
    """
    failed: list[str] = []
    for region in regions:
        try:
            fetch_one(region)
        except _REGION_ERRORS as exc:
            message = f"{region}: {describe_aws_error(exc)}"
            result.errors.append(message)
            result.partial = True
            failed.append(region)
            log.warning("%s: region %s failed, other regions continue: %s", result.source, region, message)
    return failed


def _unavailable(result: FetchResult, what: str, check: str) -> SourceUnavailable:
    return SourceUnavailable(f"{result.source}: {what} ({'; '.join(result.errors)}). {check}")


def _filter_page(page: ParsedPage, regions: frozenset[str] | None) -> ParsedPage:
    if regions is None:
        return page
    kept = [p for p in page.points if p.key.region in regions]
    return ParsedPage(kept, page.problems, page.next_token, page.instance_types)


def _unique_instance_types(shapes: Iterable[InstanceType]) -> list[InstanceType]:
    seen: dict[str, InstanceType] = {}
    for shape in shapes:
        seen.setdefault(shape.name, shape)
    return list(seen.values())


class AwsSpotSource:
    """EC2 spot price history of GPU instance types, Linux/UNIX, one zonal point per price change.

    Incremental: each region starts at the newest stored change of its spot offers
    (``history.last_change``), or ``lookback`` before now when nothing is stored. Every point carries
    ``observed_at`` = the fetch time. A region that fails is reported in ``FetchResult.errors`` with
    ``partial=True``; :class:`SourceUnavailable` is raised only when no region returned a page.
    """

    name = "aws-spot"

    def __init__(
        self,
        regions: Sequence[str] = DEFAULT_AWS_REGIONS,
        instance_types: Sequence[str] = AWS_GPU_INSTANCE_TYPES,
        *,
        session: boto3.Session | None = None,
        endpoint_url: str | None = None,
        client_factory: ClientFactory | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 30.0,
        max_attempts: int = 5,
        lookback: timedelta = SPOT_LOOKBACK,
        page_size: int = 1000,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        """``client_factory(region)`` -> EC2 client overrides ``session``/``endpoint_url``/timeouts."""
        if not regions:
            raise ValueError("AwsSpotSource needs at least one region (e.g. COSTOPT_AWS_REGIONS=us-east-1)")
        if not instance_types:
            raise ValueError("AwsSpotSource needs at least one instance type")
        self.regions = tuple(regions)
        self.instance_types = tuple(instance_types)
        self.lookback = lookback
        self.page_size = page_size
        self._clock = clock
        self._client_for = client_factory or boto3_client_factory(
            "ec2",
            session=session,
            endpoint_url=endpoint_url,
            config=aws_client_config(
                connect_timeout=connect_timeout, read_timeout=read_timeout, max_attempts=max_attempts
            ),
        )

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> AwsSpotSource:
        """Built from :class:`Settings` (``aws_regions``, ``aws_endpoint_url``, ``http_timeout_s`` as the
        read timeout); ``overrides`` win."""
        kwargs: dict[str, Any] = {
            "regions": settings.aws_regions,
            "endpoint_url": settings.aws_endpoint_url,
            "read_timeout": settings.http_timeout_s,
        }
        kwargs.update(overrides)
        return cls(**kwargs)

    def start_time(self, history: PriceHistoryView, region: str, now: datetime) -> datetime:
        """Where a region's fetch starts: its newest stored spot change, else ``now - lookback``."""
        last = history.last_change(Cloud.AWS, region=region, market=Market.SPOT, instance_types=self.instance_types)
        if last is None:
            return now - self.lookback
        last = last.replace(tzinfo=UTC) if last.tzinfo is None else last.astimezone(UTC)
        return min(last, now)

    def fetch(self, history: PriceHistoryView) -> FetchResult:
        """Fetch every region's changes since its start time (errors of ``history`` propagate)."""
        now = self._clock()
        result = FetchResult(self.name)

        def one_region(region: str) -> None:
            start = self.start_time(history, region, now)
            client = self._client_for(region)
            pages = client.get_paginator("describe_spot_price_history").paginate(
                InstanceTypes=list(self.instance_types),
                ProductDescriptions=["Linux/UNIX"],
                StartTime=start,
                PaginationConfig={"PageSize": self.page_size},
            )
            before = len(result.points)
            for i, raw in enumerate(pages, start=1):
                page = parse_spot_page(raw, source=self.name, observed_at=now, where=f"{region} page {i}")
                result.add_page(page)
            log.info("%s: %s: %d points since %s", self.name, region, len(result.points) - before, start)

        failed = _per_region(self.regions, result, one_region)
        if len(failed) == len(self.regions) and result.pages == 0:
            raise _unavailable(
                result,
                "every region failed",
                "Check network access to the EC2 endpoints, the AWS credentials (profile, environment or "
                "instance role) and that they allow ec2:DescribeSpotPriceHistory.",
            )
        return result


class AwsOnDemandSource:
    """EC2 on-demand list prices from the Price List API (``pricing.get_products`` in us-east-1).

    One query per instance type (Linux, shared tenancy, no pre-installed software, capacity
    ``Used``), paginated. Points are regional (``zone == ""``), ``valid_from`` is the term's
    effective date and ``observed_at`` the fetch time. ``regions`` None keeps every region the Price
    List returns. GPU shapes found in product attributes come back in ``instance_types``.
    """

    name = "aws-on-demand"

    def __init__(
        self,
        instance_types: Sequence[str] = AWS_GPU_INSTANCE_TYPES,
        *,
        regions: Sequence[str] | None = None,
        session: boto3.Session | None = None,
        endpoint_url: str | None = None,
        client_factory: ClientFactory | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 30.0,
        max_attempts: int = 5,
        page_size: int = 100,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        """``client_factory(region)`` -> pricing client; it is called with :data:`PRICE_LIST_REGION`."""
        if not instance_types:
            raise ValueError("AwsOnDemandSource needs at least one instance type")
        self.instance_types = tuple(instance_types)
        self.regions = frozenset(regions) if regions is not None else None
        self.page_size = page_size
        self._clock = clock
        self._client_for = client_factory or boto3_client_factory(
            "pricing",
            session=session,
            endpoint_url=endpoint_url,
            config=aws_client_config(
                connect_timeout=connect_timeout, read_timeout=read_timeout, max_attempts=max_attempts
            ),
        )

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> AwsOnDemandSource:
        """Built from :class:`Settings` (points kept for ``aws_regions``; ``aws_endpoint_url``;
        ``http_timeout_s`` as the read timeout); ``overrides`` win."""
        kwargs: dict[str, Any] = {
            "regions": settings.aws_regions,
            "endpoint_url": settings.aws_endpoint_url,
            "read_timeout": settings.http_timeout_s,
        }
        kwargs.update(overrides)
        return cls(**kwargs)

    @staticmethod
    def filters(instance_type: str) -> list[dict[str, str]]:
        """The ``GetProducts`` filters selecting one instance type's on-demand Linux products."""
        wanted = {**PRICE_LIST_FILTERS, "instanceType": instance_type}
        return [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in wanted.items()]

    def fetch(self, history: PriceHistoryView) -> FetchResult:
        """Fetch every instance type's list prices (``history`` is not consulted: list prices are
        re-read whole so that their confirmation time is refreshed)."""
        now = self._clock()
        result = FetchResult(self.name)
        check = (
            "Check network access to api.pricing.us-east-1.amazonaws.com, the AWS credentials "
            "(profile, environment or instance role) and that they allow pricing:GetProducts."
        )
        try:
            client = self._client_for(PRICE_LIST_REGION)
        except BotoCoreError as exc:
            raise SourceUnavailable(f"{self.name}: cannot create the pricing client: {exc}. {check}") from exc
        for n, instance_type in enumerate(self.instance_types):
            try:
                pages = client.get_paginator("get_products").paginate(
                    ServiceCode="AmazonEC2",
                    FormatVersion="aws_v1",
                    Filters=self.filters(instance_type),
                    PaginationConfig={"PageSize": self.page_size},
                )
                for i, raw in enumerate(pages, start=1):
                    page = parse_price_list_page(
                        raw, source=self.name, observed_at=now, where=f"{instance_type} page {i}"
                    )
                    result.add_page(_filter_page(page, self.regions))
            except (ClientError, ResponseParserError, MalformedInput) as exc:
                # Specific to this instance type's query: the others may still work.
                result.errors.append(f"{instance_type}: {describe_aws_error(exc)}")
                result.partial = True
                log.warning("%s: %s failed, other types continue: %s", self.name, instance_type, exc)
            except BotoCoreError as exc:
                # Connection, timeout or credentials: every further call would fail the same way.
                result.errors.append(f"{instance_type}: {describe_aws_error(exc)}")
                result.partial = True
                skipped = len(self.instance_types) - n - 1
                log.warning("%s: stopping, %d instance types not fetched: %s", self.name, skipped, exc)
                break
        result.instance_types = _unique_instance_types(result.instance_types)
        if result.errors and result.pages == 0:
            raise _unavailable(result, "no Price List page could be fetched", check)
        return result


class AwsInstanceTypeSource:
    """The GPU instance catalog from ``ec2.describe_instance_types`` (source ``aws-api``).

    Queries each of ``regions`` (types differ by region) and merges by name; ``families`` None asks
    for every type and keeps those with ``GpuInfo``. Produces no price points.
    """

    name = "aws-catalog"

    def __init__(
        self,
        regions: Sequence[str] = ("us-east-1", "us-west-2"),
        families: Sequence[str] | None = AWS_GPU_FAMILIES,
        *,
        session: boto3.Session | None = None,
        endpoint_url: str | None = None,
        client_factory: ClientFactory | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 30.0,
        max_attempts: int = 5,
        page_size: int = 100,
    ) -> None:
        """``client_factory(region)`` -> EC2 client overrides ``session``/``endpoint_url``/timeouts."""
        if not regions:
            raise ValueError("AwsInstanceTypeSource needs at least one region")
        self.regions = tuple(regions)
        self.families = tuple(families) if families is not None else None
        self.page_size = page_size
        self._client_for = client_factory or boto3_client_factory(
            "ec2",
            session=session,
            endpoint_url=endpoint_url,
            config=aws_client_config(
                connect_timeout=connect_timeout, read_timeout=read_timeout, max_attempts=max_attempts
            ),
        )

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> AwsInstanceTypeSource:
        """Built from :class:`Settings` (``aws_endpoint_url``, ``http_timeout_s`` as the read timeout;
        the regions queried stay the default pair); ``overrides`` win."""
        kwargs: dict[str, Any] = {"endpoint_url": settings.aws_endpoint_url, "read_timeout": settings.http_timeout_s}
        kwargs.update(overrides)
        return cls(**kwargs)

    def fetch(self, history: PriceHistoryView) -> FetchResult:
        """The catalog as a :class:`FetchResult` with ``instance_types`` only (``history`` unused)."""
        result = FetchResult(self.name)

        def one_region(region: str) -> None:
            kwargs: dict[str, Any] = {"PaginationConfig": {"PageSize": self.page_size}}
            if self.families is not None:
                kwargs["Filters"] = [{"Name": "instance-type", "Values": [f"{f}.*" for f in self.families]}]
            pages = self._client_for(region).get_paginator("describe_instance_types").paginate(**kwargs)
            for i, raw in enumerate(pages, start=1):
                result.add_page(parse_instance_types_page(raw, where=f"{region} page {i}"))

        failed = _per_region(self.regions, result, one_region)
        if len(failed) == len(self.regions) and result.pages == 0:
            raise _unavailable(
                result,
                "every region failed",
                "Check network access to the EC2 endpoints, the AWS credentials and that they allow "
                "ec2:DescribeInstanceTypes.",
            )
        result.instance_types = _unique_instance_types(result.instance_types)
        return result

    def discover(self) -> list[InstanceType]:
        """The GPU instance types, one per name (raises :class:`SourceUnavailable` like ``fetch``)."""
        return self.fetch(_NoHistory()).instance_types


class _NoHistory:
    """A history view for sources that never consult it."""

    def last_change(
        self,
        cloud: Cloud,
        *,
        region: str | None = None,
        market: Market | None = None,
        instance_types: Sequence[str] | None = None,
    ) -> datetime | None:
        raise AssertionError("this source does not read price history")
