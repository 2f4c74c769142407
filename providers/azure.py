"""The Azure provider: Spot and regular VMs behind :class:`costopt.cloud.CloudProvider`.

How each contract of the protocol is kept:

- ``launch(spec, token)`` creates at most one VM per token: the VM's name is derived from the token
  (``costopt-<sha256(token)[:16]>``, its NIC ``<vm>-nic``), so Azure's create-or-update is idempotent by
  itself. Before creating anything the provider reads the VM of that name and returns it if it exists, so a
  retried launch never creates (or re-sends) a second VM. The token is also stored as the tag
  ``costopt:token`` (with ``spec.tags``: job and epoch). A VM that was deleted no longer exists in Azure, so a
  token whose VM was deleted launches afresh: use a fresh token for every distinct launch.
- ``terminate(instance_id)`` is idempotent: deleting a VM or NIC that does not exist is not an error. It
  refuses (:class:`CloudError`) to delete a VM without the ``costopt:token`` tag.
- ``list(tags)`` only returns VMs of the resource group that carry ``costopt:token`` (and every ``tags`` item
  exactly): every such VM that exists, stopped and deallocated ones included; a deleted VM no longer exists
  and is not listed (the rule of :mod:`costopt.cloud`).
- ``interruptions(since)``: Scheduled Events ``Preempt`` notices (30 s ahead; read through an injected
  fetcher, on a VM the instance metadata service: see :func:`imds_scheduled_events`), then Spot VMs found
  evicted: deallocated by the platform, or vanished (eviction policy ``Delete``) without costopt deleting them.

States (instance view): ``PowerState/running`` -> RUNNING; ``ProvisioningState/creating`` or
``PowerState/starting`` (or no power state yet) -> PENDING; ``PowerState/stopping|deallocating``,
``ProvisioningState/deleting`` or ``failed`` -> STOPPING; ``PowerState/stopped|deallocated`` -> STOPPED
(the VM and its disks exist; ``stopped`` even keeps billing compute); a Spot VM deallocated or evicted by
the platform -> PREEMPTED (costopt itself never deallocates: it deletes); a VM costopt deleted ->
TERMINATED (while this provider object remembers it; after that :class:`NotFoundError`).

Errors: ``SkuNotAvailable``/``AllocationFailed``/``ZonalAllocationFailed``/``OverconstrainedAllocationRequest``
-> :class:`CapacityError`; ``QuotaExceeded`` or ``OperationNotAllowed`` about a quota -> :class:`QuotaError`;
401/403 (``AuthorizationFailed``…) or a credential that cannot get a token -> :class:`AuthError`; 404
(``ResourceNotFound``) -> :class:`NotFoundError`; anything else -> :class:`CloudError`.

Credentials: ``DefaultAzureCredential`` (environment, managed identity, ``az login``) unless one is injected.
:meth:`AzureProvider.from_settings` builds the provider from the ``COSTOPT_AZURE_*`` settings (docs/providers.md).
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import json
import logging
import re
import threading
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from azure.core.exceptions import AzureError, ClientAuthenticationError, HttpResponseError, ResourceNotFoundError
from azure.mgmt.compute import models as cm
from azure.mgmt.network import models as nm

from costopt.cloud import (
    AuthError,
    CapacityError,
    CloudError,
    Instance,
    InstanceState,
    Interruption,
    LaunchSpec,
    NotFoundError,
    ProviderConfigError,
    QuotaError,
    tags_match,
)
from costopt.domain import Cloud, Market, OfferKey, parse_utc, utc
from costopt.errors import BadRecord
from costopt.settings import Settings
from providers.boot import boot_script
from providers.console import tail_lines

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

log = logging.getLogger("costopt.providers.azure")

TOKEN_TAG = "costopt:token"
"""Tag holding the idempotency token of the launch that created a VM; marks costopt's VMs."""

SPOT_NOTICE = timedelta(seconds=30)
"""Azure's Scheduled Events announce a Spot eviction (``Preempt``) at least 30 s ahead."""

IMDS_SCHEDULED_EVENTS_URL = "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01"
"""The instance metadata service's Scheduled Events endpoint, reachable from inside an Azure VM only."""

MAX_CUSTOM_DATA_BYTES = 65535
"""Azure rejects custom data above 64 KB (before base64)."""

MAX_TOKEN_LENGTH = 256
"""Azure tag values hold at most 256 characters."""

DEFAULT_ADMIN_USERNAME = "costopt"

