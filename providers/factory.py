"""Cloud providers built from :class:`costopt.settings.Settings` (the providers' composition helper).

- :func:`build_provider` builds one provider: ``name`` (default ``settings.provider``) is ``sim``,
  ``local``, ``aws``, ``gcp`` or ``azure``; each is made by its class's ``from_settings``, so the real SDK
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

from collections.abc import Mapping
from typing import Any

from costopt.cloud import CloudProvider, ProviderConfigError
from costopt.domain import Cloud
from costopt.ledger.prices import PriceView
from costopt.risk.hazard import HazardModel
from costopt.settings import PROVIDER_NAMES, Settings

__all__ = ["PROVIDER_NAMES", "build_provider", "build_providers"]


def build_provider(
    settings: Settings,
    *,
    name: str | None = None,
    prices: PriceView | None = None,
    hazards: HazardModel | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> CloudProvider:
    """The provider ``name`` (None: ``settings.provider``) built from ``settings``.

    ``prices``/``hazards`` are the simulated cloud's (``sim`` needs ``prices``). ``overrides`` are
    constructor arguments passed to the provider's ``from_settings`` (e.g. ``credentials`` for GCP,
    ``credential`` for Azure, ``session`` for AWS, ``cwd`` for local), winning over the settings.

    Raises :class:`ProviderConfigError` for an unknown name or settings the provider cannot run without.
    """
    chosen = name or settings.provider
    extra = dict(overrides or {})
    if chosen == "sim":
        from providers.sim import SimCloud

        if prices is None:
            raise ProviderConfigError(
                "the simulated cloud needs prices: build it with api.wiring.build_cloud_provider (the price "
                "store's view), or pass prices=...; or choose another provider with COSTOPT_PROVIDER"
            )
        return SimCloud.from_settings(settings, prices=prices, hazards=hazards, **extra)
    if chosen == "local":
        from providers.local import LocalProvider

        return LocalProvider.from_settings(settings, **extra)
    if chosen == "aws":
        from providers.aws import AwsProvider

        return AwsProvider.from_settings(settings, **extra)
    if chosen == "gcp":
        from providers.gcp import GcpProvider

        return GcpProvider.from_settings(settings, **extra)
    if chosen == "azure":
        from providers.azure import AzureProvider

        return AzureProvider.from_settings(settings, **extra)
    raise ProviderConfigError(
        f"unknown provider {chosen!r}: set COSTOPT_PROVIDER (and COSTOPT_PROVIDERS) to names among "
        f"{', '.join(PROVIDER_NAMES)}"
    )


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
