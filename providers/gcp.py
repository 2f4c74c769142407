"""The GCP provider: Compute Engine Spot and on-demand VMs behind :class:`costopt.cloud.CloudProvider`.

How each contract of the protocol is kept:

- Instance ids are ``"<zone>/<name>"`` (Compute Engine names are unique per project and zone; the
  project is the provider's).
- ``launch(spec, token)`` creates at most one instance per token. The instance name is derived from the
  token (``costopt-<first 24 hex digits of sha256(token)>``, see :func:`instance_name`), so GCP itself
  refuses a second instance of that name in the zone; before inserting, the provider looks that name up
  and returns the instance it finds, in any state. The insert also carries a ``request_id`` (a UUID5 of
  the token, :func:`request_id_for`), which GCP uses to answer a retried request with the operation
  already started. An insert answered "already exists" (a concurrent launch) returns the existing
  instance. A token whose instance was deleted or preempted launches again (the name is free): use a
  fresh token for a fresh launch anyway.
- ``terminate(instance_id)`` is idempotent: an unknown or already deleted instance is not an error.
  It refuses (:class:`CloudError`) to delete an instance without the ``costopt-token`` label.
- ``list(tags)`` only returns instances launched by costopt (label ``costopt-token`` present), and every
  one of them that exists, stopped ones (status ``TERMINATED``) included; a deleted instance no longer
  exists and is not listed (the rule of :mod:`costopt.cloud`).
- ``interruptions(since)`` reads ``compute.instances.preempted`` zone operations (GCP's own record of
  each preemption; a Spot VM gets ~30 s notice inside the guest only) of the watched zones.

Zones: the provider watches (lists, reads preemptions in, launches regional offers in) the configured
``zones``; without any, every zone of the configured ``regions``, or of the whole project without
those, read once from the Zones API. ``launch`` refuses a zone outside them, since a restarted provider
would not find its instance.

Labels: GCP label keys and values are lowercase ``[a-z0-9_-]`` of at most 63 characters (keys start
with a letter). :func:`sanitize_label` lower-cases, replaces any other character with ``_`` and, when
something had to be changed or cut, appends a short hash of the original so two different values
never map to the same label. ``spec.tags`` keys and values are sanitized that way (``costopt:job`` ->
``costopt_job_<hash>``); the exact original tags are also stored in the metadata item ``costopt-tags``
(JSON) and are what :attr:`Instance.tags` returns; ``list`` filters on the labels server-side and then
compares the exact tags.

Instance states map to :class:`InstanceState`: ``PROVISIONING``/``STAGING``/``REPAIRING``/``PENDING`` ->
PENDING, ``RUNNING`` -> RUNNING, ``STOPPING``/``SUSPENDING``/``PENDING_STOP``/``DEPROVISIONING`` ->
STOPPING, and ``TERMINATED``/``STOPPED``/``SUSPENDED`` -> STOPPED: on GCP, ``TERMINATED`` means
*stopped* (the VM and its disks still exist and can be started again), never deleted. A Spot VM stopped
or stopping because GCP preempted it (a ``compute.instances.preempted`` operation targets it) is
PREEMPTED. A deleted instance does not exist any more: ``describe`` raises :class:`NotFoundError`
(costopt's own terminations are deletions). Spot VMs launched here use
``instance_termination_action=DELETE``, so a preempted one usually disappears: ``describe`` then raises
:class:`NotFoundError` and ``interruptions`` reports the preemption.

Errors are translated: ``ZONE_RESOURCE_POOL_EXHAUSTED*``/stockout -> :class:`CapacityError`,
``QUOTA_EXCEEDED`` -> :class:`QuotaError`, HTTP 401/403 and credential errors -> :class:`AuthError`,
HTTP 404 -> :class:`NotFoundError`, anything else -> :class:`CloudError`.

Credentials: Application Default Credentials unless ``credentials`` is given. The zone operations
client is built with the same endpoint and credentials, or injected (``operations_client``): the one
``google-cloud-compute``'s extended operations create internally ignores a custom endpoint, so the
provider never uses those (it calls ``insert_unary``/``delete_unary`` and polls itself). The zones
client likewise. :meth:`GcpProvider.from_settings` builds the provider from the ``COSTOPT_GCP_*``
settings (docs/providers.md).
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import requests
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import Credentials
from google.cloud import compute_v1
from google.protobuf import json_format

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
from costopt.domain import Cloud, Market, OfferKey, normalize_accelerator, parse_utc, utc
from costopt.errors import BadRecord
from costopt.settings import Settings
from pricing.gcp import SHAPES_BY_NAME, MachineShape, n1_gpu_instance_name
from providers.boot import boot_script
from providers.console import tail_lines

log = logging.getLogger("costopt.providers.gcp")

TOKEN_LABEL = "costopt-token"
"""Label carrying the (sanitized) idempotency token; marks costopt's instances."""
TOKEN_METADATA = "costopt-token"
TAGS_METADATA = "costopt-tags"
INSTANCE_TYPE_METADATA = "costopt-instance-type"
STARTUP_SCRIPT_METADATA = "startup-script"