DEFAULT_IMAGE = "microsoft-dsvm:ubuntu-hpc:2204:latest"
"""Image when neither ``LaunchSpec.image`` nor the settings name one: Microsoft's Ubuntu HPC 22.04 image
(NVIDIA drivers, CUDA and InfiniBand drivers installed)."""

_SSH_KEY_PREFIXES = ("ssh-", "ecdsa-", "sk-ssh-", "sk-ecdsa-")

_CAPACITY_CODES = frozenset(
    {"SkuNotAvailable", "AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest",
     "OverconstrainedZonalAllocationRequest"}
)  # fmt: skip
_QUOTA_CODES = frozenset({"QuotaExceeded", "OperationNotAllowed"})
_AUTH_CODES = frozenset(
    {"AuthorizationFailed", "AuthenticationFailed", "InvalidAuthenticationToken", "InvalidAuthenticationTokenTenant",
     "LinkedAuthorizationFailed", "ExpiredAuthenticationToken"}
)  # fmt: skip
_NOT_FOUND_CODES = frozenset({"ResourceNotFound", "NotFound", "ResourceGroupNotFound"})
_WHY = {
    "subscription_id": "the subscription VMs are created in",
    "resource_group": "the resource group VMs and NICs are created in",
    "subnet_id": "region=subnet resource id, for the VMs' NICs",
    "ssh_public_key": "the admin's SSH public key or its .pub path; password login is disabled",
}
_KNOWN_CODE = re.compile(r"\b(" + "|".join(sorted(_CAPACITY_CODES | _QUOTA_CODES | _AUTH_CODES)) + r")\b")

ScheduledEventsFetcher = Callable[[], "Mapping[str, Any] | str | bytes"]
"""Returns the Scheduled Events document (parsed, or its JSON text)."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------- errors


def error_code(exc: BaseException) -> str:
    """The ARM error code of ``exc`` (``error.code`` of the response, or of a failed long-running operation)."""
    err = getattr(exc, "error", None)
    code = getattr(err, "code", None)
    if isinstance(code, str) and code:
        return code
    response = getattr(exc, "response", None)
    if response is not None:
        try:
            body = json.loads(response.text())
        except (ValueError, TypeError, AttributeError):
            body = None
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            return str(body["error"].get("code", ""))
    match = _KNOWN_CODE.search(str(exc))
    return match.group(1) if match else ""


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def translate_error(exc: BaseException, action: str) -> CloudError:
    """The project's typed error for an azure-core error raised while doing ``action``."""
    code = error_code(exc)
    status = getattr(exc, "status_code", None)
    what = f"Azure: cannot {action}: {code or type(exc).__name__}: {_first_line(exc)}"
    if code in _CAPACITY_CODES:
        return CapacityError(
            f"{what}. Azure has no capacity for this size here now: try another zone, size, region or market, "
            "and this one again later."
        )
    if code == "QuotaExceeded" or (code == "OperationNotAllowed" and "quota" in str(exc).lower()):
        return QuotaError(
            f"{what}. The subscription's vCPU quota is exhausted (regional, family or Spot quota): request an "
            "increase in the portal's Quotas page or launch elsewhere."
        )
    if isinstance(exc, ClientAuthenticationError) or status in (401, 403) or code in _AUTH_CODES:
        return AuthError(
            f"{what}. Check the Azure credentials (environment, managed identity or 'az login') and that their "
            "role allows Microsoft.Compute/virtualMachines/* and Microsoft.Network/networkInterfaces/* on the "
            "resource group."
        )
    if isinstance(exc, ResourceNotFoundError) or status == 404 or code in _NOT_FOUND_CODES:
        return NotFoundError(f"{what}. The resource does not exist (any more) in this resource group.")
    if isinstance(exc, HttpResponseError):
        return CloudError(f"{what}. Azure refused the request; see the code above.")
    return CloudError(f"{what}. The request failed: check network access to the ARM endpoint.")


# --------------------------------------------------------------------------- names, tags, custom data


def _check_token(token: str) -> None:
    if not token or len(token) > MAX_TOKEN_LENGTH or not token.isascii():
        raise ValueError(f"idempotency token must be 1 to {MAX_TOKEN_LENGTH} ASCII characters, got {token!r}")


def vm_name(token: str) -> str:
    """The VM name of the launch with ``token``: ``costopt-`` and 16 hex digits of its SHA-256."""
    return "costopt-" + hashlib.sha256(token.encode()).hexdigest()[:16]


