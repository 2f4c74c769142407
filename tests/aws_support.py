"""What every AWS test needs: no real credentials or endpoints, a fake session, moto's server on loopback.

Used by ``tests/providers/conftest.py`` and ``tests/pricing/conftest.py`` (their ``_no_real_aws`` autouse
fixtures and ``moto_url`` fixtures) and by test modules that make clients themselves (:func:`fake_session`).
"""

from __future__ import annotations

import contextlib
import functools
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

REGION = "us-east-1"
MOTO_ACCOUNT = "123456789012"
"""moto's default account id."""

AWS_ENV_VARS = (
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL_SQS",
    "AWS_ENDPOINT_URL_EVENTBRIDGE", "AWS_ENDPOINT_URL_PRICING", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)  # fmt: skip
"""Variables through which real credentials, profiles, regions or endpoints could reach a test."""


def scrub_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No real credentials, profiles, endpoints or instance-metadata lookups can leak into a test: the
    variables of :data:`AWS_ENV_VARS` are removed, the config and credentials files point at nothing and
    the instance metadata service is disabled."""
    for var in AWS_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@functools.cache
def fake_session() -> boto3.Session:
    """One session with dummy keys per process (a new session reloads the service models)."""
    return boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION)


def moto_reset(url: str) -> None:
    """Empty every moto backend of this process (every moto server of the process shares them)."""
    with urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10):
        pass


@contextlib.contextmanager
def moto_server(*, load_default_amis: bool, reset: bool) -> Iterator[str]:
    """moto's server (EC2, SQS, EventBridge, ...) on a free loopback port; yields its URL.

    ``load_default_amis``: moto's catalog of real (old) public AMIs (slow to load per region). ``reset``:
    empty moto's backends before and after (they are shared with every other moto server of the process)."""
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "true" if load_default_amis else "false")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        try:
            if reset:
                moto_reset(url)
            yield url
            if reset:
                moto_reset(url)
        finally:
            server.stop()


def deep_learning_ami(moto_url: str) -> str:
    """A Deep Learning AMI from moto's catalog of real public AMIs (needs ``load_default_amis``)."""
    ec2 = fake_session().client("ec2", endpoint_url=moto_url)
    wanted = [{"Name": "name", "Values": ["Deep Learning AMI Ubuntu*"]}]
    images = ec2.describe_images(Owners=["amazon"], Filters=wanted)["Images"]
    assert images, "moto's default AMIs should include a Deep Learning AMI in us-east-1"
    return str(images[0]["ImageId"])
