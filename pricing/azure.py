"""Azure collectors: retail VM prices (public, no credentials) and the resource-SKU instance catalog.

Retail prices come from the public *Azure Retail Prices REST API*
(``GET https://prices.azure.com/api/retail/prices?api-version=2023-01-01-preview&$filter=...``).
A page is ``{"BillingCurrency", "CustomerEntityId", "CustomerEntityType", "Items": [...],
"NextPageLink": str | null, "Count": int}``; each item carries ``currencyCode``, ``retailPrice``
(USD per ``unitOfMeasure``), ``armRegionName``, ``armSkuName`` (``Standard_NC6s_v3``), ``skuName``
(``NC6s v3``, ``NC6s v3 Spot`` or ``NC6s v3 Low Priority``), ``productName`` (ending in ``Windows``
for Windows meters), ``effectiveStartDate`` (ISO 8601), ``type`` and ``isPrimaryMeterRegion``.

Prices are regional (``zone == ""``): Azure spot prices do not differ by zone.

The instance catalog comes from the Resource SKUs API through ``azure-mgmt-compute`` and needs a
subscription and credentials (``DefaultAzureCredential``: environment, managed identity, ``az login``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import quote, urlencode

import httpx

from costopt.domain import Cloud, InstanceType, Market, OfferKey, PricePoint, check_price, parse_utc
from costopt.errors import BadRecord, MalformedInput, SourceUnavailable
from pricing.base import (
    FetchResult,
    PageWalk,
    ParsedPage,
    PriceHistoryView,
    Problems,
    strict_json,
)

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.mgmt.compute import ComputeManagementClient

    from costopt.settings import Settings

log = logging.getLogger("costopt.pricing.azure")

SOURCE = "azure"
DEFAULT_RETAIL_PRICES_URL = "https://prices.azure.com/api/retail/prices"
RETAIL_API_VERSION = "2023-01-01-preview"


class AzureSize(NamedTuple):
    """One Azure GPU VM size. ``gpu_count`` is fractional for GPU-partitioned sizes (NVadsA10 v5)."""

    accelerator: str
    gpu_count: float
    vcpus: int
    memory_gib: float


# Azure GPU VM sizes with NVIDIA compute GPUs. Source: the Azure VM size documentation, "GPU
# accelerated" family pages (learn.microsoft.com/azure/virtual-machines/sizes/overview: NC, NCv2,
# NCv3, NCasT4_v3, NC A100 v4, NCads H100 v5, NDv2, ND A100 v4, NDm A100 v4, ND H100 v5, ND H200 v5,
# NVadsA10 v5). The NC "GPU" of the K80 sizes is half a K80 board, as Azure counts it. Sizes with AMD
# GPUs (NVv4, ND MI300X v5) or visualization/inference-only GPUs (NV M60, ND P40) are left out on
# purpose: the retail collector counts them as unknown sizes.
AZURE_GPU_SIZES: Mapping[str, AzureSize] = {
    # NC (Tesla K80; retired 2023-09, kept for the 2020 price history)
    "Standard_NC6": AzureSize("k80", 1, 6, 56),
    "Standard_NC12": AzureSize("k80", 2, 12, 112),
    "Standard_NC24": AzureSize("k80", 4, 24, 224),
    "Standard_NC24r": AzureSize("k80", 4, 24, 224),
    # NCv2 (Tesla P100; retired 2023-09)
    "Standard_NC6s_v2": AzureSize("p100", 1, 6, 112),
    "Standard_NC12s_v2": AzureSize("p100", 2, 12, 224),
    "Standard_NC24s_v2": AzureSize("p100", 4, 24, 448),
    "Standard_NC24rs_v2": AzureSize("p100", 4, 24, 448),
    # NCv3 (Tesla V100 16 GB)
    "Standard_NC6s_v3": AzureSize("v100", 1, 6, 112),
    "Standard_NC12s_v3": AzureSize("v100", 2, 12, 224),
    "Standard_NC24s_v3": AzureSize("v100", 4, 24, 448),
    "Standard_NC24rs_v3": AzureSize("v100", 4, 24, 448),
    # NCasT4_v3 (Tesla T4)
    "Standard_NC4as_T4_v3": AzureSize("t4", 1, 4, 28),
    "Standard_NC8as_T4_v3": AzureSize("t4", 1, 8, 56),
    "Standard_NC16as_T4_v3": AzureSize("t4", 1, 16, 110),
    "Standard_NC64as_T4_v3": AzureSize("t4", 4, 64, 440),
    # NC A100 v4 (A100 80 GB PCIe)
    "Standard_NC24ads_A100_v4": AzureSize("a100-80gb", 1, 24, 220),
    "Standard_NC48ads_A100_v4": AzureSize("a100-80gb", 2, 48, 440),
    "Standard_NC96ads_A100_v4": AzureSize("a100-80gb", 4, 96, 880),
    # NCads H100 v5 (H100 NVL)
    "Standard_NC40ads_H100_v5": AzureSize("h100", 1, 40, 320),
    "Standard_NC80adis_H100_v5": AzureSize("h100", 2, 80, 640),
    # NDv2 (Tesla V100 32 GB, NVLink)
    "Standard_ND40rs_v2": AzureSize("v100", 8, 40, 672),
    # ND A100 v4 (A100 40 GB SXM) and NDm A100 v4 (A100 80 GB SXM)
    "Standard_ND96asr_v4": AzureSize("a100", 8, 96, 900),
    "Standard_ND96amsr_A100_v4": AzureSize("a100-80gb", 8, 96, 1900),
    # ND H100 v5 and ND H200 v5
    "Standard_ND96isr_H100_v5": AzureSize("h100", 8, 96, 1900),
    "Standard_ND96isr_H200_v5": AzureSize("h200", 8, 96, 1850),
    # NVadsA10 v5 (A10, GPU-partitioned: 1/6, 1/3, 1/2 of a GPU)
    "Standard_NV6ads_A10_v5": AzureSize("a10", 1 / 6, 6, 55),
    "Standard_NV12ads_A10_v5": AzureSize("a10", 1 / 3, 12, 110),
    "Standard_NV18ads_A10_v5": AzureSize("a10", 1 / 2, 18, 220),
    "Standard_NV36ads_A10_v5": AzureSize("a10", 1, 36, 440),
    "Standard_NV36adms_A10_v5": AzureSize("a10", 1, 36, 880),
    "Standard_NV72ads_A10_v5": AzureSize("a10", 2, 72, 880),
}
_SIZES_BY_LOWER: Mapping[str, str] = {name.lower(): name for name in AZURE_GPU_SIZES}

# armSkuName fragments of the families above, OR-ed into the retail-price filter.
GPU_FAMILY_FILTERS: tuple[str, ...] = ("Standard_NC", "Standard_ND", "ads_A10_v5")


def lookup_size(arm_sku_name: str) -> tuple[str, AzureSize] | None:
    """The canonical name and shape of an Azure GPU size (case-insensitive); None when unknown."""
    name = _SIZES_BY_LOWER.get(arm_sku_name.strip().lower())
    return None if name is None else (name, AZURE_GPU_SIZES[name])


def instance_type_of(arm_sku_name: str, *, source: str = SOURCE) -> InstanceType | None:
    """The :class:`InstanceType` of a size in :data:`AZURE_GPU_SIZES` (None: not in the table)."""
    found = lookup_size(arm_sku_name)
    if found is None:
        return None
    name, size = found
    return InstanceType(Cloud.AZURE, name, size.accelerator, size.gpu_count, size.vcpus, size.memory_gib, source)


# --------------------------------------------------------------------------------------------------
# Retail price pages
# --------------------------------------------------------------------------------------------------

_REQUIRED_FIELDS = (
    "armRegionName",
    "armSkuName",
    "skuName",
    "productName",
    "currencyCode",
    "unitOfMeasure",
    "retailPrice",
    "effectiveStartDate",
)


def _text(item: Mapping[str, Any], name: str) -> str:
    value = item.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise BadRecord(f"missing field {name}")
    if not isinstance(value, str):
        raise BadRecord(f"field {name} is not text: {value!r:.60}")
    return value.strip()


def _retail_price(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRecord(f"retailPrice is not a number: {value!r:.60}")
    price = float(value)
    check_price(price)
    return price


def parse_retail_item(item: Any, *, source: str = SOURCE, observed_at: datetime | None = None) -> PricePoint | str:
    """One retail-price item -> a Linux :class:`PricePoint`, or the reason it is skipped (a ``str``).

    Skipped (not an error): Windows meters, Low Priority (deprecated batch offering), non-primary
    meter regions, non-``Consumption`` price types, a ``retailPrice`` of 0 (not offered), and sizes
    not in :data:`AZURE_GPU_SIZES` (reason starts with ``"unknown instance type"``).
    Raises :class:`BadRecord` for a missing field, a non-USD currency, a unit other than ``1 Hour``,
    a non-numeric/negative/NaN/absurd price or an unreadable ``effectiveStartDate``.
    """
    if not isinstance(item, Mapping):
        raise BadRecord(f"item is not an object: {item!r:.80}")
    for name in _REQUIRED_FIELDS:
        if item.get(name) is None or item.get(name) == "":
            raise BadRecord(f"missing field {name}")
    region = _text(item, "armRegionName")
    sku = _text(item, "armSkuName")
    sku_name = _text(item, "skuName")
    product = _text(item, "productName")
    if product.endswith("Windows"):
        return f"Windows meter ({product})"
    if sku_name.endswith("Low Priority"):
        return f"Low Priority meter ({sku_name}): deprecated batch offering"
    price_type = item.get("type")
    if price_type is not None and price_type != "Consumption":
        return f"price type {price_type!r} is not Consumption"
    if item.get("isPrimaryMeterRegion") is False:
        return "not the primary meter region"
    currency = _text(item, "currencyCode")
    if currency != "USD":
        raise BadRecord(f"currencyCode {currency!r} is not USD (query without a currencyCode parameter)")
    unit = _text(item, "unitOfMeasure")
    if unit != "1 Hour":
        raise BadRecord(f"unitOfMeasure {unit!r} is not '1 Hour': the price is not per instance-hour")
    raw_price = item["retailPrice"]
    if raw_price == 0 and not isinstance(raw_price, bool):
        return "retailPrice 0 (not offered)"
    price = _retail_price(raw_price)
    valid_from = parse_utc(_text(item, "effectiveStartDate"))
    found = lookup_size(sku)
    if found is None:
        return f"unknown instance type {sku} (not in the Azure GPU size table)"
    market = Market.SPOT if sku_name.endswith(" Spot") else Market.ON_DEMAND
    key = OfferKey(Cloud.AZURE, region.lower(), "", found[0], market)
    return PricePoint(key, valid_from, price, source, observed_at)


def parse_retail_page(
    page: object, *, source: str = SOURCE, observed_at: datetime | None = None, where: str = "page"
) -> ParsedPage:
    """Parse one Retail Prices API page (live or recorded); bad items are counted in ``problems``.

    ``next_token`` is the page's ``NextPageLink`` (None when null or empty: the last page).
    ``instance_types`` holds one record per known GPU size priced on the page.
    Raises :class:`MalformedInput` when the page is not of that shape (no ``Items`` list).
    """
    if not isinstance(page, Mapping) or not isinstance(page.get("Items"), list):
        raise MalformedInput(f"{where}: not an Azure Retail Prices page (no Items list)")
    billing = page.get("BillingCurrency")
    if billing is not None and billing != "USD":
        log.warning("%s: %s: BillingCurrency is %r, not USD; non-USD items are bad records", source, where, billing)
    problems = Problems(source)
    points: list[PricePoint] = []
    types: dict[str, InstanceType] = {}
    unknown: set[str] = set()
    for i, item in enumerate(page["Items"]):
        at = f"{where} item {i}"
        try:
            result = parse_retail_item(item, source=source, observed_at=observed_at)
        except BadRecord as exc:
            problems.bad_record(at, str(exc))
            continue
        if isinstance(result, str):
            problems.skip(at, result)
            if result.startswith("unknown instance type") and isinstance(item, Mapping):
                unknown.add(str(item.get("armSkuName")))
            continue
        points.append(result)
        name = result.key.instance_type
        if name not in types:
            itype = instance_type_of(name, source=source)
            if itype is not None:
                types[name] = itype
    if unknown:
        log.info(
            "%s: %s: skipped sizes not in the Azure GPU size table: %s (add them to AZURE_GPU_SIZES "
            "if they carry NVIDIA compute GPUs)",
            source,
            where,
            ", ".join(sorted(unknown)),
        )
    link = page.get("NextPageLink")
    if link is not None and not isinstance(link, str):
        raise MalformedInput(f"{where}: NextPageLink is not text: {link!r:.80}")
    return ParsedPage(points, problems, next_token=link or None, instance_types=list(types.values()))


# --------------------------------------------------------------------------------------------------
# Retail price collector
# --------------------------------------------------------------------------------------------------


def _utcnow() -> datetime:
    return datetime.now(UTC)


def retail_filter(families: Sequence[str] = GPU_FAMILY_FILTERS, regions: Sequence[str] | None = None) -> str:
    """The OData ``$filter`` for Linux/Windows consumption prices of the GPU families (and regions)."""
    parts = ["serviceName eq 'Virtual Machines'", "priceType eq 'Consumption'"]
    if families:
        parts.append("(" + " or ".join(f"contains(armSkuName, '{f}')" for f in families) + ")")
    if regions:
        parts.append("(" + " or ".join(f"armRegionName eq '{r}'" for r in regions) + ")")
    return " and ".join(parts)


def _retry_after_s(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date); None if absent/bad."""
    if not value:
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