def nic_name(vm: str) -> str:
    return f"{vm}-nic"


def launch_tags(spec: LaunchSpec, token: str) -> dict[str, str]:
    """``spec.tags`` plus ``costopt:token``. Raises ValueError for a differing ``costopt:token`` in the spec or
    tag names Azure refuses (``<>%&\\?/``)."""
    tags = dict(spec.tags)
    for key in tags:
        if any(c in key for c in "<>%&\\?/"):
            raise ValueError(f"Azure tag names cannot contain <>%&\\?/: {key!r}")
    if tags.get(TOKEN_TAG, token) != token:
        raise ValueError(f"spec.tags[{TOKEN_TAG!r}] = {tags[TOKEN_TAG]!r} differs from the idempotency token {token!r}")
    tags[TOKEN_TAG] = token
    return tags


def custom_data_script(spec: LaunchSpec) -> str:
    """The custom data that starts ``spec``'s job (:func:`providers.boot.boot_script`). Raises ValueError for
    an empty command, a bad env name, a NUL character, or a script above Azure's 64 KB."""
    return boot_script(spec, max_bytes=MAX_CUSTOM_DATA_BYTES, limit_name="Azure's")


def read_ssh_public_key(value: str) -> str:
    """An SSH public key given as the key itself (``ssh-ed25519 AAAA...``) or the path of a ``.pub`` file
    (``~`` expanded). Raises :class:`ProviderConfigError` for a file that cannot be read or a value that is
    not an OpenSSH public key."""
    text = value.strip()
    if not text.startswith(_SSH_KEY_PREFIXES):
        path = Path(text).expanduser()
        try:
            text = path.read_text().strip()
        except OSError as exc:
            raise ProviderConfigError(
                f"Azure: COSTOPT_AZURE_SSH_PUBLIC_KEY is neither an SSH public key nor a readable file ({exc}): "
                "set it to the key (ssh-ed25519 AAAA...) or the path of a .pub file"
            ) from exc
    if not text.startswith(_SSH_KEY_PREFIXES) or len(text.split()) < 2:
        raise ProviderConfigError(
            "Azure: COSTOPT_AZURE_SSH_PUBLIC_KEY does not hold an OpenSSH public key (ssh-ed25519 AAAA..., "
            "ssh-rsa AAAA...): point it at the .pub file, not the private key"
        )
    return text


def image_reference(image: str | Mapping[str, str]) -> cm.ImageReference:
    """An image given as a resource id (``/subscriptions/...``), a URN ``publisher:offer:sku:version`` or a
    mapping of those four (``publisher``, ``offer``, ``sku``, ``version``)."""
    if isinstance(image, Mapping):
        return cm.ImageReference(**dict(image))
    if image.startswith("/"):
        return cm.ImageReference(id=image)
    parts = image.split(":")
    if len(parts) != 4 or not all(parts):
        raise ValueError(f"image {image!r} is neither a resource id nor a URN publisher:offer:sku:version")
    return cm.ImageReference(publisher=parts[0], offer=parts[1], sku=parts[2], version=parts[3])


def _zone_of(offer: OfferKey) -> str | None:
    """Azure zone number of the offer ("1", or "eastus-1" -> "1"); None for a regional offer."""
    if not offer.zone:
        return None
    last = offer.zone.rsplit("-", 1)[-1]
    if not last.isdigit():
        raise ValueError(f"offer zone {offer.zone!r} is not an Azure zone (1, 2, 3 or <region>-<n>)")
    return last


# --------------------------------------------------------------------------- states


def _text(value: Any) -> str:
    """A model field as plain text (the SDK hands some fields back as str enums)."""
    if value is None:
        return ""
    return str(value.value) if isinstance(value, Enum) else str(value)


def _status_codes(vm: Any) -> builtins.list[str]:
    view = getattr(vm, "instance_view", None)
    return [str(s.code) for s in (getattr(view, "statuses", None) or []) if getattr(s, "code", None)]


