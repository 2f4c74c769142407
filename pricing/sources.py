"""The live price sources by name: how each is built from the settings, how often it runs, and what it
needs to run at all.

:data:`SOURCES` is the registry (case-insensitive names): ``aws-spot``, ``aws-on-demand``, ``gcp``,
``azure``, ``aws-catalog``, ``azure-skus``. The service's scheduler (one job per source, at its
interval), ``costopt prices collect --source NAME`` and :func:`api.wiring.build_sources` all read it.
An unknown name raises :class:`UnknownSource` listing the known ones; a source named explicitly whose
settings are missing raises :class:`SourceNotConfigured` naming the ``COSTOPT_*`` variables to set.

Building a source connects to nothing (SDK clients connect at their first request), and each source's
module is imported only when it is built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from costopt.errors import CostoptError
from costopt.registry import Registry, UnknownName
from costopt.settings import Settings
from pricing.base import PriceSource


class UnknownSource(UnknownName):
    """A price source name that is not registered; the message lists the known names."""


class SourceNotConfigured(CostoptError, ValueError):
    """A source asked for by name whose required settings are missing; the message names them."""


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """One price source.

    ``build(settings)`` makes it; ``interval_setting`` is the :class:`Settings` field holding its
    collection interval (a ``timedelta``); ``requires`` are the settings fields that must be set (not
    None, not empty) for it to run (credentials come from each SDK's default chain and are not checked
    here); ``description`` says what it collects.
    """

    name: str
    build: Callable[[Settings], PriceSource]
    interval_setting: str
    description: str
    requires: tuple[str, ...] = ()

    def interval(self, settings: Settings) -> timedelta:
        """How often the source runs."""
        value = getattr(settings, self.interval_setting)
        if not isinstance(value, timedelta):
            raise TypeError(f"setting {self.interval_setting} of source {self.name} is not a timedelta")
        return value

    def missing(self, settings: Settings) -> list[str]:
        """The environment variables still to set before the source can run (empty: configured)."""
        return [f"COSTOPT_{field.upper()}" for field in self.requires if not getattr(settings, field)]


SOURCES: Registry[SourceSpec] = Registry("price source", error=UnknownSource)
"""Every live price source by name, in the order the service schedules them."""


def _register(spec: SourceSpec) -> None:
    SOURCES.register(spec.name, spec)


def _aws_spot(settings: Settings) -> PriceSource:
    from pricing.aws import AwsSpotSource

    return AwsSpotSource.from_settings(settings)


def _aws_on_demand(settings: Settings) -> PriceSource:
    from pricing.aws import AwsOnDemandSource

    return AwsOnDemandSource.from_settings(settings)


def _gcp(settings: Settings) -> PriceSource:
    from pricing.gcp import GcpPriceSource

    return GcpPriceSource.from_settings(settings)


def _azure(settings: Settings) -> PriceSource:
    from pricing.azure import AzureRetailPriceSource

    return AzureRetailPriceSource.from_settings(settings)


def _aws_catalog(settings: Settings) -> PriceSource:
    from pricing.aws import AwsInstanceTypeSource

    return AwsInstanceTypeSource.from_settings(settings)


def _azure_skus(settings: Settings) -> PriceSource:
    from pricing.azure import AzureResourceSkus, AzureSkuSource

    if not settings.azure_subscription_id:
        raise SourceNotConfigured("azure-skus needs COSTOPT_AZURE_SUBSCRIPTION_ID")
    return AzureSkuSource(AzureResourceSkus(settings.azure_subscription_id), settings.azure_regions)


_register(SourceSpec("aws-spot", _aws_spot, "aws_spot_interval", "AWS spot price history (EC2 API, per region)"))
_register(SourceSpec("aws-on-demand", _aws_on_demand, "aws_on_demand_interval", "AWS on-demand prices (Price List)"))
_register(SourceSpec("gcp", _gcp, "gcp_interval", "GCP VM and GPU prices (Cloud Billing Catalog)"))
_register(SourceSpec("azure", _azure, "azure_interval", "Azure spot and on-demand prices (Retail Prices API)"))
_register(SourceSpec("aws-catalog", _aws_catalog, "catalog_interval", "AWS instance types (describe_instance_types)"))
_register(
    SourceSpec(
        "azure-skus",
        _azure_skus,
        "catalog_interval",
        "Azure VM sizes (resource SKUs of the subscription)",
        requires=("azure_subscription_id",),
    )
)


def configured(settings: Settings) -> list[str]:
    """The names of the sources whose required settings are set, in registration order."""
    return [name for name, spec in SOURCES.items() if not spec.missing(settings)]


def build_sources(settings: Settings, names: Sequence[str] | None = None) -> list[PriceSource]:
    """The sources ``names`` (any case; each once, in the order given), or every configured source
    (``names`` None), built from ``settings``.

    Raises :class:`UnknownSource` for a name not registered (listing the known ones) and
    :class:`SourceNotConfigured` for a named source whose required settings are missing.
    """
    if names is None:
        return [SOURCES.get(name).build(settings) for name in configured(settings)]
    chosen = list(dict.fromkeys(SOURCES.canonical(n) for n in names))
    for name in chosen:
        missing = SOURCES.get(name).missing(settings)
        if missing:
            raise SourceNotConfigured(f"price source {name} is not configured: set {', '.join(missing)}")
    return [SOURCES.get(name).build(settings) for name in chosen]


def source_intervals(settings: Settings) -> dict[str, float]:
    """Collection interval of every registered source, in seconds, by name."""
    return {name: spec.interval(settings).total_seconds() for name, spec in SOURCES.items()}