DEFAULT_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11-py310"
"""Boot image when neither ``LaunchSpec.image`` nor the constructor names one: Google's public Deep
Learning VM image family with CUDA (installs the NVIDIA driver on first boot)."""

PREEMPTED_OPERATION = "compute.instances.preempted"
MAX_LABEL_LENGTH = 63
MAX_METADATA_BYTES = 256 * 1024
"""Compute Engine's limit on one instance's metadata (all items)."""
REQUEST_ID_NAMESPACE = uuid.UUID("6f1d1d4e-5a43-4c55-9b59-3d0b1b7d0c11")
"""Namespace of :func:`request_id_for` (any fixed UUID: it only has to stay the same)."""

_LABEL_OK = re.compile(r"[a-z0-9_-]")
_CAPACITY_MARKERS = ("ZONE_RESOURCE_POOL_EXHAUSTED", "STOCKOUT", "DOES NOT HAVE ENOUGH RESOURCES")
_QUOTA_MARKERS = ("QUOTA_EXCEEDED", "QUOTAEXCEEDED")
_PENDING = frozenset({"PROVISIONING", "STAGING", "REPAIRING", "PENDING"})
_STOPPING = frozenset({"STOPPING", "SUSPENDING", "PENDING_STOP", "DEPROVISIONING"})
_STOPPED = frozenset({"TERMINATED", "STOPPED", "SUSPENDED"})
"""GCP's ``TERMINATED`` is a *stopped* VM (it still exists, with its disks); ``STOPPED`` is its old alias."""
_CALL_ERRORS: tuple[type[Exception], ...] = (
    api_exceptions.GoogleAPIError,
    auth_exceptions.GoogleAuthError,
    requests.RequestException,
    json_format.ParseError,
)


def _utcnow() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------- names, labels, script


def instance_name(token: str) -> str:
    """The instance name of the launch with ``token``: ``costopt-`` + 24 hex digits of its sha256 (a valid
    Compute Engine name: lowercase, starts with a letter, at most 63 characters)."""
    return "costopt-" + hashlib.sha256(token.encode()).hexdigest()[:24]


def request_id_for(token: str) -> str:
    """The insert ``request_id`` of ``token``: a UUID5, the same for every retry of that launch."""
    return str(uuid.uuid5(REQUEST_ID_NAMESPACE, token))


def sanitize_label(text: str, *, key: bool = False) -> str:
    """``text`` as a GCP label value (or key: ``key=True``, which must also start with a letter and not be
    empty). Lower-cased, other characters replaced by ``_``; if anything changed besides case, or the
    result would exceed 63 characters, ``_<8 hex digits of sha256(text)>`` is appended (after cutting),
    so distinct inputs stay distinct."""
    lowered = text.lower()
    clean = "".join(c if _LABEL_OK.fullmatch(c) else "_" for c in lowered)
    changed = clean != lowered
    if key and not clean[:1].isalpha():
        clean, changed = "k" + clean, True
    if changed or len(clean) > MAX_LABEL_LENGTH:
        suffix = "_" + hashlib.sha256(text.encode()).hexdigest()[:8]
        clean = clean[: MAX_LABEL_LENGTH - len(suffix)] + suffix
    return clean


def launch_labels(spec: LaunchSpec, token: str) -> dict[str, str]:
    """The labels of an instance launched for ``spec`` with ``token``: sanitized ``spec.tags`` plus
    ``costopt-token``."""
    labels = {sanitize_label(k, key=True): sanitize_label(v) for k, v in spec.tags.items()}
    labels[TOKEN_LABEL] = sanitize_label(token)
    return labels


def startup_script(spec: LaunchSpec) -> str:
    """The startup script starting ``spec``'s job (:func:`providers.boot.boot_script`). Raises ValueError
    for an empty command, an env name that is not a shell identifier or a NUL character."""
    return boot_script(spec, max_bytes=MAX_METADATA_BYTES, limit_name="GCP's metadata")