def map_state(vm: Any) -> InstanceState:
    """The :class:`InstanceState` of a VM read with its instance view (see the module docstring)."""
    codes = [c.lower() for c in _status_codes(vm)]
    power = next((c.split("/", 1)[1] for c in codes if c.startswith("powerstate/")), "")
    provisioning = next((c.split("/", 1)[1] for c in codes if c.startswith("provisioningstate/")), "")
    provisioning = provisioning or _text(getattr(vm, "provisioning_state", None)).lower()
    spot = _text(getattr(vm, "priority", None)).lower() == "spot"
    if spot and (any("evict" in c or "preempt" in c for c in codes) or power in ("deallocating", "deallocated")):
        return InstanceState.PREEMPTED
    if provisioning.startswith("deleting") or provisioning.startswith("failed"):
        return InstanceState.STOPPING
    if power == "running":
        return InstanceState.RUNNING
    if power in ("stopping", "deallocating"):
        return InstanceState.STOPPING
    if power in ("stopped", "deallocated"):
        return InstanceState.STOPPED
    return InstanceState.PENDING


def to_instance(vm: Any) -> Instance:
    """An :class:`Instance` from a VM model (``instance_id`` is the VM name)."""
    zones = list(getattr(vm, "zones", None) or [])
    market = Market.SPOT if _text(getattr(vm, "priority", None)).lower() == "spot" else Market.ON_DEMAND
    created = getattr(vm, "time_created", None)
    return Instance(
        instance_id=str(vm.name),
        offer=OfferKey(
            Cloud.AZURE, str(vm.location), zones[0] if zones else "", _text(vm.hardware_profile.vm_size), market
        ),
        state=map_state(vm),
        tags=dict(vm.tags or {}),
        launched_at=utc(created) if isinstance(created, datetime) else None,
    )


# --------------------------------------------------------------------------- scheduled events


def _not_before(text: Any, noticed_at: datetime) -> datetime:
    if not isinstance(text, str) or not text.strip():
        return noticed_at + SPOT_NOTICE
    try:
        return utc(parsedate_to_datetime(text))
    except (TypeError, ValueError):
        return parse_utc(text)


def parse_scheduled_events(
    doc: Mapping[str, Any] | str | bytes, *, noticed_at: datetime | None = None
) -> builtins.list[Interruption]:
    """The ``Preempt`` events of a Scheduled Events document (``{"DocumentIncarnation": n, "Events": [...]}``)
    as "notice" interruptions, one per resource (VM name); the deadline is the event's ``NotBefore`` (RFC 1123,
    e.g. ``Mon, 19 Sep 2016 18:29:47 GMT``), or 30 s after ``noticed_at`` when it has none. Other event types
    (Reboot, Redeploy, Freeze, Terminate) are ignored. Raises :class:`BadRecord` for a malformed document."""
    now = utc(noticed_at) if noticed_at is not None else _utcnow()
    if isinstance(doc, str | bytes):
        try:
            doc = json.loads(doc)
        except ValueError as exc:
            raise BadRecord(f"Scheduled Events document is not JSON: {exc}") from exc
    if not isinstance(doc, Mapping) or not isinstance(doc.get("Events", None), list):
        raise BadRecord("Scheduled Events document has no 'Events' list")
    out: builtins.list[Interruption] = []
    for event in doc["Events"]:
        if not isinstance(event, Mapping):
            raise BadRecord(f"Scheduled Events entry is not an object: {event!r}")
        if str(event.get("EventType", "")) != "Preempt":
            continue
        resources = event.get("Resources")
        if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
            raise BadRecord(f"Preempt event {event.get('EventId')!r} has no list of resource names")
        try:
            deadline = _not_before(event.get("NotBefore"), now)
        except BadRecord as exc:
            raise BadRecord(f"Preempt event {event.get('EventId')!r}: bad NotBefore: {exc}") from exc
        out.extend(Interruption(instance_id=r, noticed_at=now, deadline=deadline, kind="notice") for r in resources)
    return out


