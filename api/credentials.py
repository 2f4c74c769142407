"""Which clouds have credentials on this machine, found cheaply and without any network call, and which
price collectors the service therefore schedules.

A collector that needs a cloud's credentials is scheduled only when :func:`available_clouds` found
some; otherwise the service logs ONE warning line for that cloud at start (what was looked for, which
collectors are off, what to set) instead of a credentials error per region and per run.

What counts as "credentials found" (a presence check, not a proof they work: expired or under-privileged
credentials still fail at the first fetch and are reported by that source as before):

- **aws**: botocore's default chain with its two network providers taken out: environment
  (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``), ``AWS_PROFILE`` / ``~/.aws/credentials`` and
  ``~/.aws/config`` (static keys, assume-role, SSO, web identity, ``aws login``, ``credential_process``,
  which botocore runs once); a container role counts when ``AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`` or
  ``..._FULL_URI`` is set, an instance role when the machine says it is an EC2 instance (DMI vendor
  ``Amazon EC2``, or a Xen ``/sys/hypervisor/uuid`` starting with ``ec2``) and
  ``AWS_EC2_METADATA_DISABLED`` is not ``true``. Neither metadata endpoint is called.
- **gcp**: Application Default Credentials without the metadata server: ``GOOGLE_APPLICATION_CREDENTIALS``
  or gcloud's ``application_default_credentials.json`` (in ``CLOUDSDK_CONFIG`` or ``~/.config/gcloud``),
  validated by ``google.auth.default()`` (which reads that file first and stops there); a Compute Engine
  service account counts when DMI says ``Google`` (the check google-auth itself falls back to).
- **azure**: what ``DefaultAzureCredential`` would use: environment service principal or user
  (``AZURE_CLIENT_ID`` + ``AZURE_TENANT_ID`` + ``AZURE_CLIENT_SECRET`` or ``AZURE_CLIENT_CERTIFICATE_PATH``,
  or ``AZURE_USERNAME``/``AZURE_PASSWORD``), workload identity (``AZURE_FEDERATED_TOKEN_FILE``),
  managed identity endpoints (``IDENTITY_ENDPOINT``, ``MSI_ENDPOINT``), an Azure VM (DMI chassis asset
  tag ``7783-7084-3265-9085``), or the Azure CLI's token cache (``msal_token_cache.*`` or
  ``accessTokens.json`` in ``AZURE_CONFIG_DIR`` or ``~/.azure``, left by ``az login``). Azure PowerShell
  and the Azure Developer CLI logins are not detected: set the environment variables instead.

The Azure Retail Prices collector (``azure``) is public and needs no credentials: it runs either way.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from costopt.domain import Cloud

if TYPE_CHECKING:
    from costopt.settings import Settings

log = logging.getLogger("costopt.credentials")

CLOUDS = (Cloud.AWS, Cloud.GCP, Cloud.AZURE)
"""The clouds whose credentials are checked."""

SOURCE_CLOUDS: Mapping[str, tuple[Cloud, bool]] = {
    "aws-spot": (Cloud.AWS, True),
    "aws-on-demand": (Cloud.AWS, True),
    "aws-catalog": (Cloud.AWS, True),
    "gcp": (Cloud.GCP, True),
    "azure": (Cloud.AZURE, False),  # the Retail Prices API is public
    "azure-skus": (Cloud.AZURE, True),
}
"""Per registered price source (:data:`pricing.sources.SOURCES`): the cloud it collects and whether it
needs that cloud's credentials. A source missing here is scheduled without a check (a test keeps this
table equal to the registry)."""


DMI_DIR = Path("/sys/class/dmi/id")
"""Where Linux exposes the machine's firmware identity (read to tell an EC2, GCE or Azure VM)."""
XEN_UUID = Path("/sys/hypervisor/uuid")
AZURE_ASSET_TAG = "7783-7084-3265-9085"

HOW_TO = {
    Cloud.AWS: (
        "boto3 default chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials "
        "and ~/.aws/config, SSO, web identity, a container or EC2 instance role",
        "Set AWS_PROFILE (after `aws configure` or `aws sso login`) or AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, then restart",
    ),
    Cloud.GCP: (
        "Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS, gcloud's "
        "application_default_credentials.json, or a Compute Engine service account",
        "Set GOOGLE_APPLICATION_CREDENTIALS to a service account key file or run "
        "`gcloud auth application-default login`, then restart",
    ),
    Cloud.AZURE: (
        "DefaultAzureCredential: AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET, workload or "
        "managed identity, or `az login`'s token cache",
        "Set AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET or run `az login`, then restart",
    ),
}
"""Per cloud: (what was looked for, what to do to turn its collectors on)."""


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def _aws(environ: Mapping[str, str]) -> str | None:
    try:
        import botocore.session
        from botocore.exceptions import BotoCoreError
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return "botocore is not installed"
    try:
        resolver = botocore.session.Session().get_component("credential_provider")
        for network_provider in ("iam-role", "container-role"):
            resolver.remove(network_provider)
        if resolver.load_credentials() is not None:
            return None
    except BotoCoreError as exc:  # e.g. AWS_PROFILE names no profile, half a key pair
        return f"the AWS configuration is unusable: {exc}"
    if environ.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") or environ.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        return None
    on_ec2 = _read(DMI_DIR / "sys_vendor") == "Amazon EC2" or _read(XEN_UUID).lower().startswith("ec2")
    if on_ec2 and environ.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true":
        return None
    return "no credentials found"


