"""GCP price collector: Compute Engine SKUs of the Cloud Billing Catalog composed into whole-VM prices.

GCP does not sell GPU VMs at one price: a VM is billed as vCPU-hours of its family's *core* SKU, plus
GiB-hours of the family's *RAM* SKU, plus GPU-hours of the accelerator's *GPU* SKU. This module reads
those SKUs through ``CloudCatalogClient.list_skus`` (REST transport, API reference:
https://cloud.google.com/billing/docs/reference/rest/v1/services.skus/list) and composes, for every
shape of :data:`MACHINE_SHAPES`, in every region where all three parts are priced::

    usd_per_hour = vcpus * core + memory_gib * ram + gpu_count * gpu      (exact, in Decimal)

once per market: ``usageType == "OnDemand"`` SKUs give :attr:`Market.ON_DEMAND`, ``"Preemptible"``
(Spot) SKUs give :attr:`Market.SPOT`. A SKU price is the last tier of ``pricingInfo[0]``
(``units + nanos / 1e9`` USD per ``usageUnit``: ``h`` for GPUs and cores, ``GiBy.h`` for RAM).
GCP prices are regional, so every offer has ``zone == ""``.

Instance-type names: a2/a3/g2 shapes keep GCP's machine-type names (``a2-highgpu-1g``); an N1 VM
with attached GPUs is named ``<n1 machine type>+<canonical accelerator>x<count>``, e.g.
``n1-standard-8+v100x1`` or ``n1-standard-32+t4x4`` (see :func:`n1_gpu_instance_name`).

Where accelerators exist comes from Compute Engine ``acceleratorTypes.aggregatedList``
(https://cloud.google.com/compute/docs/reference/rest/v1/acceleratorTypes/aggregatedList); it needs
a project. When it is known, a VM price is emitted only for regions having at least one zone that
offers the shape's accelerator (not OBSOLETE/DELETED, with enough cards per instance); when it is
not (no project, or the call failed), every region of the catalog is priced.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import requests
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.api_core.retry import Retry, if_exception_type
from google.auth import exceptions as auth_exceptions
from google.cloud import billing_v1, compute_v1
from google.protobuf import json_format

from costopt.domain import Cloud, InstanceType, Market, OfferKey, PricePoint, normalize_accelerator, utc
from costopt.errors import BadRecord, MalformedInput, SourceUnavailable
from pricing.base import MAX_PROBLEMS_KEPT, FetchResult, PageWalk, ParsedPage, PriceHistoryView, Problems

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

    from costopt.settings import Settings

log = logging.getLogger("costopt.pricing.gcp")

COMPUTE_ENGINE_SERVICE = "services/6F81-5844-456A"
"""Compute Engine's service in the Cloud Billing Catalog."""

DEFAULT_BILLING_ENDPOINT = "cloudbilling.googleapis.com"
DEFAULT_COMPUTE_ENDPOINT = "compute.googleapis.com"

# --------------------------------------------------------------------------------------------------
# Machine shapes
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MachineShape:
    """A GPU VM shape priced as ``vcpus`` cores + ``memory_gib`` GiB of ``family``'s core/RAM SKUs plus
    ``gpu_count`` GPUs of ``accelerator_type`` (a GCP accelerator type name, e.g. ``nvidia-tesla-v100``).

    ``machine_type`` is the GCP machine type to launch; ``markets`` are the markets it is sold in.
    """

    name: str
    machine_type: str
    family: str
    vcpus: int
    memory_gib: Decimal
    accelerator_type: str
    gpu_count: int
    markets: tuple[Market, ...] = (Market.ON_DEMAND, Market.SPOT)

    @property
    def accelerator(self) -> str:
        """The canonical accelerator name (``v100``, ``a100-80gb``, ...)."""
        return normalize_accelerator(self.accelerator_type)

    def instance_type(self) -> InstanceType:
        """This shape as a domain :class:`InstanceType` (``source="gcp"``)."""
        return InstanceType(
            Cloud.GCP,
            self.name,
            self.accelerator,
            float(self.gpu_count),
            vcpus=self.vcpus,
            memory_gib=float(self.memory_gib),
            source="gcp",
        )