def imds_scheduled_events(url: str = IMDS_SCHEDULED_EVENTS_URL, timeout: float = 2.0) -> ScheduledEventsFetcher:
    """A fetcher of the Scheduled Events document from the instance metadata service (``Metadata: true``),
    for a provider running inside an Azure VM of the same availability set or scale set."""

    def fetch() -> bytes:
        request = urllib.request.Request(url, headers={"Metadata": "true"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body: bytes = response.read()
        return body

    return fetch


# --------------------------------------------------------------------------- the provider


class AzureProvider:
    """Azure VMs of one subscription and resource group behind :class:`costopt.cloud.CloudProvider`
    (``name == "azure"``); see the module docstring for the contracts kept."""

    name = "azure"

    def __init__(
        self,
        subscription_id: str,
        resource_group: str,
        *,
        subnet_id: str | Mapping[str, str],
        image: str | Mapping[str, str] = DEFAULT_IMAGE,
        ssh_public_key: str,
        admin_username: str = DEFAULT_ADMIN_USERNAME,
        os_disk_type: str = "Premium_LRS",
        credential: TokenCredential | None = None,
        base_url: str | None = None,
        client_kwargs: Mapping[str, Any] | None = None,
        compute_client: Any = None,
        network_client: Any = None,
        scheduled_events: ScheduledEventsFetcher | None = None,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        """
        - ``subscription_id``, ``resource_group``: where VMs and NICs are created, listed and deleted.
        - ``subnet_id``: resource id of the subnet every NIC joins (its VNet must be in the offer's region), or
          a mapping region -> subnet id (launches in other regions are refused).
        - ``image``: resource id, URN ``publisher:offer:sku:version`` or mapping; ``LaunchSpec.image`` overrides.
        - ``ssh_public_key``, ``admin_username``: the Linux admin account (password login is disabled).
        - ``credential``: a ``TokenCredential`` (default: ``DefaultAzureCredential()``, created at first use).
        - ``base_url`` (None: public ARM) and ``client_kwargs`` (azure-core options such as ``connection_verify``,
          ``retry_total``, ``polling_interval``) are passed to both management clients; ``compute_client`` and
          ``network_client`` replace them outright.
        - ``scheduled_events``: fetcher of the Scheduled Events document (:func:`imds_scheduled_events` on a VM).
        - ``clock``: now, for notices and preemptions whose time Azure does not report.
        """
        if not subscription_id or not resource_group:
            raise ValueError("AzureProvider needs a subscription id and a resource group")
        if not subnet_id:
            raise ValueError(
                "AzureProvider needs the resource id of a subnet for the VMs' NICs (COSTOPT_AZURE_SUBNET_IDS)"
            )
        image_reference(image)  # validate early
        self.subscription_id = subscription_id
        self.resource_group = resource_group
        self.subnet_id: str | dict[str, str] = subnet_id if isinstance(subnet_id, str) else dict(subnet_id)
        self.image = image
        self.ssh_public_key = ssh_public_key
        self.admin_username = admin_username
        self.os_disk_type = os_disk_type
        self.base_url = base_url
        self._credential = credential
        self._client_kwargs = dict(client_kwargs or {})
        self._compute = compute_client
        self._network = network_client
        self._scheduled_events = scheduled_events
        self._clock = clock
        self._lock = threading.Lock()
        self._spot_seen: dict[str, Instance] = {}
        self._deleted: dict[str, Instance] = {}
        self._reported: set[tuple[str, str]] = set()

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> AzureProvider:
        """Built from :class:`Settings`: ``azure_subscription_id``, ``azure_resource_group``,
        ``azure_subnet_ids`` and ``azure_ssh_public_key`` (key or ``.pub`` path) are required;
        ``azure_image`` (None: :data:`DEFAULT_IMAGE`), ``azure_admin_username``, ``azure_arm_endpoint``.
        ``overrides`` (constructor arguments, e.g. ``credential``, ``client_kwargs``) win. Raises
        :class:`ProviderConfigError` naming the first missing setting."""
        required = {
            "subscription_id": ("COSTOPT_AZURE_SUBSCRIPTION_ID", settings.azure_subscription_id),
            "resource_group": ("COSTOPT_AZURE_RESOURCE_GROUP", settings.azure_resource_group),
            "subnet_id": ("COSTOPT_AZURE_SUBNET_IDS", settings.azure_subnet_ids),
            "ssh_public_key": ("COSTOPT_AZURE_SSH_PUBLIC_KEY", settings.azure_ssh_public_key),
        }
        for arg, (var, value) in required.items():
            if not value and not overrides.get(arg):
                raise ProviderConfigError(f"Azure: {var} is not set: the Azure provider needs it ({_WHY[arg]})")
        kwargs: dict[str, Any] = {
            "subscription_id": settings.azure_subscription_id,
            "resource_group": settings.azure_resource_group,
            "subnet_id": settings.azure_subnet_ids,
            "image": settings.azure_image or DEFAULT_IMAGE,
            "admin_username": settings.azure_admin_username,
            "base_url": settings.azure_arm_endpoint,
        }
        if "ssh_public_key" not in overrides:
            kwargs["ssh_public_key"] = read_ssh_public_key(str(settings.azure_ssh_public_key))
        kwargs.update(overrides)
        return cls(**kwargs)

    # ------------------------------------------------------------------ plumbing

    def subnet_for(self, region: str) -> str:
        """The subnet of ``region``'s NICs; raises :class:`ProviderConfigError` for a region without one."""
        if isinstance(self.subnet_id, str):
            return self.subnet_id
        subnet = self.subnet_id.get(region)
        if not subnet:
            raise ProviderConfigError(
                f"Azure: no subnet for region {region}: add {region}=/subscriptions/.../subnets/<name> to "
                f"COSTOPT_AZURE_SUBNET_IDS (configured: {sorted(self.subnet_id)})"
            )
        return subnet

    def _cred(self) -> TokenCredential:
        if self._credential is None:
            from azure.identity import DefaultAzureCredential

            self._credential = DefaultAzureCredential()
        return self._credential

    def _kwargs(self) -> dict[str, Any]:
        kwargs = dict(self._client_kwargs)
        if self.base_url is not None:
            kwargs["base_url"] = self.base_url
        return kwargs

    @property
    def compute(self) -> Any:
        with self._lock:
            if self._compute is None:
                from azure.mgmt.compute import ComputeManagementClient

                self._compute = ComputeManagementClient(self._cred(), self.subscription_id, **self._kwargs())
            return self._compute

    @property
    def network(self) -> Any:
        with self._lock:
            if self._network is None:
                from azure.mgmt.network import NetworkManagementClient

                self._network = NetworkManagementClient(self._cred(), self.subscription_id, **self._kwargs())
            return self._network

    def _seen(self, inst: Instance) -> Instance:
        if inst.offer.market is Market.SPOT and TOKEN_TAG in inst.tags:
            with self._lock:
                self._spot_seen[inst.instance_id] = inst
        return inst

    def _get_vm(self, name: str) -> Any | None:
        try:
            return self.compute.virtual_machines.get(self.resource_group, name, expand="instanceView")
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise translate_error(exc, f"read VM {name} in {self.resource_group}") from exc

    # ------------------------------------------------------------------ launch

    def vm_parameters(self, spec: LaunchSpec, token: str, name: str, nic_id: str) -> cm.VirtualMachine:
        """The create-or-update body of the VM launched for ``spec`` with ``token``."""
        offer = spec.offer
        spot = offer.market is Market.SPOT
        zone = _zone_of(offer)
        script = custom_data_script(spec)
        user = self.admin_username
        properties = cm.VirtualMachineProperties(
            hardware_profile=cm.HardwareProfile(vm_size=offer.instance_type),
            storage_profile=cm.StorageProfile(
                image_reference=image_reference(spec.image or self.image),
                os_disk=cm.OSDisk(
                    create_option="FromImage",
                    delete_option="Delete",
                    managed_disk=cm.ManagedDiskParameters(storage_account_type=self.os_disk_type),
                ),
            ),
            os_profile=cm.OSProfile(
                computer_name=name,
                admin_username=user,
                custom_data=base64.b64encode(script.encode()).decode("ascii"),
                linux_configuration=cm.LinuxConfiguration(
                    disable_password_authentication=True,
                    ssh=cm.SshConfiguration(
                        public_keys=[
                            cm.SshPublicKey(path=f"/home/{user}/.ssh/authorized_keys", key_data=self.ssh_public_key)
                        ]
                    ),
                ),
            ),
            network_profile=cm.NetworkProfile(
                network_interfaces=[
                    cm.NetworkInterfaceReference(
                        id=nic_id,
                        properties=cm.NetworkInterfaceReferenceProperties(primary=True, delete_option="Delete"),
                    )
                ]
            ),
            # Boot diagnostics on managed storage: the serial console log ``output`` reads.
            diagnostics_profile=cm.DiagnosticsProfile(boot_diagnostics=cm.BootDiagnostics(enabled=True)),
            priority="Spot" if spot else "Regular",
            eviction_policy="Delete" if spot else None,
            billing_profile=cm.BillingProfile(max_price=-1) if spot else None,
        )
        return cm.VirtualMachine(
            location=offer.region, tags=launch_tags(spec, token), zones=[zone] if zone else None, properties=properties
        )

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        """Create (or find) the VM of ``idempotency_token``: its NIC, then the VM (Spot with eviction policy
        ``Delete`` and max price -1 for a spot offer, Regular otherwise) in the offer's zone when it has one.
        Raises ValueError for a bad spec or token (nothing created), or the typed errors of
        :func:`translate_error`."""
        _check_token(idempotency_token)
        offer = spec.offer
        if offer.cloud is not Cloud.AZURE:
            raise ValueError(f"AzureProvider cannot launch an offer of {offer.cloud.value}: {offer!r}")
        subnet = self.subnet_for(offer.region)
        name = vm_name(idempotency_token)
        existing = self._get_vm(name)
        if existing is not None:
            found = to_instance(existing)
            if found.tags.get(TOKEN_TAG) != idempotency_token:
                raise CloudError(
                    f"Azure: VM {name} in {self.resource_group} exists but is not the launch of token "
                    f"{idempotency_token!r} (its {TOKEN_TAG} tag is {found.tags.get(TOKEN_TAG)!r})"
                )
            log.info("launch %s: VM %s already exists (%s)", idempotency_token, name, found.state)
            return self._seen(found)
        nic_params = nm.NetworkInterface(
            location=offer.region,
            tags=launch_tags(spec, idempotency_token),
            properties=nm.NetworkInterfacePropertiesFormat(
                ip_configurations=[
                    nm.NetworkInterfaceIPConfiguration(
                        name="ipconfig1",
                        properties=nm.NetworkInterfaceIPConfigurationPropertiesFormat(subnet=nm.Subnet(id=subnet)),
                    )
                ]
            ),
        )
        what = f"launch {offer.instance_type} {offer.market.value} in {offer.region} {offer.zone}".rstrip()
        nic_id = (
            f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}"
            f"/providers/Microsoft.Network/networkInterfaces/{nic_name(name)}"
        )
        params = self.vm_parameters(spec, idempotency_token, name, nic_id)  # validates the spec before any call
        try:
            self.network.network_interfaces.begin_create_or_update(
                self.resource_group, nic_name(name), nic_params
            ).result()
            self.compute.virtual_machines.begin_create_or_update(self.resource_group, name, params).result()
        except AzureError as exc:
            raise translate_error(exc, what) from exc
        created = self._get_vm(name)
        if created is None:
            raise CloudError(f"Azure: VM {name} vanished right after it was created ({what})")
        with self._lock:
            self._deleted.pop(name, None)
        log.info("launch %s: created VM %s", idempotency_token, name)
        return self._seen(to_instance(created))

    # ------------------------------------------------------------------ describe, list

    def output(self, instance_id: str, *, tail: int | None = None) -> str:
        """The VM's serial console log from boot diagnostics (enabled on managed storage at launch):
        ``retrieve_boot_diagnostics_data`` gives a short-lived SAS URI of the log blob, which is read over
        HTTPS (trusting what the management clients trust, ``connection_verify``). The last ``tail`` lines
        (None: all); "" while Azure has no log yet. Raises :class:`NotFoundError` for a VM that does not
        exist."""
        if tail is not None and tail < 0:
            raise ValueError(f"tail must be >= 0 lines, got {tail}")
        try:
            data = self.compute.virtual_machines.retrieve_boot_diagnostics_data(
                self.resource_group, instance_id, sas_uri_expiration_time_in_minutes=5
            )
        except AzureError as exc:
            raise translate_error(exc, f"read the boot diagnostics of VM {instance_id}") from exc
        uri = getattr(data, "serial_console_log_blob_uri", None)
        if not uri:
            return ""
        import ssl

        import httpx

        verify: bool | ssl.SSLContext = True
        trust = self._client_kwargs.get("connection_verify", True)
        if isinstance(trust, str):  # a CA bundle file or folder, as azure-core takes it
            folder = Path(trust).is_dir()
            verify = ssl.create_default_context(capath=trust if folder else None, cafile=None if folder else trust)
        elif isinstance(trust, (bool, ssl.SSLContext)):
            verify = trust
        try:
            answer = httpx.get(uri, verify=verify, timeout=30.0)
        except httpx.HTTPError as exc:
            raise CloudError(f"Azure: could not read the serial console log of VM {instance_id}: {exc}") from exc
        if answer.status_code == 404:
            return ""  # no log written yet
        if answer.status_code != 200:
            raise CloudError(
                f"Azure: reading the serial console log of VM {instance_id} answered HTTP {answer.status_code}"
            )
        return tail_lines(answer.content.decode("utf-8", errors="replace"), tail)

    def describe(self, instance_id: str) -> Instance:
        """The VM named ``instance_id``; a VM costopt deleted is TERMINATED, a Spot VM that vanished otherwise
        PREEMPTED. Raises :class:`NotFoundError` for a VM never seen."""
        vm = self._get_vm(instance_id)
        if vm is not None:
            return self._seen(to_instance(vm))
        with self._lock:
            deleted = self._deleted.get(instance_id)
            spot = self._spot_seen.get(instance_id)
        if deleted is not None:
            return replace(deleted, state=InstanceState.TERMINATED)
        if spot is not None:
            return replace(spot, state=InstanceState.PREEMPTED)
        raise NotFoundError(f"Azure: VM {instance_id} does not exist in resource group {self.resource_group}")

    def list(self, tags: Mapping[str, str]) -> builtins.list[Instance]:
        """costopt's VMs (``costopt:token`` tag) of the resource group carrying every ``tags`` item exactly,
        in any state (stopped and deallocated ones included), oldest first. Deleted VMs are not listed."""
        try:
            vms = builtins.list(self.compute.virtual_machines.list(self.resource_group, expand="instanceView"))
        except AzureError as exc:
            raise translate_error(exc, f"list VMs of {self.resource_group}") from exc
        out = []
        for vm in vms:
            vm_tags = dict(vm.tags or {})
            if TOKEN_TAG in vm_tags and tags_match(vm_tags, tags):
                out.append(self._seen(to_instance(vm)))
        return sorted(out, key=lambda i: i.launched_at or datetime.min.replace(tzinfo=UTC))

    # ------------------------------------------------------------------ terminate

    def terminate(self, instance_id: str) -> None:
        """Delete the VM ``instance_id`` and its NIC. Idempotent: a VM or NIC already gone is fine. Raises
        :class:`CloudError` (nothing done) for a VM without the ``costopt:token`` tag."""
        vm = self._get_vm(instance_id)
        if vm is not None:
            inst = to_instance(vm)
            if TOKEN_TAG not in inst.tags:
                raise CloudError(
                    f"Azure: refusing to delete VM {instance_id}: it has no {TOKEN_TAG} tag, so costopt did not "
                    "create it. Delete it yourself if it really is costopt's."
                )
            with self._lock:
                self._deleted[instance_id] = inst
            self._delete(lambda: self.compute.virtual_machines.begin_delete(self.resource_group, instance_id))
        self._delete(lambda: self.network.network_interfaces.begin_delete(self.resource_group, nic_name(instance_id)))
        log.info("terminate %s: deleted (VM %s)", instance_id, "found" if vm is not None else "already gone")

    def _delete(self, begin: Callable[[], Any]) -> None:
        try:
            begin().result()
        except ResourceNotFoundError:
            return
        except AzureError as exc:
            if getattr(exc, "status_code", None) == 404:
                return
            raise translate_error(exc, f"delete a resource of {self.resource_group}") from exc

    # ------------------------------------------------------------------ interruptions

    def acknowledge(self, interruptions: Sequence[Interruption]) -> None:
        """Nothing to do: evictions are read from the VMs and Scheduled Events, not a queue (see
        ``CloudProvider.acknowledge``)."""

    def interruptions(self, since: datetime) -> builtins.list[Interruption]:
        """Scheduled Events ``Preempt`` notices whose deadline is not before ``since`` (each event once per
        provider object), then costopt's Spot VMs found evicted (each once, at the time of the call)."""
        since = utc(since)
        now = utc(self._clock())
        found: builtins.list[Interruption] = []
        if self._scheduled_events is not None:
            try:
                doc = self._scheduled_events()
            except OSError as exc:
                raise CloudError(f"Azure: cannot read Scheduled Events: {exc}") from exc
            for notice in parse_scheduled_events(doc, noticed_at=now):
                key = (notice.instance_id, f"notice@{notice.deadline}")
                if notice.deadline is not None and notice.deadline >= since and self._first(key):
                    found.append(notice)
        live = {i.instance_id: i for i in self.list({})}
        with self._lock:
            vanished = [n for n in self._spot_seen if n not in live and n not in self._deleted]
        for name in [n for n, i in live.items() if i.state is InstanceState.PREEMPTED] + vanished:
            if self._first((name, "preempted")):
                found.append(Interruption(instance_id=name, noticed_at=now, deadline=None, kind="preempted"))
        return found

    def _first(self, key: tuple[str, str]) -> bool:
        with self._lock:
            if key in self._reported:
                return False
            self._reported.add(key)
            return True


__all__: Sequence[str] = (
    "AzureProvider",
    "custom_data_script",
    "imds_scheduled_events",
    "map_state",
    "parse_scheduled_events",
    "translate_error",
    "vm_name",
)
