"""Cloud providers built from :class:`costopt.settings.Settings` (the providers' composition helper).

- :data:`PROVIDERS` is the registry of provider factories by name (``sim``, ``local``, ``aws``, ``gcp``,
  ``azure``); an unknown name raises :class:`UnknownProvider` listing the known ones.
- :func:`build_provider` builds one provider: ``name`` (default ``settings.provider``) is looked up in
  :data:`PROVIDERS`; each is made by its class's ``from_settings``, so the real SDK
  clients honour the endpoint overrides (``aws_endpoint_url``, ``gcp_compute_endpoint``,
  ``azure_arm_endpoint``).
- :func:`build_providers` builds every provider the service uses (``settings.all_providers()``:
  ``provider`` then ``providers``), keyed by :class:`~costopt.domain.Cloud`; the reconciler iterates them.

Missing or contradictory settings raise :class:`~costopt.cloud.ProviderConfigError` naming the
``COSTOPT_*`` variable to set; nothing is called on any cloud while building (SDK clients only connect
at their first request). Each provider module is imported only when asked for, so a service on ``sim``
never loads the cloud SDKs.

The simulated cloud needs prices (a :class:`~costopt.ledger.prices.PriceView`), which live in the
price store: ``api.wiring.build_cloud_provider`` passes the store's view; here they are an argument.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from costopt.cloud import CloudProvider, ProviderConfigError
from costopt.domain import Cloud
from costopt.ledger.prices import PriceView
from costopt.registry import Registry, UnknownName
from costopt.risk.hazard import HazardModel
from costopt.settings import PROVIDER_NAMES, Settings

__all__ = ["PROVIDERS", "PROVIDER_NAMES", "ProviderFactory", "UnknownProvider", "build_provider", "build_providers"]


ProviderFactory = Callable[[Settings, PriceView | None, HazardModel | None, dict[str, Any]], CloudProvider]
"""Builds a provider from ``(settings, prices, hazards, overrides)``; see :func:`build_provider`."""


class UnknownProvider(ProviderConfigError, UnknownName):
    """A provider name that is not registered; the message lists the known names."""


PROVIDERS: Registry[ProviderFactory] = Registry(
    "provider",
    error=UnknownProvider,
    hint="set COSTOPT_PROVIDER (and COSTOPT_PROVIDERS) to names among them",
)
"""Every cloud provider by name (case-insensitive). Its names are :data:`costopt.settings.PROVIDER_NAMES`
(the settings' ``ProviderName``), which the core cannot take from here: a test keeps them equal."""


@PROVIDERS.register("sim")
def _sim(
    settings: Settings, prices: PriceView | None, hazards: HazardModel | None, extra: dict[str, Any]
) -> CloudProvider:
    from providers.sim import SimCloud, SimConfig

    if prices is None:
        raise ProviderConfigError(
            "the simulated cloud needs prices: build it with api.wiring.build_cloud_provider (the price "
            "store's view), or pass prices=...; or choose another provider with COSTOPT_PROVIDER"
        )
    state = settings.sim_state_file
    # the service's cloud forgets instances ended COSTOPT_SIM_FORGET_ENDED_AFTER ago (SimConfig), also restored
    config = extra.get("config") or SimConfig(forget_ended_after=settings.sim_forget_ended_after)
    extra = {**extra, "config": config}
    if state is not None and state.exists() and "clock" not in extra:
        return SimCloud.restore(state, prices, hazards, config=config, rate=extra.get("rate"))
    cloud = SimCloud.from_settings(settings, prices=prices, hazards=hazards, **extra)
    if state is not None and "clock" not in extra:
        cloud.persist_to(state)
    return cloud


@PROVIDERS.register("local")
def _local(
    settings: Settings, prices: PriceView | None, hazards: HazardModel | None, extra: dict[str, Any]
) -> CloudProvider:
    from providers.local import LocalProvider

    return LocalProvider.from_settings(settings, **extra)


@PROVIDERS.register("aws")
def _aws(
    settings: Settings, prices: PriceView | None, hazards: HazardModel | None, extra: dict[str, Any]
) -> CloudProvider:
    from providers.aws import AwsProvider

    return AwsProvider.from_settings(settings, **extra)


@PROVIDERS.register("gcp")
def _gcp(
    settings: Settings, prices: PriceView | None, hazards: HazardModel | None, extra: dict[str, Any]
) -> CloudProvider:
    from providers.gcp import GcpProvider

    return GcpProvider.from_settings(settings, **extra)


@PROVIDERS.register("azure")
def _azure(
    settings: Settings, prices: PriceView | None, hazards: HazardModel | None, extra: dict[str, Any]
) -> CloudProvider:
    from providers.azure import AzureProvider

    return AzureProvider.from_settings(settings, **extra)


def build_provider(
    settings: Settings,
    *,
    name: str | None = None,
    prices: PriceView | None = None,
    hazards: HazardModel | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> CloudProvider:
    """The provider ``name`` (None: ``settings.provider``; any case) built from ``settings``.

    ``prices``/``hazards`` are the simulated cloud's (``sim`` needs ``prices``). ``overrides`` are
    constructor arguments passed to the provider's ``from_settings`` (e.g. ``credentials`` for GCP,
    ``credential`` for Azure, ``session`` for AWS, ``cwd`` for local), winning over the settings.

    Raises :class:`UnknownProvider` (a :class:`ProviderConfigError`) for an unknown name, listing the
    known ones, and :class:`ProviderConfigError` for settings the provider cannot run without.
    """
    factory = PROVIDERS.get(name or settings.provider)
    return factory(settings, prices, hazards, dict(overrides or {}))


def build_providers(
    settings: Settings,
    *,
    prices: PriceView | None = None,
    hazards: HazardModel | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[Cloud, CloudProvider]:
    """Every provider the service uses (``settings.provider``, then ``settings.providers``), by cloud, in
    that order. ``overrides`` maps a provider name to its constructor arguments (see
    :func:`build_provider`). Raises :class:`ProviderConfigError` as :func:`build_provider` does."""
    per_name = overrides or {}
    return {
        Cloud(name): build_provider(settings, name=name, prices=prices, hazards=hazards, overrides=per_name.get(name))
        for name in settings.all_providers()
    }