N1_VCPUS_PER_GPU = 8
"""N1 + GPU VMs use one ``n1-standard-8`` worth of host (8 vCPU, 30 GiB) per GPU, as the 2020 paper's
GCP probes did (``n1-standard-8`` for 1 GPU, ``n1-standard-16`` for 2, ... ``n1-standard-64`` for 8).
Every one of these fits GCP's per-GPU-count vCPU/memory limits for K80/P100/V100/T4."""

# GPU counts GCP allows on N1 (https://cloud.google.com/compute/docs/gpus#n1-gpus): K80 and V100 come
# in 1/2/4/8, P100 and T4 only in 1/2/4.
N1_GPU_COUNTS: dict[str, tuple[int, ...]] = {
    "nvidia-tesla-k80": (1, 2, 4, 8),
    "nvidia-tesla-p100": (1, 2, 4),
    "nvidia-tesla-v100": (1, 2, 4, 8),
    "nvidia-tesla-t4": (1, 2, 4),
}

# n1-standard-N has 3.75 GiB per vCPU
# (https://cloud.google.com/compute/docs/general-purpose-machines#n1_machines).
_N1_STANDARD_GIB_PER_VCPU = Decimal("3.75")


def n1_gpu_instance_name(accelerator_type: str, gpu_count: int) -> str:
    """The instance-type name of an N1 VM with GPUs: ``n1-standard-{8*count}+{canonical gpu}x{count}``.

    >>> n1_gpu_instance_name("nvidia-tesla-v100", 2)
    'n1-standard-16+v100x2'
    """
    return f"n1-standard-{N1_VCPUS_PER_GPU * gpu_count}+{normalize_accelerator(accelerator_type)}x{gpu_count}"


def _n1_shapes() -> list[MachineShape]:
    shapes = []
    for acc, counts in N1_GPU_COUNTS.items():
        for n in counts:
            vcpus = N1_VCPUS_PER_GPU * n
            shapes.append(
                MachineShape(
                    n1_gpu_instance_name(acc, n),
                    f"n1-standard-{vcpus}",
                    "n1",
                    vcpus,
                    _N1_STANDARD_GIB_PER_VCPU * vcpus,
                    acc,
                    n,
                )
            )
    return shapes


_SPOT_ONLY = (Market.SPOT,)

# Accelerator-optimized machine types, from https://cloud.google.com/compute/docs/accelerator-optimized-machines
# (A2 Standard / A2 Ultra / A3 High / G2 tables): (name, family, vCPUs, memory GiB, accelerator, GPUs).
# a3-highgpu-1g/2g/4g are sold only as Spot (or Flex-start) VMs, hence no on-demand price for them.
# A2 Ultra is billed with the same A2 core/RAM SKUs as A2 Standard.
_ACCELERATOR_OPTIMIZED: tuple[tuple[str, str, int, str, str, int, tuple[Market, ...] | None], ...] = (
    ("a2-highgpu-1g", "a2", 12, "85", "nvidia-tesla-a100", 1, None),
    ("a2-highgpu-2g", "a2", 24, "170", "nvidia-tesla-a100", 2, None),
    ("a2-highgpu-4g", "a2", 48, "340", "nvidia-tesla-a100", 4, None),
    ("a2-highgpu-8g", "a2", 96, "680", "nvidia-tesla-a100", 8, None),
    ("a2-megagpu-16g", "a2", 96, "1360", "nvidia-tesla-a100", 16, None),
    ("a2-ultragpu-1g", "a2", 12, "170", "nvidia-a100-80gb", 1, None),
    ("a2-ultragpu-2g", "a2", 24, "340", "nvidia-a100-80gb", 2, None),
    ("a2-ultragpu-4g", "a2", 48, "680", "nvidia-a100-80gb", 4, None),
    ("a2-ultragpu-8g", "a2", 96, "1360", "nvidia-a100-80gb", 8, None),
    ("a3-highgpu-1g", "a3", 26, "234", "nvidia-h100-80gb", 1, _SPOT_ONLY),
    ("a3-highgpu-2g", "a3", 52, "468", "nvidia-h100-80gb", 2, _SPOT_ONLY),
    ("a3-highgpu-4g", "a3", 104, "936", "nvidia-h100-80gb", 4, _SPOT_ONLY),
    ("a3-highgpu-8g", "a3", 208, "1872", "nvidia-h100-80gb", 8, None),
    ("g2-standard-4", "g2", 4, "16", "nvidia-l4", 1, None),
    ("g2-standard-8", "g2", 8, "32", "nvidia-l4", 1, None),
    ("g2-standard-12", "g2", 12, "48", "nvidia-l4", 1, None),
    ("g2-standard-16", "g2", 16, "64", "nvidia-l4", 1, None),
    ("g2-standard-24", "g2", 24, "96", "nvidia-l4", 2, None),
    ("g2-standard-32", "g2", 32, "128", "nvidia-l4", 1, None),
    ("g2-standard-48", "g2", 48, "192", "nvidia-l4", 4, None),
    ("g2-standard-96", "g2", 96, "384", "nvidia-l4", 8, None),
)

