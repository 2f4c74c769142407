"""boto3 client plumbing shared by the AWS price collectors (``pricing/aws.py``) and the AWS provider
(``providers/aws.py``), so that neither imports the other.

Clients use botocore's *standard* retry mode (5xx, throttling and connection errors are retried with
jittered backoff) and explicit connect/read timeouts. Credentials come from the SDK's default chain
(profile, ``AWS_*`` environment, instance/container role), looked up only when the first client is
made; none is passed in or stored here. ``endpoint_url`` None means AWS's real endpoint of each region.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

__all__ = [
    "AUTH_ERROR_CODES",
    "ClientFactory",
    "ServiceClientFactory",
    "aws_client_config",
    "aws_error_code",
    "boto3_client_factory",
    "describe_aws_error",
    "service_client_factory",
]

ClientFactory = Callable[[str], Any]
"""Builds a boto3 client for a region (the service is fixed by whoever made the factory)."""

ServiceClientFactory = Callable[[str, str], Any]
"""Builds a boto3 client for ``(service, region)``."""


def aws_client_config(*, connect_timeout: float = 10.0, read_timeout: float = 30.0, max_attempts: int = 5) -> Config:
    """botocore client config: standard retry mode, ``max_attempts`` tries in all (the first call plus
    retries), timeouts in seconds."""
    return Config(
        retries={"mode": "standard", "total_max_attempts": max_attempts},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
    )


def service_client_factory(
    *, session: boto3.Session | None = None, endpoint_url: str | None = None, config: Config | None = None
) -> ServiceClientFactory:
    """A factory of ``(service, region)`` clients sharing one session. ``session`` None: a default
    ``boto3.Session()`` created at the first client, so credentials are looked up by the SDK's default
    chain only when a call is about to be made. ``config`` None: :func:`aws_client_config`."""
    holder: list[boto3.Session] = [session] if session is not None else []
    cfg = config or aws_client_config()

    def make(service: str, region: str) -> Any:
        if not holder:
            holder.append(boto3.Session())
        return holder[0].client(service, region_name=region, endpoint_url=endpoint_url, config=cfg)

    return make


def boto3_client_factory(
    service: str,
    *,
    session: boto3.Session | None = None,
    endpoint_url: str | None = None,
    config: Config | None = None,
) -> ClientFactory:
    """A factory of ``service`` clients per region (see :func:`service_client_factory`)."""
    make = service_client_factory(session=session, endpoint_url=endpoint_url, config=config)
    return lambda region: make(service, region)


AUTH_ERROR_CODES = frozenset(
    {
        "UnauthorizedOperation", "AuthFailure", "AccessDenied", "AccessDeniedException",
        "InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken", "ExpiredTokenException",
        "UnrecognizedClientException",
    }
)  # fmt: skip
"""AWS error codes of refused or missing credentials and permissions."""


def aws_error_code(exc: ClientError) -> str:
    """The AWS error code of ``exc`` (``""`` when the response has none)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def describe_aws_error(exc: BaseException) -> str:
    """A one-line account of an SDK error, with what to check when the cause is known."""
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", "?"))
        text = f"{code}: {err.get('Message', exc)}"
        if code in AUTH_ERROR_CODES:
            text += " (check the AWS credentials and that their IAM policy allows this call)"
        return text
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return (
            f"{type(exc).__name__}: {exc} (configure an AWS profile, AWS_ACCESS_KEY_ID/"
            "AWS_SECRET_ACCESS_KEY or an instance role)"
        )
    return f"{type(exc).__name__}: {exc}"