def shape_for(instance_type: str) -> MachineShape:
    """The machine shape of an offer's instance type (``n1-standard-8+v100x1``, ``a2-highgpu-1g``, ...).
    Raises ValueError for a name :data:`pricing.gcp.SHAPES_BY_NAME` does not know."""
    shape = SHAPES_BY_NAME.get(instance_type)
    if shape is None:
        raise ValueError(
            f"unknown GCP instance type {instance_type!r}: expected an N1+GPU shape such as "
            "'n1-standard-8+v100x1' or an A2/A3/G2 machine type (pricing.gcp.MACHINE_SHAPES)"
        )
    return shape


def needs_explicit_accelerators(shape: MachineShape) -> bool:
    """N1 machine types take GPUs as guest accelerators; A2/A3/G2 machine types have them built in."""
    return shape.family == "n1"


# --------------------------------------------------------------------------- errors


def _error_text(exc: BaseException) -> str:
    parts = [str(exc)]
    for attr in ("errors", "reasons"):
        for item in getattr(exc, attr, None) or []:
            parts.append(json.dumps(item, default=str) if isinstance(item, dict) else str(item))
    return " ".join(parts)


def _classify(code: int | None, text: str, what: str) -> CloudError:
    upper = text.upper()
    if any(m in upper for m in _CAPACITY_MARKERS):
        return CapacityError(
            f"{what}. GCP has no capacity for this machine type in this zone now: try another zone, machine "
            "type or market, and this one again later."
        )
    if any(m in upper for m in _QUOTA_MARKERS):
        return QuotaError(
            f"{what}. The project's quota is exhausted (GPUS_ALL_REGIONS, the region's "
            "PREEMPTIBLE_NVIDIA_*_GPUS / NVIDIA_*_GPUS or CPUS): request an increase or launch elsewhere."
        )
    if code in (401, 403):
        return AuthError(
            f"{what}. Check Application Default Credentials (`gcloud auth application-default login` or "
            "GOOGLE_APPLICATION_CREDENTIALS) and that they hold compute.instances.create/get/list/delete, "
            "compute.zoneOperations.get/list and iam.serviceAccounts.actAs on the instance's service account."
        )
    if code == 404:
        return NotFoundError(f"{what}. The resource does not exist (any more) in this project and zone.")
    return CloudError(f"{what}. GCP refused or failed the request.")


def translate_error(exc: BaseException, action: str) -> CloudError:
    """The project's typed error for a client error raised while doing ``action``."""
    what = f"GCP: cannot {action}: {exc}"
    if isinstance(exc, auth_exceptions.GoogleAuthError):
        return AuthError(f"{what}. No usable Application Default Credentials were found or they were refused.")
    code = getattr(exc, "code", None)
    return _classify(code if isinstance(code, int) else None, _error_text(exc), what)


def operation_error(op: compute_v1.Operation, action: str) -> CloudError | None:
    """The typed error of a finished operation that failed, or None when it succeeded."""
    errors = list(op.error.errors) if "error" in op else []
    if not errors:
        return None
    text = "; ".join(f"{e.code}: {e.message}" for e in errors)
    status = int(op.http_error_status_code) if "http_error_status_code" in op else None
    return _classify(status, text, f"GCP: cannot {action}: {text}")


# --------------------------------------------------------------------------- reading instances