def _gcp(environ: Mapping[str, str]) -> str | None:
    explicit = environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    config = Path(environ["CLOUDSDK_CONFIG"]) if environ.get("CLOUDSDK_CONFIG") else Path.home() / ".config" / "gcloud"
    if explicit or (config / "application_default_credentials.json").is_file():
        import google.auth
        from google.auth.exceptions import GoogleAuthError

        try:
            google.auth.default()  # a file is found first: the metadata server is not reached
        except GoogleAuthError as exc:
            return f"the Application Default Credentials file is unusable: {exc}"
        return None
    if _read(DMI_DIR / "product_name").startswith("Google"):
        return None
    return "no credentials found"


def _azure(environ: Mapping[str, str]) -> str | None:
    def has(*names: str) -> bool:
        return all(environ.get(n) for n in names)

    if has("AZURE_CLIENT_ID", "AZURE_TENANT_ID") and (
        has("AZURE_CLIENT_SECRET") or has("AZURE_CLIENT_CERTIFICATE_PATH") or has("AZURE_FEDERATED_TOKEN_FILE")
    ):
        return None
    if has("AZURE_CLIENT_ID", "AZURE_USERNAME", "AZURE_PASSWORD"):
        return None
    if has("IDENTITY_ENDPOINT") or has("MSI_ENDPOINT"):
        return None
    if _read(DMI_DIR / "chassis_asset_tag") == AZURE_ASSET_TAG:
        return None
    config = Path(environ["AZURE_CONFIG_DIR"]) if environ.get("AZURE_CONFIG_DIR") else Path.home() / ".azure"
    if any(config.glob("msal_token_cache.*")) or (config / "accessTokens.json").is_file():
        return None
    return "no credentials found"


def available_clouds(settings: Settings, environ: Mapping[str, str] | None = None) -> dict[Cloud, str | None]:
    """For aws, gcp and azure: None when credentials were found (see the module docstring), else why not.

    Reads ``environ`` (None: ``os.environ``; the SDK chains read ``os.environ`` themselves), the user's
    SDK configuration files and the machine's DMI identity; calls no network endpoint. ``settings`` is
    accepted so that configuration can join the decision later; today credentials are never settings."""
    env = os.environ if environ is None else environ
    return {Cloud.AWS: _aws(env), Cloud.GCP: _gcp(env), Cloud.AZURE: _azure(env)}


def collector_names(settings: Settings, available: Mapping[Cloud, str | None] | None = None) -> list[str]:
    """The configured price sources (:func:`pricing.sources.configured`) that need no credentials or whose
    cloud has them (``available``; None: :func:`available_clouds`), in registration order.

    Logs ONE warning per cloud without credentials (what was looked for, which collectors are off, what to
    set) and sets ``costopt_price_collectors_enabled`` per cloud."""
    from api.metrics import PRICE_COLLECTORS_ENABLED
    from pricing.sources import SOURCES, configured

    found = available_clouds(settings) if available is None else available
    names = configured(settings)

    def needs_missing(name: str) -> bool:
        cloud, needs = SOURCE_CLOUDS.get(name, (None, False))
        return needs and cloud is not None and found.get(cloud) is not None

    kept = [n for n in names if not needs_missing(n)]
    for cloud in CLOUDS:
        mine = [n for n, (c, _) in SOURCE_CLOUDS.items() if c is cloud]
        reason = found.get(cloud)
        if reason is not None:
            off = [n for n in names if n in mine and needs_missing(n)]
            unconfigured = {
                n: SOURCES.get(n).missing(settings)
                for n in mine
                if n not in names and SOURCE_CLOUDS[n][1] and n in SOURCES
            }
            free = [n for n in kept if n in mine]
            log.warning("%s", _off_message(cloud, reason, off, unconfigured, free))
        PRICE_COLLECTORS_ENABLED.labels(cloud=cloud.value).set(1 if any(n in mine for n in kept) else 0)
    return kept


def _off_message(
    cloud: Cloud, reason: str, off: Sequence[str], unconfigured: Mapping[str, Sequence[str]], free: Sequence[str]
) -> str:
    """``aws: no credentials found (<chain>); AWS price collectors are off: aws-spot, ... <what to do>.``"""
    looked_for, what_to_do = HOW_TO[cloud]
    parts = [f"{cloud.value}: {reason} ({looked_for})"]
    if off:
        parts.append(f"{cloud.value.upper()} price collectors are off: {', '.join(off)}")
    for name, missing in unconfigured.items():
        parts.append(f"{name} would need them and {', '.join(missing)}")
    if free:
        parts.append(f"{', '.join(free)} needs none and runs")
    return "; ".join(parts) + f". {what_to_do}."