MACHINE_SHAPES: tuple[MachineShape, ...] = (
    *_n1_shapes(),
    *(
        MachineShape(name, name, fam, cpu, Decimal(mem), acc, n, *((mk,) if mk else ()))
        for name, fam, cpu, mem, acc, n, mk in _ACCELERATOR_OPTIMIZED
    ),
)
"""Every GPU VM shape this collector prices (N1 + K80/P100/V100/T4, A2, A2 Ultra, A3 High, G2)."""

SHAPES_BY_NAME: dict[str, MachineShape] = {s.name: s for s in MACHINE_SHAPES}

# --------------------------------------------------------------------------------------------------
# SKU recognition
# --------------------------------------------------------------------------------------------------

_SPOT_WORDS = r"(?:(?:spot )?preemptible |spot )"
# "N1 Predefined Instance Core running in Americas", "Spot Preemptible A2 Instance Ram running in Iowa".
# Custom, Sole Tenancy, Commitment and DWS SKUs carry other words and do not match.
_CORE_RAM_RE = re.compile(
    rf"^(?P<spot>{_SPOT_WORDS})?(?P<family>n1 predefined|a2|a3|g2) instance (?P<part>core|ram)"
    r" running in (?P<where>[^()]+)$",
    re.IGNORECASE,
)
# "Nvidia Tesla V100 GPU running in Americas", "Spot Preemptible Nvidia L4 GPU running in Iowa",
# "Nvidia Tesla K80 GPU attached to Spot Preemptible VMs running in Warsaw".
_GPU_RE = re.compile(
    rf"^(?P<spot>{_SPOT_WORDS})?nvidia (?P<model>.+?) gpu"
    rf"(?: attached to (?P<attached>{_SPOT_WORDS})?(?:[a-z0-9]+ )?vms)? running in (?P<where>[^()]+)$",
    re.IGNORECASE,
)
_FAMILIES = {"n1 predefined": "n1", "a2": "a2", "a3": "a3", "g2": "g2"}
# GPU model as written in SKU descriptions -> GCP accelerator type name (only GPUs of MACHINE_SHAPES).
_GPU_MODELS: dict[str, str] = {
    "tesla k80": "nvidia-tesla-k80",
    "tesla p100": "nvidia-tesla-p100",
    "tesla v100": "nvidia-tesla-v100",
    "tesla t4": "nvidia-tesla-t4",
    "tesla a100": "nvidia-tesla-a100",
    "a100": "nvidia-tesla-a100",
    "a100 40gb": "nvidia-tesla-a100",
    "tesla a100 80gb": "nvidia-a100-80gb",
    "a100 80gb": "nvidia-a100-80gb",
    "l4": "nvidia-l4",
    "h100 80gb": "nvidia-h100-80gb",
}
_MARKETS = {"OnDemand": Market.ON_DEMAND, "Preemptible": Market.SPOT}
_UNIT_HOUR = "h"
_UNIT_GIB_HOUR = "GiBy.h"
_MAX_UNIT_USD = {_UNIT_HOUR: Decimal(100), _UNIT_GIB_HOUR: Decimal(10)}
"""Above these a component SKU's rate is absurd (a GPU-hour is near 15 USD at most, a vCPU-hour or a
GiB-hour cents); the composed VM price is then also held to the store's bounds (pricing/screen.py)."""


@dataclass(frozen=True, slots=True)
class SkuRate:
    """One component price: ``usd`` per unit-hour (vCPU, GiB or GPU), in force since ``effective``."""

    usd: Decimal
    effective: datetime
    sku_id: str