class _PageFailed(Exception):
    """A page could not be fetched after the allowed attempts (message says why)."""


class AzureRetailPriceSource:
    """Collector of Azure GPU VM prices (spot and pay-as-you-go, Linux) from the Retail Prices API.

    The API gives current list prices only, so every run reads everything again (``history`` is not
    used); ``valid_from`` is each meter's ``effectiveStartDate`` and ``observed_at`` the time its page
    was received (UTC). Retries HTTP 429/5xx, timeouts and connection errors up to ``max_attempts``
    per page, sleeping ``Retry-After`` when given, else ``backoff_s * 2**n``, at most ``max_backoff_s``.
    """

    name = SOURCE

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_RETAIL_PRICES_URL,
        regions: Sequence[str] | None = None,
        families: Sequence[str] = GPU_FAMILY_FILTERS,
        timeout_s: float = 30.0,
        max_attempts: int = 4,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        max_pages: int = 1000,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], datetime] = _utcnow,
        client: httpx.Client | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.base_url = base_url
        self.regions = list(regions) if regions else None
        self.families = tuple(families)
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_pages = max_pages
        self._sleep = sleep
        self._clock = clock
        self._client = client

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> AzureRetailPriceSource:
        """Build from :class:`costopt.settings.Settings` (URL, regions, HTTP timeout)."""
        return cls(
            base_url=settings.azure_retail_prices_url,
            regions=settings.azure_regions,
            timeout_s=settings.http_timeout_s,
            **kwargs,
        )

    def first_page_url(self) -> httpx.URL:
        """URL of the first request, spelled as in the API docs (``$filter=serviceName%20eq%20'...'``).

        Later pages follow ``NextPageLink`` as given.
        """
        params = {
            "api-version": RETAIL_API_VERSION,
            "meterRegion": "'primary'",
            "$filter": retail_filter(self.families, self.regions),
        }
        return httpx.URL(self.base_url).copy_with(query=urlencode(params, quote_via=quote, safe="$'(),").encode())

    def fetch(self, history: PriceHistoryView | None = None) -> FetchResult:
        """Read every page. Never raises for bad items or a failure after page 1 (``partial=True``,
        reason in ``errors``); raises :class:`SourceUnavailable` when not even page 1 could be read."""
        if self._client is not None:
            return self._fetch_all(self._client)
        with httpx.Client(
            timeout=self.timeout_s, headers={"Accept": "application/json"}, follow_redirects=True
        ) as client:
            return self._fetch_all(client)

    def _fetch_all(self, client: httpx.Client) -> FetchResult:
        result = FetchResult(SOURCE)
        url = self.first_page_url()
        walk = PageWalk(self.max_pages, "NextPageLink", {str(url)})
        while True:
            where = f"page {result.pages + result.refused_pages + 1}"
            try:
                body, observed_at = self._get_json(client, url, where)
                page = parse_retail_page(body, source=SOURCE, observed_at=observed_at, where=where)
            except _PageFailed as exc:
                self._stop(result, str(exc))
                break
            except MalformedInput as exc:
                result.refuse_page(where, str(exc))
                self._stop(result, str(exc))
                break
            result.add_page(page)
            if not page.next_token:
                break
            following = url.join(page.next_token)
            why = walk.why_stop(result.pages, str(following))
            if why is not None:
                self._stop(result, why)
                break
            url = following
        self._finish(result)
        return result

    def _stop(self, result: FetchResult, why: str) -> None:
        if result.pages == 0:
            raise SourceUnavailable(
                f"Azure Retail Prices API at {self.base_url} gave no usable page: {why}. Check network "
                "access to it (proxy, firewall) and COSTOPT_AZURE_RETAIL_PRICES_URL, then retry.",
                refused_pages=result.refused_pages,
            )
        result.stop_early(why)

    def _finish(self, result: FetchResult) -> None:
        """Drop repeated meters (same offer, time and price: skipped). Two prices for one offer at one
        time are left to the screen every collected batch passes (:func:`pricing.screen.screen_frame`:
        both refused, counted as bad records)."""
        points: dict[tuple[OfferKey, datetime, float], PricePoint] = {}
        for p in result.points:
            points.setdefault((p.key, p.valid_from, p.usd_per_hour), p)
        result.skipped += len(result.points) - len(points)
        result.points = list(points.values())
        result.instance_types = list({t.name: t for t in result.instance_types}.values())
        log.info(
            "%s: %d price points, %d instance types from %d pages (%d skipped, %d bad records%s)",
            SOURCE,
            len(result.points),
            len(result.instance_types),
            result.pages,
            result.skipped,
            result.bad_records,
            ", partial" if result.partial else "",
        )

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        header = None if response is None else response.headers.get("Retry-After")
        retry_after = _retry_after_s(header, self._clock())
        delay = self.backoff_s * 2 ** (attempt - 1) if retry_after is None else retry_after
        return min(delay, self.max_backoff_s)

    def _get_json(self, client: httpx.Client, url: httpx.URL, where: str) -> tuple[object, datetime]:
        """GET one page with retries; returns its decoded JSON and when it was received."""
        last = ""
        for attempt in range(1, self.max_attempts + 1):
            response: httpx.Response | None = None
            try:
                response = client.get(url, timeout=self.timeout_s)
            except httpx.TimeoutException as exc:
                last = f"timed out after {self.timeout_s:g} s ({type(exc).__name__})"
            except httpx.TransportError as exc:
                last = f"connection failed ({type(exc).__name__}: {exc})"
            else:
                status = response.status_code
                if status == 200:
                    try:
                        return strict_json(response.content), self._clock()
                    except MalformedInput as exc:
                        raise MalformedInput(f"{where}: {exc}") from exc
                    except ValueError as exc:
                        raise MalformedInput(f"{where}: response is not JSON ({exc})") from exc
                last = f"HTTP {status}: {response.text[:200]!r}"
                if status != 429 and status < 500:
                    raise _PageFailed(f"{where}: {last} (not retried: check the URL and the $filter)")
            if attempt < self.max_attempts:
                delay = self._delay(attempt, response)
                log.info(
                    "%s: %s: %s; retry %d/%d in %.1f s", SOURCE, where, last, attempt, self.max_attempts - 1, delay
                )
                self._sleep(delay)
        raise _PageFailed(f"{where}: {last} (gave up after {self.max_attempts} attempts)")


