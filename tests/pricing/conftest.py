"""Fixtures shared by the price-source tests: no real AWS, moto's server, a TLS CA for the Azure fake."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.aws_support import moto_server, scrub_aws_env
from tests.net_support import write_ca


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No real AWS credentials, profiles, endpoints or instance-metadata lookups in any pricing test."""
    scrub_aws_env(monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """moto's server (EC2 and the other services) on a free loopback port, without its default AMIs (not
    needed here, and slow to load per region)."""
    with moto_server(load_default_amis=False, reset=False) as url:
        yield url


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    """A throwaway CA whose certificates the Azure fakes serve."""
    return trustme.CA()


@pytest.fixture(scope="module")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The CA's certificate file, for the Azure clients' ``connection_verify``."""
    return write_ca(ca, tmp_path_factory.mktemp("ca"))