# (part, family or accelerator type, market, region); part is "core", "ram" or "gpu".
ComponentKey = tuple[str, str, Market, str]


@dataclass
class ComponentPrices:
    """Core/RAM/GPU unit prices read from the catalog, by :data:`ComponentKey`."""

    rates: dict[ComponentKey, SkuRate] = field(default_factory=dict)
    conflicted: set[ComponentKey] = field(default_factory=set)
    """Components two SKUs priced differently: left unpriced (which price is right cannot be told)."""

    def regions(self, part: str, name: str, market: Market) -> set[str]:
        return {k[3] for k in self.rates if k[0] == part and k[1] == name and k[2] == market}


def _plain_utc(value: datetime) -> datetime:
    """A protobuf timestamp (``DatetimeWithNanoseconds``) as a plain tz-aware UTC ``datetime``."""
    dt = utc(value)
    return datetime(dt.year, dt.month, dt.day, dt.hour, dt.minute, dt.second, dt.microsecond, tzinfo=UTC)


def sku_rate(sku: billing_v1.Sku, expected_unit: str) -> SkuRate:
    """The USD price per ``expected_unit`` of a SKU: last tier of ``pricingInfo[0]``.

    Raises :class:`BadRecord` when the rate is missing, negative, not USD or in another unit.
    """
    if not sku.pricing_info:
        raise BadRecord("no pricingInfo")
    info = sku.pricing_info[0]
    expr = info.pricing_expression
    if expr.usage_unit != expected_unit:
        raise BadRecord(f"usageUnit is {expr.usage_unit!r}, expected {expected_unit!r}")
    if not expr.tiered_rates:
        raise BadRecord("no tieredRates")
    rate = expr.tiered_rates[-1]
    if "unit_price" not in rate:
        raise BadRecord("last tiered rate has no unitPrice")
    money = rate.unit_price
    if money.currency_code and money.currency_code != "USD":
        raise BadRecord(f"unitPrice is in {money.currency_code}, not USD")
    usd = Decimal(money.units) + Decimal(money.nanos).scaleb(-9)
    if usd < 0:
        raise BadRecord(f"negative unitPrice {usd}")
    if usd == 0:
        raise BadRecord("unitPrice of zero: not a price")
    if usd > _MAX_UNIT_USD[expected_unit]:
        raise BadRecord(f"absurd unitPrice {usd} USD per {expected_unit} (above {_MAX_UNIT_USD[expected_unit]})")
    if "effective_time" not in info:
        raise BadRecord("pricingInfo has no effectiveTime")
    return SkuRate(usd, _plain_utc(info.effective_time), sku.sku_id)


def read_sku(
    sku: billing_v1.Sku,
    components: ComponentPrices,
    problems: Problems,
    regions: frozenset[str] | None = None,
    *,
    where_prefix: str = "",
) -> None:
    """Record the core/RAM/GPU price of one SKU in ``components`` for each of its wanted regions.

    SKUs of no shape of :data:`MACHINE_SHAPES` (other families, unknown GPUs, commitments, regions not
    in ``regions``; None = all) are counted as skipped; invalid rates as bad records.
    """
    where = f"{where_prefix}SKU {sku.sku_id or sku.name or '?'} ({sku.description!r})"
    category = sku.category
    if category.resource_family != "Compute":
        problems.skip(where, f"resourceFamily {category.resource_family!r}")
        return
    description = " ".join(sku.description.split())
    part: str
    name: str
    expected_unit = _UNIT_HOUR
    if (m := _CORE_RAM_RE.match(description)) is not None:
        part = m["part"].lower()
        name = _FAMILIES[m["family"].lower()]
        if part == "ram":
            expected_unit = _UNIT_GIB_HOUR
        says_spot = bool(m["spot"])
    elif (g := _GPU_RE.match(description)) is not None and category.resource_group == "GPU":
        model = g["model"].lower()
        if model not in _GPU_MODELS:
            problems.skip(where, f"GPU model {g['model']!r} is in no priced shape")
            return
        part, name = "gpu", _GPU_MODELS[model]
        says_spot = bool(g["spot"] or g["attached"])
    else:
        problems.skip(where, "not a core, RAM or GPU SKU of a priced shape")
        return
    market = _MARKETS.get(category.usage_type)
    if market is None:
        problems.skip(where, f"usageType {category.usage_type!r}")
        return
    if not sku.service_regions:
        problems.bad_record(where, "no serviceRegions: the SKU prices no region")
        return
    wanted = [r for r in sku.service_regions if regions is None or r in regions]
    if not wanted:
        problems.skip(where, "no wanted region")
        return
    try:
        if says_spot != (market is Market.SPOT):
            raise BadRecord(f"description and usageType {category.usage_type!r} disagree on the market")
        rate = sku_rate(sku, expected_unit)
    except BadRecord as exc:
        problems.bad_record(where, str(exc))
        return
    added = 0
    for region in wanted:
        key: ComponentKey = (part, name, market, region)
        previous = components.rates.get(key)
        if key in components.conflicted:
            continue
        if previous is None:
            components.rates[key] = rate
            added += 1
        elif previous.usd != rate.usd:
            del components.rates[key]
            components.conflicted.add(key)
            problems.bad_record(
                where,
                f"{part} {name} {market.value} in {region} also priced by SKU {previous.sku_id} at {previous.usd} "
                f"USD (this one: {rate.usd}): both refused",
            )
            added += 1
    if not added:
        problems.skip(where, "every region already priced by another SKU")