# --------------------------------------------------------------------------------------------------
# Resource SKUs (instance catalog)
# --------------------------------------------------------------------------------------------------


@dataclass
class SkuDiscovery:
    """What the Resource SKUs API told about GPU sizes.

    ``available`` maps a region to the GPU sizes offered there to this subscription (sizes with a
    location restriction, e.g. ``NotAvailableForSubscription``, are left out). ``unknown`` lists GPU
    sizes (``GPUs`` > 0) missing from :data:`AZURE_GPU_SIZES`, so their GPU model is unknown.
    ``partial`` is True when some regions could not be read (reasons in ``errors``).
    """

    instance_types: list[InstanceType] = field(default_factory=list)
    available: dict[str, list[str]] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)
    partial: bool = False
    errors: list[str] = field(default_factory=list)


def _capabilities(sku: Any) -> dict[str, str]:
    caps: dict[str, str] = {}
    for cap in getattr(sku, "capabilities", None) or ():
        name, value = getattr(cap, "name", None), getattr(cap, "value", None)
        if isinstance(name, str) and isinstance(value, str):
            caps[name] = value
    return caps


def _number(caps: Mapping[str, str], name: str) -> float | None:
    try:
        value = float(caps[name])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _restricted_locations(sku: Any) -> set[str]:
    """Locations where a ``Location`` restriction (e.g. ``NotAvailableForSubscription``) applies."""
    out: set[str] = set()
    for r in getattr(sku, "restrictions", None) or ():
        kind = getattr(r, "type", None)
        if str(getattr(kind, "value", kind)).lower() != "location":
            continue
        info = getattr(r, "restriction_info", None)
        locations = getattr(info, "locations", None)
        if locations is None and isinstance(r, Mapping):  # the model is a mapping; .values is a method
            locations = r.get("values")
        out.update(str(loc).lower() for loc in locations or ())
    return out


