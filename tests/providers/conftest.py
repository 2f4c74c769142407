"""Fixtures shared by the provider tests: no real AWS, moto's server, and the local GCP and Azure fakes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.aws_support import deep_learning_ami, moto_server, scrub_aws_env
from tests.net_support import server_tls, write_ca
from tests.providers.azure_fake import FakeArm
from tests.providers.gcp_fake import FakeCompute, serve_compute


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No real AWS credentials, profiles, endpoints or instance-metadata lookups in any provider test."""
    scrub_aws_env(monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """moto's server (EC2, SQS, EventBridge) on loopback with its default AMIs, reset before and after the
    module (moto's backends are shared by the whole process)."""
    with moto_server(load_default_amis=True, reset=True) as url:
        yield url


@pytest.fixture(scope="module")
def dl_ami(moto_url: str) -> str:
    """A Deep Learning AMI from moto's catalog of real (old) public AMIs."""
    return deep_learning_ami(moto_url)


@pytest.fixture
def fake_compute() -> Iterator[FakeCompute]:
    """The Compute Engine fake of ``gcp_fake.py``, served on loopback, empty."""
    with serve_compute() as state:
        yield state


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    """A throwaway CA whose certificates the Azure fake serves."""
    return trustme.CA()


@pytest.fixture(scope="module")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The CA's certificate file, for the Azure clients' ``connection_verify``."""
    return write_ca(ca, tmp_path_factory.mktemp("ca"))


@pytest.fixture
def arm(ca: trustme.CA) -> Iterator[FakeArm]:
    """The ARM fake of ``azure_fake.py`` over TLS on loopback, empty."""
    with FakeArm(server_tls(ca)) as server:
        yield server
