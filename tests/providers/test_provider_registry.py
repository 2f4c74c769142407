"""The provider registry: its names are the settings' provider names, and an unknown name lists them."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

from api.wiring import build_cloud_provider
from costopt.cloud import ProviderConfigError
from costopt.domain import Cloud
from costopt.registry import UnknownName
from costopt.settings import PROVIDER_NAMES, ProviderName, Settings
from providers.factory import PROVIDERS, UnknownProvider, build_provider
from providers.local import LocalProvider


def test_the_registry_and_the_settings_name_the_same_providers() -> None:
    assert PROVIDERS.names() == PROVIDER_NAMES == get_args(ProviderName)
    assert all(Cloud(name) for name in PROVIDERS.names())  # build_providers keys them by cloud


def test_an_unknown_provider_lists_the_known_ones_and_the_setting_to_change() -> None:
    with pytest.raises(UnknownProvider) as info:
        build_provider(Settings(), name="azur")
    err = info.value
    assert isinstance(err, ProviderConfigError) and isinstance(err, UnknownName)
    assert err.close == ("azure",)
    assert all(name in str(err) for name in PROVIDER_NAMES)
    assert "COSTOPT_PROVIDER" in str(err)
    with pytest.raises(UnknownProvider, match="known: sim, local, aws, gcp, azure"):
        build_cloud_provider(Settings(), name="moon")


def test_provider_names_ignore_case(tmp_path: Path) -> None:
    provider = build_provider(Settings(local_provider_dir=tmp_path), name="LOCAL")
    assert isinstance(provider, LocalProvider)


def test_the_settings_refuse_an_unknown_provider_naming_the_known_ones() -> None:
    with pytest.raises(ValidationError, match="'sim', 'local', 'aws', 'gcp' or 'azure'"):
        Settings(provider="moon")