def sku_instance_type(sku: Any, *, source: str = "azure-skus") -> InstanceType | None:
    """A ``virtualMachines`` resource SKU with GPUs -> :class:`InstanceType` (None: not a GPU size).

    ``gpu_count``, ``vcpus`` and ``memory_gib`` come from the capabilities ``GPUs``, ``vCPUs`` and
    ``MemoryGB`` (the size table fills gaps and the fractional GPU of partitioned sizes, which the
    API cannot express); the accelerator comes from :data:`AZURE_GPU_SIZES`.
    Raises :class:`BadRecord` for a GPU size not in the table (its GPU model is unknown).
    """
    if getattr(sku, "resource_type", None) != "virtualMachines":
        return None
    caps = _capabilities(sku)
    gpus = _number(caps, "GPUs")
    if not gpus:
        return None
    name = str(getattr(sku, "name", "") or "")
    found = lookup_size(name)
    if found is None:
        raise BadRecord(f"unknown instance type {name} with {gpus:g} GPUs (not in the Azure GPU size table)")
    canonical, size = found
    vcpus = _number(caps, "vCPUs")
    memory = _number(caps, "MemoryGB")
    gpu_count = size.gpu_count if size.gpu_count < 1 else gpus
    return InstanceType(
        Cloud.AZURE,
        canonical,
        size.accelerator,
        gpu_count,
        int(vcpus) if vcpus is not None else size.vcpus,
        memory if memory is not None else size.memory_gib,
        source,
    )