def parse_skus_page(
    page: Any,
    *,
    source: str = "gcp",
    regions: frozenset[str] | None = None,
    where: str = "page",
    components: ComponentPrices | None = None,
    problems: Problems | None = None,
) -> tuple[ComponentPrices, Problems, str | None]:
    """One recorded ``services.skus.list`` page (its JSON: ``{"skus": [...], "nextPageToken": ...}``) read
    by the live collector's own :func:`read_sku`: component prices, problems (a SKU that is not a valid
    ``Sku`` message is a bad record; reasons start with ``where``) and the page's continuation token
    (None: the last page). Pass the ``components`` and ``problems`` of earlier pages to read the pages of
    one listing together (a component two pages price differently is refused, as within one page).

    Raises :class:`MalformedInput` when the page is not of that shape (no ``skus`` list).
    """
    if not isinstance(page, Mapping) or not isinstance(page.get("skus"), list):
        raise MalformedInput(f"{where}: not a Cloud Billing Catalog skus page (no skus list)")
    token = page.get("nextPageToken")
    if token is not None and not isinstance(token, str):
        raise MalformedInput(f"{where}: nextPageToken is not text: {token!r:.80}")
    components = components if components is not None else ComponentPrices()
    problems = problems if problems is not None else Problems(source)
    for i, raw in enumerate(page["skus"]):
        try:
            if not isinstance(raw, Mapping):
                raise BadRecord(f"SKU is not an object: {raw!r:.60}")
            sku = billing_v1.Sku.from_json(json.dumps(raw, allow_nan=False), ignore_unknown_fields=True)
        except (BadRecord, json_format.ParseError, ValueError, TypeError) as exc:
            problems.bad_record(f"{where} SKU {i}", f"not a Sku: {exc}")
            continue
        read_sku(sku, components, problems, regions, where_prefix=f"{where} ")
    return components, problems, token or None


# --------------------------------------------------------------------------------------------------
# Accelerator availability
# --------------------------------------------------------------------------------------------------


def gcp_region_of_zone(zone: str) -> str:
    """``us-central1-a`` -> ``us-central1`` (a GCP zone is its region plus ``-<letter>``)."""
    region, sep, suffix = zone.rpartition("-")
    if not sep or not region or not suffix.isalpha():
        raise BadRecord(f"not a GCP zone: {zone!r}")
    return region