def _zone_of(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _region_of_zone(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _metadata(raw: compute_v1.Instance) -> dict[str, str]:
    if "metadata" not in raw:
        return {}
    return {item.key: item.value for item in raw.metadata.items}


def _time(text: str) -> datetime | None:
    if not text:
        return None
    try:
        return parse_utc(text)
    except BadRecord:
        return None


def is_spot(raw: compute_v1.Instance) -> bool:
    if "scheduling" not in raw:
        return False
    return raw.scheduling.provisioning_model == "SPOT" or bool(raw.scheduling.preemptible)


def instance_tags(raw: compute_v1.Instance) -> dict[str, str]:
    """The exact tags costopt launched ``raw`` with (metadata ``costopt-tags``), else its labels."""
    stored = _metadata(raw).get(TAGS_METADATA)
    if stored:
        try:
            tags = json.loads(stored)
            if isinstance(tags, dict):
                return {str(k): str(v) for k, v in tags.items()}
        except json.JSONDecodeError:
            log.warning("instance %s: metadata %s is not JSON; using its labels", raw.name, TAGS_METADATA)
    return dict(raw.labels)


def _instance_type(raw: compute_v1.Instance) -> str:
    stored = _metadata(raw).get(INSTANCE_TYPE_METADATA)
    if stored:
        return stored
    machine = _zone_of(raw.machine_type)
    accs = list(raw.guest_accelerators)
    if machine.startswith("n1-") and accs:
        acc = accs[0]
        name = n1_gpu_instance_name(_zone_of(acc.accelerator_type), int(acc.accelerator_count))
        if name in SHAPES_BY_NAME and SHAPES_BY_NAME[name].machine_type == machine:
            return name
        return f"{machine}+{normalize_accelerator(_zone_of(acc.accelerator_type))}x{acc.accelerator_count}"
    return machine


def map_status(status: str, *, preempted: bool = False) -> InstanceState:
    """The :class:`InstanceState` of a Compute Engine instance status; ``preempted``: GCP preempted it."""
    if status in _PENDING:
        return InstanceState.PENDING
    if status == "RUNNING":
        return InstanceState.RUNNING
    if preempted and (status in _STOPPING or status in _STOPPED):
        return InstanceState.PREEMPTED
    if status in _STOPPING:
        return InstanceState.STOPPING
    if status in _STOPPED:
        return InstanceState.STOPPED
    raise CloudError(f"GCP reported an instance in an unknown status {status!r}")


def to_instance(raw: compute_v1.Instance, zone: str, *, preempted: bool = False) -> Instance:
    """An :class:`Instance` from one Compute Engine instance resource of ``zone``."""
    state = map_status(raw.status, preempted=preempted)
    market = Market.SPOT if is_spot(raw) else Market.ON_DEMAND
    terminated_at = _time(raw.last_stop_timestamp) if state is InstanceState.PREEMPTED else None
    try:
        offer = OfferKey(Cloud.GCP, _region_of_zone(zone), zone, _instance_type(raw), market)
    except BadRecord as exc:
        raise CloudError(f"GCP: instance {zone}/{raw.name} has no readable machine type: {exc}") from exc
    return Instance(
        instance_id=f"{zone}/{raw.name}",
        offer=offer,
        state=state,
        tags=instance_tags(raw),
        launched_at=_time(raw.creation_timestamp),
        terminated_at=terminated_at,
    )


def split_instance_id(instance_id: str) -> tuple[str, str]:
    """``(zone, name)`` of an id ``"<zone>/<name>"``; raises :class:`NotFoundError` for anything else."""
    zone, sep, name = instance_id.partition("/")
    if not sep or not zone or not name or "/" in name:
        raise NotFoundError(f"GCP: {instance_id!r} is not a costopt GCP instance id ('<zone>/<name>')")
    return zone, name


def _label_filter(labels: Mapping[str, str]) -> str:
    parts = [f"(labels.{TOKEN_LABEL}:*)"]
    parts += [f'(labels.{k} = "{v}")' for k, v in sorted(labels.items())]
    return " ".join(parts)


# --------------------------------------------------------------------------- the provider


class GcpProvider:
    """Compute Engine behind :class:`costopt.cloud.CloudProvider` (``name == "gcp"``); see the module
    docstring for the contracts kept."""

    name = "gcp"

    def __init__(
        self,
        project: str,
        zones: Sequence[str] = (),
        *,
        regions: Sequence[str] = (),
        image: str = DEFAULT_IMAGE,
        network: str = "global/networks/default",
        subnetwork: str | None = None,
        external_ip: bool = True,
        service_account_email: str | None = None,
        boot_disk_gb: int = 200,
        endpoint: str | None = None,
        credentials: Credentials | None = None,
        instances_client: compute_v1.InstancesClient | None = None,
        operations_client: compute_v1.ZoneOperationsClient | None = None,
        zones_client: compute_v1.ZonesClient | None = None,
        operation_timeout_s: float = 300.0,
        poll_interval_s: float = 2.0,
        request_timeout_s: float = 30.0,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        """
        - ``project``: the GCP project instances are launched in.
        - ``zones``: the zones watched (``list``, ``interruptions``) and launched in; offers without a zone
          launch in the first watched zone of their region. Empty: every zone of ``regions`` (or of the
          project when ``regions`` is empty too), read from the Zones API at first need; ``list`` then
          uses the aggregated list (one call).
        - ``image``: boot disk image (``LaunchSpec.image`` overrides); ``boot_disk_gb``: its size.
        - ``network``/``subnetwork``/``external_ip``: the instance's one network interface.
        - ``service_account_email``: the job's identity (e.g. to reach the checkpoint bucket), with the
          cloud-platform scope; None: no service account.
        - ``endpoint``/``credentials``: Compute Engine API endpoint (``host:port`` or URL; None: Google's)
          and credentials (None: ADC); both used to build clients not injected.
        - ``instances_client``/``operations_client``/``zones_client``: injected clients (REST transport).
        - ``operation_timeout_s``/``poll_interval_s``: how long ``launch`` waits for the insert operation.
        - ``clock``: now, for preemption times GCP does not report.
        """
        if not project:
            raise ValueError("GcpProvider needs a project (COSTOPT_GCP_PROJECT)")
        self.project = project
        self.zones: tuple[str, ...] = tuple(dict.fromkeys(zones))
        self.regions: tuple[str, ...] = tuple(dict.fromkeys(regions))
        self.image = image
        self.network = network
        self.subnetwork = subnetwork
        self.external_ip = external_ip
        self.service_account_email = service_account_email
        self.boot_disk_gb = boot_disk_gb
        self.operation_timeout_s = operation_timeout_s
        self.poll_interval_s = poll_interval_s
        self.request_timeout_s = request_timeout_s
        self._clock = clock
        options = ClientOptions(api_endpoint=endpoint) if endpoint else None
        self._instances = instances_client or compute_v1.InstancesClient(
            credentials=credentials, transport="rest", client_options=options
        )
        self._operations = operations_client or compute_v1.ZoneOperationsClient(
            credentials=credentials, transport="rest", client_options=options
        )
        self._zones_client = zones_client or compute_v1.ZonesClient(
            credentials=credentials, transport="rest", client_options=options
        )
        self._lock = threading.Lock()
        self._discovered: tuple[str, ...] | None = None
        self._reported: set[str] = set()

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> GcpProvider:
        """Built from :class:`Settings`: ``gcp_project`` (required), ``gcp_zones`` (None: the zones of
        ``gcp_regions``, or every zone), ``gcp_image`` (None: :data:`DEFAULT_IMAGE`), ``gcp_network``,
        ``gcp_subnetwork``, ``gcp_external_ip``, ``gcp_service_account_email``, ``gcp_compute_endpoint`` and
        ``http_timeout_s`` (request timeout). ``overrides`` (constructor arguments, e.g. ``credentials``)
        win. Raises :class:`ProviderConfigError` without a project."""
        if not settings.gcp_project and not overrides.get("project"):
            raise ProviderConfigError("GCP: no project: set COSTOPT_GCP_PROJECT to the project to launch in")
        kwargs: dict[str, Any] = {
            "project": settings.gcp_project,
            "zones": settings.gcp_zones or (),
            "regions": () if settings.gcp_zones else (settings.gcp_regions or ()),
            "image": settings.gcp_image or DEFAULT_IMAGE,
            "network": settings.gcp_network,
            "subnetwork": settings.gcp_subnetwork,
            "external_ip": settings.gcp_external_ip,
            "service_account_email": settings.gcp_service_account_email,
            "endpoint": settings.gcp_compute_endpoint,
            "request_timeout_s": settings.http_timeout_s,
        }
        kwargs.update(overrides)
        return cls(**kwargs)

    # ------------------------------------------------------------------ plumbing

    def _project_zones(self) -> tuple[str, ...]:
        """Every zone of the project that is up, from the Zones API (read once)."""
        with self._lock:
            if self._discovered is not None:
                return self._discovered
        request = compute_v1.ListZonesRequest(project=self.project)
        try:
            found = sorted(
                z.name
                for z in self._zones_client.list(request=request, timeout=self.request_timeout_s)
                if not z.status or z.status == "UP"
            )
        except _CALL_ERRORS as exc:
            raise translate_error(exc, f"list the zones of project {self.project}") from exc
        with self._lock:
            self._discovered = tuple(found)
        return self._discovered

    def _all_zones(self) -> builtins.list[str]:
        """The watched zones: the configured ones, else those of the configured regions, else every zone."""
        if self.zones:
            return list(self.zones)
        zones = self._project_zones()
        if self.regions:
            return [z for z in zones if _region_of_zone(z) in self.regions]
        return list(zones)

    def _zone_for(self, offer: OfferKey) -> str:
        """The zone to launch ``offer`` in: its own (if watched), else the first watched zone of its region."""
        if offer.zone:
            if self.zones and offer.zone not in self.zones:
                raise ProviderConfigError(
                    f"GCP: zone {offer.zone} is not one of the provider's zones {list(self.zones)}: add it to "
                    "COSTOPT_GCP_ZONES (list and interruptions only look there)"
                )
            if not self.zones and self.regions and _region_of_zone(offer.zone) not in self.regions:
                raise ProviderConfigError(
                    f"GCP: zone {offer.zone} is outside the provider's regions {list(self.regions)}: add "
                    f"{_region_of_zone(offer.zone)} to COSTOPT_GCP_REGIONS (or the zone to COSTOPT_GCP_ZONES)"
                )
            return offer.zone
        for zone in self._all_zones():
            if _region_of_zone(zone) == offer.region:
                return zone
        raise ProviderConfigError(
            f"GCP: offer {offer!r} has no zone and no watched zone is in {offer.region}: add one of its zones to "
            "COSTOPT_GCP_ZONES (or the region to COSTOPT_GCP_REGIONS), or price offers per zone"
        )

    def _get(self, zone: str, name: str) -> compute_v1.Instance | None:
        try:
            return self._instances.get(project=self.project, zone=zone, instance=name, timeout=self.request_timeout_s)
        except api_exceptions.NotFound:
            return None
        except _CALL_ERRORS as exc:
            raise translate_error(exc, f"get instance {zone}/{name}") from exc

    def _wait(self, op: compute_v1.Operation, zone: str, action: str) -> compute_v1.Operation:
        """Poll ``op`` through the operations client until DONE; raises its typed error, or
        :class:`CloudError` after ``operation_timeout_s``."""
        deadline = time.monotonic() + self.operation_timeout_s
        while op.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() >= deadline:
                raise CloudError(
                    f"GCP: {action}: operation {op.name} not done after {self.operation_timeout_s:.0f} s; it may "
                    "still complete: launching again with the same token is safe"
                )
            time.sleep(self.poll_interval_s)
            try:
                op = self._operations.get(
                    project=self.project, zone=zone, operation=op.name, timeout=self.request_timeout_s
                )
            except _CALL_ERRORS as exc:
                raise translate_error(exc, f"{action}: read operation {op.name}") from exc
        err = operation_error(op, action)
        if err is not None:
            raise err
        return op

    def _is_preempted(self, zone: str, raw: compute_v1.Instance) -> bool:
        if not is_spot(raw) or raw.status in ("RUNNING", *_PENDING):
            return False
        with self._lock:
            if f"{zone}/{raw.name}" in self._reported:
                return True
        flt = f'(operationType = "{PREEMPTED_OPERATION}") (targetId = "{raw.id}")' if raw.id else None
        return any(_zone_of(op.target_link) == raw.name for op in self._preempted_ops(zone, flt))

    def _to_instance(self, zone: str, raw: compute_v1.Instance) -> Instance:
        return to_instance(raw, zone, preempted=self._is_preempted(zone, raw))

    # ------------------------------------------------------------------ launch

    def instance_resource(self, spec: LaunchSpec, token: str, zone: str) -> compute_v1.Instance:
        """The Compute Engine instance resource launched for ``spec`` with ``token`` in ``zone``."""
        shape = shape_for(spec.offer.instance_type)
        metadata = {
            STARTUP_SCRIPT_METADATA: startup_script(spec),
            TOKEN_METADATA: token,
            TAGS_METADATA: json.dumps(dict(spec.tags), sort_keys=True),
            INSTANCE_TYPE_METADATA: spec.offer.instance_type,
        }
        size = sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items())
        if size > MAX_METADATA_BYTES:
            raise ValueError(f"instance metadata is {size} bytes, above GCP's {MAX_METADATA_BYTES}")
        interface = compute_v1.NetworkInterface(network=self.network)
        if self.subnetwork:
            interface.subnetwork = self.subnetwork
        if self.external_ip:
            interface.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        resource = compute_v1.Instance(
            name=instance_name(token),
            machine_type=f"zones/{zone}/machineTypes/{shape.machine_type}",
            labels=launch_labels(spec, token),
            metadata=compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in metadata.items()]),
            disks=[
                compute_v1.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=compute_v1.AttachedDiskInitializeParams(
                        source_image=spec.image or self.image, disk_size_gb=self.boot_disk_gb
                    ),
                )
            ],
            network_interfaces=[interface],
            scheduling=compute_v1.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=False),
        )
        if spec.offer.market is Market.SPOT:
            resource.scheduling = compute_v1.Scheduling(
                provisioning_model="SPOT",
                instance_termination_action="DELETE",
                on_host_maintenance="TERMINATE",
                automatic_restart=False,
            )
        if needs_explicit_accelerators(shape):
            resource.guest_accelerators = [
                compute_v1.AcceleratorConfig(
                    accelerator_type=f"projects/{self.project}/zones/{zone}/acceleratorTypes/{shape.accelerator_type}",
                    accelerator_count=shape.gpu_count,
                )
            ]
        if self.service_account_email:
            resource.service_accounts = [
                compute_v1.ServiceAccount(
                    email=self.service_account_email, scopes=["https://www.googleapis.com/auth/cloud-platform"]
                )
            ]
        return resource

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        """Launch one instance of ``spec.offer`` (Spot: deleted on preemption; on-demand otherwise), or
        return the instance already launched for ``idempotency_token``. Waits for the insert operation.

        Raises ValueError for a bad spec or token (nothing launched), :class:`CapacityError`,
        :class:`QuotaError`, :class:`AuthError`, :class:`NotFoundError` or :class:`CloudError`.
        """
        if not idempotency_token:
            raise ValueError("idempotency token must not be empty")
        offer = spec.offer
        if offer.cloud is not Cloud.GCP:
            raise ValueError(f"GcpProvider cannot launch an offer of {offer.cloud.value}: {offer!r}")
        zone = self._zone_for(offer)
        resource = self.instance_resource(spec, idempotency_token, zone)
        name = resource.name
        existing = self._get(zone, name)
        if existing is not None:
            log.info("launch: token %s already launched %s/%s (%s)", idempotency_token, zone, name, existing.status)
            return self._to_instance(zone, existing)
        action = f"launch {offer.instance_type} {offer.market.value} in {zone}"
        try:
            op = self._instances.insert_unary(
                request=compute_v1.InsertInstanceRequest(
                    project=self.project,
                    zone=zone,
                    instance_resource=resource,
                    request_id=request_id_for(idempotency_token),
                ),
                timeout=self.request_timeout_s,
            )
        except api_exceptions.Conflict:
            found = self._get(zone, name)
            if found is None:
                raise CloudError(f"GCP: {action}: {name} exists but cannot be read; retry") from None
            log.info("launch: %s/%s was created concurrently for token %s", zone, name, idempotency_token)
            return self._to_instance(zone, found)
        except _CALL_ERRORS as exc:
            err = translate_error(exc, action)
            log.warning("%s failed: %s", action, err)
            raise err from exc
        try:
            self._wait(op, zone, action)
        except CloudError as err:
            log.warning("%s failed: %s", action, err)
            raise
        created = self._get(zone, name)
        if created is None:
            raise NotFoundError(f"GCP: {action}: the insert finished but {zone}/{name} is gone (preempted at once?)")
        log.info("launched %s/%s: %s (token %s)", zone, name, action, idempotency_token)
        return self._to_instance(zone, created)

    # ------------------------------------------------------------------ describe, list, terminate

    def describe(self, instance_id: str) -> Instance:
        """The instance as GCP reports it now; :class:`NotFoundError` when it does not exist (any more)."""
        zone, name = split_instance_id(instance_id)
        try:
            raw = self._instances.get(project=self.project, zone=zone, instance=name, timeout=self.request_timeout_s)
        except _CALL_ERRORS as exc:
            raise translate_error(exc, f"describe {instance_id}") from exc
        return self._to_instance(zone, raw)

    def _list_raw(self, flt: str) -> Iterable[tuple[str, compute_v1.Instance]]:
        if not self.zones:
            request = compute_v1.AggregatedListInstancesRequest(project=self.project, filter=flt)
            for scope, scoped in self._instances.aggregated_list(request=request, timeout=self.request_timeout_s):
                zone = scope.removeprefix("zones/")
                if scope.startswith("zones/") and (not self.regions or _region_of_zone(zone) in self.regions):
                    for raw in scoped.instances:
                        yield zone, raw
            return
        for zone in self.zones:
            request_z = compute_v1.ListInstancesRequest(project=self.project, zone=zone, filter=flt)
            for raw in self._instances.list(request=request_z, timeout=self.request_timeout_s):
                yield zone, raw

    def list(self, tags: Mapping[str, str]) -> builtins.list[Instance]:
        """costopt's instances in the watched zones carrying every ``tags`` key with exactly its value, in
        any state (stopped ones included), oldest first. Deleted instances no longer exist: not listed."""
        labels = {sanitize_label(k, key=True): sanitize_label(v) for k, v in tags.items()}
        out: builtins.list[Instance] = []
        try:
            for zone, raw in self._list_raw(_label_filter(labels)):
                if TOKEN_LABEL not in raw.labels:
                    continue
                inst = self._to_instance(zone, raw)
                if tags_match(inst.tags, tags):
                    out.append(inst)
        except _CALL_ERRORS as exc:
            raise translate_error(exc, f"list instances tagged {dict(tags)}") from exc
        return sorted(out, key=lambda i: i.launched_at or datetime.min.replace(tzinfo=UTC))

    def terminate(self, instance_id: str) -> None:
        """Delete ``instance_id``; idempotent (an unknown or deleted instance is left alone). Raises
        :class:`CloudError` for an instance costopt did not launch, typed errors when GCP refuses."""
        zone, name = split_instance_id(instance_id)
        raw = self._get(zone, name)
        if raw is None:
            log.info("terminate %s: not found, nothing to do", instance_id)
            return
        if TOKEN_LABEL not in raw.labels:
            raise CloudError(
                f"GCP: refusing to delete {instance_id}: it has no {TOKEN_LABEL} label, so costopt did not launch it"
            )
        try:
            op = self._instances.delete_unary(
                project=self.project, zone=zone, instance=name, timeout=self.request_timeout_s
            )
        except api_exceptions.NotFound:
            log.info("terminate %s: gone meanwhile", instance_id)
            return
        except _CALL_ERRORS as exc:
            raise translate_error(exc, f"terminate {instance_id}") from exc
        err = operation_error(op, f"terminate {instance_id}")
        if err is not None and not isinstance(err, NotFoundError):
            raise err
        log.info("terminate %s: requested (was %s)", instance_id, raw.status)

    def output(self, instance_id: str, *, tail: int | None = None) -> str:
        """The instance's serial console (port 1, where the boot script and the job write) as GCP keeps it
        (``get_serial_port_output``: the most recent 1 MB), the last ``tail`` lines (None: all). Raises
        :class:`NotFoundError` when the instance does not exist (any more)."""
        if tail is not None and tail < 0:
            raise ValueError(f"tail must be >= 0 lines, got {tail}")
        zone, name = split_instance_id(instance_id)
        try:
            request = compute_v1.GetSerialPortOutputInstanceRequest(
                project=self.project, zone=zone, instance=name, port=1
            )
            answer = self._instances.get_serial_port_output(request=request, timeout=self.request_timeout_s)
        except _CALL_ERRORS as exc:
            raise translate_error(exc, f"read the serial console of {instance_id}") from exc
        return tail_lines(answer.contents or "", tail)

    # ------------------------------------------------------------------ interruptions

    def _preempted_ops(self, zone: str, flt: str | None = None) -> builtins.list[compute_v1.Operation]:
        request = compute_v1.ListZoneOperationsRequest(
            project=self.project, zone=zone, filter=flt or f'operationType = "{PREEMPTED_OPERATION}"'
        )
        try:
            ops = builtins.list(self._operations.list(request=request, timeout=self.request_timeout_s))
        except _CALL_ERRORS as exc:
            raise translate_error(exc, f"list preemption operations in {zone}") from exc
        return [op for op in ops if op.operation_type == PREEMPTED_OPERATION]

    def acknowledge(self, interruptions: Sequence[Interruption]) -> None:
        """Nothing to do: preemptions are read from zone operations, not a queue (see
        ``CloudProvider.acknowledge``)."""

    def interruptions(self, since: datetime) -> builtins.list[Interruption]:
        """Preemptions of costopt's instances (``costopt-*`` names) recorded as ``compute.instances.preempted``
        zone operations in the known zones, at or after ``since`` (by the operation's time)."""
        since = utc(since)
        stamp = since.strftime("%Y-%m-%dT%H:%M:%S.000Z")
        flt = f'(operationType = "{PREEMPTED_OPERATION}") (insertTime >= "{stamp}")'
        found: builtins.list[Interruption] = []
        for zone in self._all_zones():
            for op in self._preempted_ops(zone, flt):
                name = _zone_of(op.target_link)
                if not name.startswith("costopt-"):
                    continue
                when = _time(op.end_time) or _time(op.insert_time) or utc(self._clock())
                if when < since:
                    continue
                instance_id = f"{zone}/{name}"
                with self._lock:
                    self._reported.add(instance_id)
                log.info("spot instance %s was preempted at %s", instance_id, when)
                found.append(Interruption(instance_id=instance_id, noticed_at=when, deadline=None, kind="preempted"))
        return found