ComputeClientFactory = Callable[..., "ComputeManagementClient"]


class AzureResourceSkus:
    """Instance catalog from the Azure Resource SKUs API (``resource_skus.list``), GPU sizes only.

    ``credential`` defaults to ``DefaultAzureCredential()`` (created per run, never stored on disk).
    ``base_url`` (None: the public ARM endpoint) and ``client_kwargs`` (azure-core options such as
    ``connection_verify`` or ``retry_total``) are passed to ``ComputeManagementClient``.
    """

    name = "azure-skus"

    def __init__(
        self,
        subscription_id: str,
        *,
        credential: TokenCredential | None = None,
        base_url: str | None = None,
        client_kwargs: Mapping[str, Any] | None = None,
        client_factory: ComputeClientFactory | None = None,
    ) -> None:
        if not subscription_id:
            raise ValueError("an Azure subscription id is needed to list resource SKUs")
        self.subscription_id = subscription_id
        self._credential = credential
        self.base_url = base_url
        self._client_kwargs = dict(client_kwargs or {})
        self._factory = client_factory

    def _client(self, credential: TokenCredential) -> ComputeManagementClient:
        factory = self._factory
        if factory is None:  # imported late: azure-mgmt-compute is slow to import
            from azure.mgmt.compute import ComputeManagementClient

            factory = ComputeManagementClient
        return factory(credential, self.subscription_id, base_url=self.base_url, **self._client_kwargs)

    def discover(self, regions: Sequence[str] | None = None) -> SkuDiscovery:
        """List GPU sizes per region (``regions`` None: one unfiltered listing of every region).

        Raises :class:`SourceUnavailable` when no region could be read; a failing region among
        others sets ``partial``.
        """
        from azure.core.exceptions import AzureError, ClientAuthenticationError

        own_credential = self._credential is None
        if self._credential is not None:
            credential = self._credential
        else:
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential()
        out = SkuDiscovery()
        types: dict[str, InstanceType] = {}
        available: dict[str, set[str]] = {}
        unknown: set[str] = set()
        filters: Iterable[str | None] = [f"location eq '{r}'" for r in regions] if regions else [None]
        read = 0
        try:
            with self._client(credential) as client:
                for flt in filters:
                    try:
                        skus = list(client.resource_skus.list(filter=flt))
                    except ClientAuthenticationError as exc:
                        raise SourceUnavailable(
                            f"Azure refused the credentials for subscription {self.subscription_id}: "
                            f"{exc.message}. Sign in (az login) or set AZURE_CLIENT_ID/AZURE_TENANT_ID/"
                            "AZURE_CLIENT_SECRET, and check the subscription id."
                        ) from exc
                    except AzureError as exc:
                        why = f"resource SKUs ({flt or 'all locations'}): {type(exc).__name__}: {exc}"
                        out.errors.append(why)
                        log.warning("%s: %s", self.name, why)
                        continue
                    read += 1
                    self._collect(skus, types, available, unknown)
        finally:
            if own_credential:
                close = getattr(credential, "close", None)
                if callable(close):
                    close()
        if read == 0:
            raise SourceUnavailable(
                f"could not list Azure resource SKUs at {self.base_url or 'the public ARM endpoint'}: "
                f"{'; '.join(out.errors)}. Check network access and the subscription id."
            )
        if unknown:
            log.info(
                "%s: GPU sizes not in the Azure GPU size table (skipped): %s",
                self.name,
                ", ".join(sorted(unknown)),
            )
        out.partial = bool(out.errors)
        out.instance_types = sorted(types.values(), key=lambda t: t.name)
        out.available = {r: sorted(v) for r, v in sorted(available.items())}
        out.unknown = sorted(unknown)
        return out

    def _collect(
        self,
        skus: Iterable[Any],
        types: dict[str, InstanceType],
        available: dict[str, set[str]],
        unknown: set[str],
    ) -> None:
        for sku in skus:
            try:
                itype = sku_instance_type(sku, source=self.name)
            except BadRecord:
                unknown.add(str(getattr(sku, "name", "")))
                continue
            if itype is None:
                continue
            types.setdefault(itype.name, itype)
            restricted = _restricted_locations(sku)
            for loc in getattr(sku, "locations", None) or ():
                region = str(loc).lower()
                if region not in restricted:
                    available.setdefault(region, set()).add(itype.name)


class AzureSkuSource:
    """The resource-SKU discovery as a scheduled source: it returns instance types, no prices.

    Needs a subscription id (setting ``azure_subscription_id``); credentials come from
    ``DefaultAzureCredential``.
    """

    name = "azure-skus"

    def __init__(self, discovery: AzureResourceSkus, regions: Sequence[str] | None = None) -> None:
        self.discovery = discovery
        self.regions = regions

    def fetch(self, history: PriceHistoryView | None = None) -> FetchResult:
        found = self.discovery.discover(self.regions)
        return FetchResult(
            self.name, instance_types=list(found.instance_types), partial=found.partial, errors=list(found.errors)
        )