@dataclass(frozen=True)
class AcceleratorAvailability:
    """Which zones offer which accelerators, from ``acceleratorTypes.aggregatedList``.

    ``zones``: zone -> {GCP accelerator type name (``nvidia-tesla-v100``): maximumCardsPerInstance,
    0 when not stated}. Accelerators that are OBSOLETE or DELETED in a zone are left out.
    """

    zones: Mapping[str, Mapping[str, int]]

    def by_region(self) -> dict[str, frozenset[str]]:
        """Region -> canonical accelerator names (``v100``, ``l4``, ...) offered in any of its zones."""
        out: dict[str, set[str]] = {}
        for zone, accs in self.zones.items():
            out.setdefault(gcp_region_of_zone(zone), set()).update(normalize_accelerator(a) for a in accs)
        return {r: frozenset(a) for r, a in out.items()}

    def zones_offering(self, accelerator_type: str, gpu_count: int = 1) -> list[str]:
        """Zones offering ``gpu_count`` cards of ``accelerator_type`` (a GCP name) on one VM, sorted."""
        out = []
        for zone, accs in self.zones.items():
            cards = accs.get(accelerator_type)
            if cards is not None and (cards == 0 or cards >= gpu_count):
                out.append(zone)
        return sorted(out)

    def offers(self, region: str, accelerator_type: str, gpu_count: int = 1) -> bool:
        """True when some zone of ``region`` offers ``gpu_count`` cards of ``accelerator_type`` per VM."""
        return any(gcp_region_of_zone(z) == region for z in self.zones_offering(accelerator_type, gpu_count))


def compose_prices(
    components: ComponentPrices,
    availability: AcceleratorAvailability | None,
    observed_at: datetime | None,
    problems: Problems,
    *,
    source: str = "gcp",
) -> list[PricePoint]:
    """Whole-VM price points of every shape/market/region whose core, RAM and GPU are all priced
    (and, when ``availability`` is given, whose region offers the accelerator), exactly in Decimal;
    ``valid_from`` is the latest ``effectiveTime`` of the three SKUs. The live collector and the importer
    of recorded pages both compose through here."""
    points: list[PricePoint] = []
    unavailable = 0
    rates = components.rates
    for shape in MACHINE_SHAPES:
        for market in shape.markets:
            regions = (
                components.regions("gpu", shape.accelerator_type, market)
                & components.regions("core", shape.family, market)
                & components.regions("ram", shape.family, market)
            )
            for region in sorted(regions):
                if availability is not None and not availability.offers(
                    region, shape.accelerator_type, shape.gpu_count
                ):
                    unavailable += 1
                    continue
                core = rates[("core", shape.family, market, region)]
                ram = rates[("ram", shape.family, market, region)]
                gpu = rates[("gpu", shape.accelerator_type, market, region)]
                usd = shape.vcpus * core.usd + shape.memory_gib * ram.usd + shape.gpu_count * gpu.usd
                key = OfferKey(Cloud.GCP, region, "", shape.name, market)
                try:
                    points.append(
                        PricePoint(
                            key,
                            max(core.effective, ram.effective, gpu.effective),
                            float(usd),
                            source,
                            observed_at,
                        )
                    )
                except BadRecord as exc:
                    problems.bad_record(f"{shape.name} {market.value} {region}", str(exc))
    if unavailable:
        log.info("gcp: left out %d shape/market/region prices whose accelerator no zone offers", unavailable)
    return points


# --------------------------------------------------------------------------------------------------
# The source
# --------------------------------------------------------------------------------------------------


@dataclass
class GcpFetchResult(FetchResult):
    """A :class:`FetchResult` plus the accelerator availability used (None: not known this run)."""

    availability: AcceleratorAvailability | None = None


_RETRYABLE: tuple[type[Exception], ...] = (
    api_exceptions.TooManyRequests,
    api_exceptions.InternalServerError,
    api_exceptions.BadGateway,
    api_exceptions.ServiceUnavailable,
    api_exceptions.GatewayTimeout,
    requests.ConnectionError,
    requests.Timeout,
)
_CALL_ERRORS: tuple[type[Exception], ...] = (
    api_exceptions.GoogleAPIError,
    auth_exceptions.GoogleAuthError,
    requests.RequestException,
    json_format.ParseError,
)
_CHECK_HINT = (
    "Check network access to {endpoint}, Google Application Default Credentials "
    "(`gcloud auth application-default login`, or GOOGLE_APPLICATION_CREDENTIALS naming a key file) "
    "and that the {api} is enabled for the credentials' project."
)


def _utc_now() -> datetime:
    return datetime.now(UTC)


class GcpPriceSource:
    """On-demand and spot whole-VM prices of GCP GPU shapes, from the Cloud Billing Catalog.

    Args:
        regions: regions to price (None: every region in the catalog).
        project: GCP project for ``acceleratorTypes.aggregatedList`` (None: skip it, price all regions).
        billing_endpoint / compute_endpoint: API endpoints (None: Google's); ``http://host:port`` works.
        credentials: Google credentials (None: Application Default Credentials).
        timeout_s: per-request timeout in seconds.
        retry_deadline_s / retry_initial_s / retry_maximum_s: exponential backoff for HTTP 429/5xx,
            connection errors and timeouts (total seconds, first and largest pause).
        page_size: SKUs asked per catalog page.
        max_pages: pages read at most per run (a nextPageToken seen before also stops the run: a loop).
        clock: the fetch time (``observed_at``), tz-aware UTC.
    """

    name = "gcp"

    def __init__(
        self,
        *,
        regions: Sequence[str] | None = None,
        project: str | None = None,
        billing_endpoint: str | None = None,
        compute_endpoint: str | None = None,
        credentials: Credentials | None = None,
        timeout_s: float = 30.0,
        retry_deadline_s: float = 120.0,
        retry_initial_s: float = 1.0,
        retry_maximum_s: float = 30.0,
        page_size: int = 5000,
        max_pages: int = 1000,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self.regions = frozenset(regions) if regions is not None else None
        self.project = project
        self.billing_endpoint = billing_endpoint
        self.compute_endpoint = compute_endpoint
        self._credentials = credentials
        self.timeout_s = timeout_s
        self.page_size = page_size
        self.max_pages = max_pages
        self._clock = clock
        self._retry = Retry(
            predicate=if_exception_type(*_RETRYABLE),
            initial=retry_initial_s,
            maximum=retry_maximum_s,
            multiplier=2.0,
            timeout=retry_deadline_s,
            on_error=self._log_retry,
        )

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> GcpPriceSource:
        """A source configured from :class:`costopt.settings.Settings` (``overrides`` win)."""
        kwargs: dict[str, Any] = {
            "regions": settings.gcp_regions,
            "project": settings.gcp_project,
            "billing_endpoint": settings.gcp_billing_endpoint,
            "compute_endpoint": settings.gcp_compute_endpoint,
            "timeout_s": settings.http_timeout_s,
        }
        kwargs.update(overrides)
        return cls(**kwargs)

    @staticmethod
    def _log_retry(exc: Exception) -> None:
        log.warning("gcp: request failed, retrying with backoff: %s", exc)

    def _options(self, endpoint: str | None) -> ClientOptions | None:
        return ClientOptions(api_endpoint=endpoint) if endpoint else None

    # -- catalog ------------------------------------------------------------------------------------

    def _catalog_pages(self) -> Iterable[billing_v1.ListSkusResponse]:
        client = billing_v1.CloudCatalogClient(
            credentials=self._credentials, transport="rest", client_options=self._options(self.billing_endpoint)
        )
        request = billing_v1.ListSkusRequest(
            parent=COMPUTE_ENGINE_SERVICE, page_size=self.page_size, currency_code="USD"
        )
        pager = client.list_skus(request=request, retry=self._retry, timeout=self.timeout_s)
        return pager.pages

    def read_catalog(self, result: FetchResult) -> ComponentPrices:
        """Read every Compute Engine SKU page into component prices, counting pages and problems in
        ``result``. A failure after the first page sets ``result.partial`` and keeps what was read.

        Raises :class:`SourceUnavailable` when not even the first page could be read.
        """
        components = ComponentPrices()
        endpoint = self.billing_endpoint or DEFAULT_BILLING_ENDPOINT
        walk = PageWalk(self.max_pages, "nextPageToken")
        try:
            for page in self._catalog_pages():
                problems = Problems(self.name)
                for sku in page.skus:
                    read_sku(sku, components, problems, self.regions)
                result.add_page(ParsedPage([], problems, next_token=page.next_page_token or None))
                why = walk.why_stop(result.pages, page.next_page_token) if page.next_page_token else None
                if why is not None:
                    result.stop_early(why)
                    break
        except _CALL_ERRORS as exc:
            what = f"Cloud Billing Catalog ({endpoint}) failed after {result.pages} page(s): {exc}"
            if isinstance(exc, json_format.ParseError):
                result.refuse_page(f"page {result.pages + 1}", f"not a skus page: {exc}")
            if result.pages == 0:
                raise SourceUnavailable(
                    f"GCP {what}. " + _CHECK_HINT.format(endpoint=endpoint, api="Cloud Billing API"),
                    refused_pages=result.refused_pages,
                ) from exc
            result.stop_early(what)
        return components

    # -- availability -------------------------------------------------------------------------------

    def fetch_availability(self) -> AcceleratorAvailability | None:
        """Zones offering each accelerator type, for :attr:`project` (None when no project is set).

        Raises :class:`SourceUnavailable` when the Compute Engine API cannot be read completely.
        """
        if not self.project:
            log.info(
                "gcp: no project set (COSTOPT_GCP_PROJECT); skipping the accelerator zone lookup, "
                "pricing every catalog region"
            )
            return None
        endpoint = self.compute_endpoint or DEFAULT_COMPUTE_ENDPOINT
        zones: dict[str, dict[str, int]] = {}
        try:
            client = compute_v1.AcceleratorTypesClient(
                credentials=self._credentials, transport="rest", client_options=self._options(self.compute_endpoint)
            )
            request = compute_v1.AggregatedListAcceleratorTypesRequest(project=self.project)
            for scope, scoped in client.aggregated_list(request=request, retry=self._retry, timeout=self.timeout_s):
                if not scope.startswith("zones/"):
                    continue
                zone = scope.removeprefix("zones/")
                for acc in scoped.accelerator_types:
                    if "deprecated" in acc and acc.deprecated.state in ("OBSOLETE", "DELETED"):
                        continue
                    zones.setdefault(zone, {})[acc.name] = int(acc.maximum_cards_per_instance)
        except _CALL_ERRORS as exc:
            raise SourceUnavailable(
                f"GCP acceleratorTypes.aggregatedList ({endpoint}, project {self.project}) failed: {exc}. "
                + _CHECK_HINT.format(endpoint=endpoint, api="Compute Engine API")
                + " The credentials need compute.acceleratorTypes.list on the project."
            ) from exc
        return AcceleratorAvailability(zones)

    # -- composition --------------------------------------------------------------------------------

    def compose(
        self,
        components: ComponentPrices,
        availability: AcceleratorAvailability | None,
        observed_at: datetime,
        problems: Problems,
    ) -> list[PricePoint]:
        """Whole-VM price points of every shape/market/region whose core, RAM and GPU are all priced
        (and, when ``availability`` is given, whose region offers the accelerator)."""
        return compose_prices(components, availability, observed_at, problems, source=self.name)

    # -- PriceSource --------------------------------------------------------------------------------

    def fetch(self, history: PriceHistoryView) -> GcpFetchResult:
        """Fetch current catalog prices and compose whole-VM price points.

        ``history`` is not used: the catalog only gives current prices. ``valid_from`` of a point is the
        latest ``effectiveTime`` of its three SKUs; ``observed_at`` is the fetch time (UTC).
        Raises :class:`SourceUnavailable` when the catalog cannot be read at all; a failing
        accelerator lookup only leaves ``availability`` None (recorded in ``errors``).
        """
        del history
        observed_at = self._clock()
        result = GcpFetchResult(source=self.name)
        components = self.read_catalog(result)
        try:
            result.availability = self.fetch_availability()
        except SourceUnavailable as exc:
            log.warning("gcp: %s; pricing every catalog region instead", exc)
            result.errors.append(str(exc))
        if result.availability is not None and not result.availability.zones:
            log.warning(
                "gcp: acceleratorTypes.aggregatedList for project %s listed no zones; pricing every catalog region",
                self.project,
            )
            result.availability = None
        problems = Problems(self.name)
        result.points = self.compose(components, result.availability, observed_at, problems)
        result.instance_types = [shape.instance_type() for shape in MACHINE_SHAPES]
        result.bad_records += problems.bad
        result.reasons.extend(problems.reasons[: max(0, MAX_PROBLEMS_KEPT - len(result.reasons))])
        log.info(
            "gcp: %d prices of %d shapes from %d catalog page(s) (%d SKUs skipped, %d bad)%s",
            len(result.points),
            len({p.key.instance_type for p in result.points}),
            result.pages,
            result.skipped,
            result.bad_records,
            " PARTIAL" if result.partial else "",
        )
        return result
