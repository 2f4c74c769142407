"""The AWS provider: EC2 spot and on-demand instances behind :class:`costopt.cloud.CloudProvider`.

How each contract of the protocol is kept:

- ``launch(spec, token)`` creates at most one instance per token. The token is sent as EC2's
  ``ClientToken`` (AWS itself answers a repeated request with the instance it already launched, for at
  least 24 h after that instance terminates) *and* stored as the tag ``costopt:token``. Before calling
  ``RunInstances`` the provider looks the token up by tag and returns the instance it finds, in any
  state, so a retry never launches a second copy even where ``ClientToken`` is not enforced (moto, or
  a launch retried after AWS has forgotten the token). A token whose instance was terminated or
  preempted therefore returns that instance: use a fresh token for a fresh launch.
- ``terminate(instance_id)`` is idempotent: an instance that is unknown, already terminated or
  shutting down is not an error. It refuses (:class:`CloudError`) to terminate an instance that does
  not carry the ``costopt:token`` tag, so a wrong id can never take down a machine costopt did not launch.
- ``list(tags)`` only ever returns instances launched by costopt (those with a ``costopt:token`` tag),
  whatever ``tags`` asks, so a reconciler cannot mistake someone else's machine for an orphan. It keeps
  the rule of :mod:`costopt.cloud`: every instance that still exists (stopped ones included), and
  terminated ones until :data:`costopt.cloud.ENDED_RETENTION` after their termination (EC2 itself
  reports them for about an hour).
- ``interruptions(since)`` reads the EventBridge "EC2 Spot Instance Interruption Warning" events that
  :func:`setup_interruption_queue` routes to one SQS queue per region (AWS gives two minutes' notice),
  and checks instance states for spot instances AWS has already taken back.

Instance states map to :class:`InstanceState`: ``pending`` -> PENDING, ``running`` -> RUNNING,
``stopping``/``shutting-down`` -> STOPPING, ``stopped`` -> STOPPED (disks kept, nothing runs),
``terminated`` -> TERMINATED; a spot instance AWS interrupted (state reason
``Server.SpotInstanceTermination``/``Server.SpotInstanceShutdown``, or its spot request's status says AWS
terminated or stopped it) is PREEMPTED instead, from ``stopping``/``shutting-down`` on.

Errors are translated: capacity codes -> :class:`CapacityError`, quota codes -> :class:`QuotaError`,
refused or missing credentials -> :class:`AuthError`, unknown instance -> :class:`NotFoundError`, and
anything else AWS or the network refused -> :class:`CloudError`; each message says what to do. Throttling,
5xx and connection errors are first retried by botocore's *standard* retry mode.

Credentials come from the SDK's default chain only (profile, ``AWS_*`` environment, instance role);
none is passed in or stored. Times are tz-aware UTC. :meth:`AwsProvider.from_settings` builds the
provider from the ``COSTOPT_AWS_*`` settings (docs/providers.md).
"""

from __future__ import annotations

import builtins
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

from costopt.aws_clients import (
    AUTH_ERROR_CODES,
    ServiceClientFactory,
    aws_client_config,
    aws_error_code,
    describe_aws_error,
    service_client_factory,
)
from costopt.cloud import (
    ENDED_RETENTION,
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
from costopt.settings import DEFAULT_AWS_REGIONS, Settings
from providers.boot import boot_script
from providers.console import decode_console, tail_lines

log = logging.getLogger("costopt.providers.aws")

TOKEN_TAG = "costopt:token"
"""Tag holding the idempotency token of the launch that created an instance; marks costopt's instances."""

DEFAULT_IMAGE = "resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
"""The image launched when neither the spec nor ``ami_ids`` names one: AWS's public SSM parameter of the
latest Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04, x86_64), resolved by EC2 at launch in
every region. The launching principal needs ``ssm:GetParameters`` on it. Pin an AMI id per region with
``ami_ids`` for reproducible images."""

INTERRUPTION_DETAIL_TYPE = "EC2 Spot Instance Interruption Warning"
INTERRUPTION_EVENT_PATTERN: Mapping[str, Sequence[str]] = {
    "source": ["aws.ec2"],
    "detail-type": [INTERRUPTION_DETAIL_TYPE],
}
"""The EventBridge pattern selecting spot interruption warnings."""

SPOT_NOTICE = timedelta(minutes=2)
"""AWS interrupts a spot instance two minutes after its interruption warning."""

DEFAULT_QUEUE_NAME = "costopt-spot-interruptions"
DEFAULT_RULE_NAME = "costopt-spot-interruptions"
QUEUE_RETENTION_SECONDS = 3600
"""Interruption messages older than an hour are useless (their deadline passed long ago)."""

MAX_TOKEN_LENGTH = 64
"""EC2 accepts client tokens of up to 64 ASCII characters."""

MAX_USER_DATA_BYTES = 16 * 1024
"""EC2 rejects user data above 16 KB (before base64)."""

_MAX_RECEIVE_BATCHES = 20
"""At most this many SQS receives (of up to 10 messages each) per ``interruptions`` call."""
_RECEIPT_PREFIX = "sqs:"


def _encode_receipt(region: str, handle: str) -> str:
    """An :attr:`Interruption.receipt`: the region of the queue and the message's receipt handle."""
    return f"{_RECEIPT_PREFIX}{region}:{handle}"


def _decode_receipt(receipt: str | None) -> tuple[str, str] | None:
    """``(region, receipt handle)`` of a receipt made by :func:`_encode_receipt` (None: not one)."""
    if not receipt or not receipt.startswith(_RECEIPT_PREFIX):
        return None
    region, sep, handle = receipt[len(_RECEIPT_PREFIX) :].partition(":")
    return (region, handle) if sep and region and handle else None


_CAPACITY_CODES = frozenset({"InsufficientInstanceCapacity", "SpotMaxPriceTooLow", "InsufficientCapacity"})
_QUOTA_CODES = frozenset({"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"})
_AUTH_CODES = AUTH_ERROR_CODES | {"OptInRequired"}
_INSTANCE_NOT_FOUND = "InvalidInstanceID.NotFound"
_INSTANCE_MALFORMED = "InvalidInstanceID.Malformed"
_QUEUE_NOT_FOUND = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})

_PREEMPTION_REASONS = frozenset({"Server.SpotInstanceTermination", "Server.SpotInstanceShutdown"})
_PREEMPTION_REQUEST_STATUSES = frozenset(
    {
        "marked-for-termination", "marked-for-stop", "instance-terminated-by-price", "instance-terminated-no-capacity",
        "instance-terminated-capacity-oversubscribed", "instance-terminated-launch-group-constraint",
        "instance-stopped-by-price", "instance-stopped-no-capacity", "instance-stopped-capacity-oversubscribed",
    }
)  # fmt: skip
_GONE_STATES = frozenset({"shutting-down", "terminated"})
_TRANSITION_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


def _utcnow() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------- clients and errors


def translate_error(exc: BaseException, action: str) -> CloudError:
    """The project's typed error for an SDK error raised while doing ``action`` (e.g. "launch g5.xlarge
    spot in us-east-1a"); the message names the AWS code and says what to do."""
    what = f"AWS: cannot {action}: {describe_aws_error(exc)}"
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return AuthError(f"{what}. No usable credentials were found by the SDK's default chain.")
    if isinstance(exc, ClientError):
        code = aws_error_code(exc)
        if code in _CAPACITY_CODES:
            return CapacityError(
                f"{what}. AWS has no capacity for this offer now: try another zone, instance type or market, "
                "and this one again later."
            )
        if code in _QUOTA_CODES:
            return QuotaError(
                f"{what}. The account's quota is exhausted: request an increase in Service Quotas (EC2 "
                "'Running On-Demand/Spot ... instances' vCPU quotas of this region) or launch elsewhere."
            )
        if code in _AUTH_CODES:
            return AuthError(
                f"{what}. Check the AWS credentials (profile, environment or instance role) and that their IAM "
                "policy allows this call (ec2:RunInstances, ec2:CreateTags, ec2:DescribeInstances, "
                "ec2:TerminateInstances, ssm:GetParameters for the default image, sqs:ReceiveMessage/"
                "DeleteMessage); decode an encoded message with 'aws sts decode-authorization-message'."
            )
        if code in (_INSTANCE_NOT_FOUND, _INSTANCE_MALFORMED):
            return NotFoundError(f"{what}. The instance does not exist (any more) in this account and region.")
        if code in _QUEUE_NOT_FOUND:
            return NotFoundError(
                f"{what}. The interruption queue does not exist: create it with "
                "providers.aws.setup_interruption_queue(region) and pass its URL in interruption_queue_urls."
            )
        if code == "IdempotentParameterMismatch":
            return CloudError(
                f"{what}. This idempotency token was already used for a different launch: use a fresh token "
                "for every distinct launch."
            )
        if code.startswith("InvalidAMIID"):
            return CloudError(f"{what}. Set an AMI that exists in this region (ami_ids or LaunchSpec.image).")
        return CloudError(f"{what}. AWS refused the request; see the code above.")
    if isinstance(exc, BotoCoreError):
        return CloudError(
            f"{what}. The request failed after botocore's retries: check network access to the AWS endpoints "
            "(or the configured endpoint_url)."
        )
    return CloudError(what)


# --------------------------------------------------------------------------- user data and tags


def user_data_script(spec: LaunchSpec) -> str:
    """The user data that starts ``spec``'s job (:func:`providers.boot.boot_script`). Raises ValueError for
    an empty command, an env name that is not a shell identifier, a NUL character, or a script above
    EC2's 16 KB."""
    return boot_script(spec, max_bytes=MAX_USER_DATA_BYTES, limit_name="EC2's")


def _check_token(token: str) -> None:
    if not token or len(token) > MAX_TOKEN_LENGTH or not token.isascii():
        raise ValueError(f"idempotency token must be 1 to {MAX_TOKEN_LENGTH} ASCII characters, got {token!r}")


def launch_tags(spec: LaunchSpec, token: str) -> dict[str, str]:
    """``spec.tags`` plus ``costopt:token``. Raises ValueError for ``aws:`` keys (reserved by AWS) or a
    ``costopt:token`` tag in the spec that differs from ``token``."""
    tags = dict(spec.tags)
    for key in tags:
        if key.lower().startswith("aws:"):
            raise ValueError(f"tag key {key!r} is reserved by AWS (the 'aws:' prefix)")
    if tags.get(TOKEN_TAG, token) != token:
        raise ValueError(f"spec.tags[{TOKEN_TAG!r}] = {tags[TOKEN_TAG]!r} differs from the idempotency token {token!r}")
    tags[TOKEN_TAG] = token
    return tags


def _tag_list(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def _tags_of(raw: Mapping[str, Any]) -> dict[str, str]:
    return {str(t["Key"]): str(t.get("Value", "")) for t in raw.get("Tags", []) or []}


def _has_tags(raw: Mapping[str, Any], wanted: Mapping[str, str]) -> bool:
    """costopt's instance carrying exactly ``wanted`` (EC2 filter values are wildcards: check exactly)."""
    tags = _tags_of(raw)
    return TOKEN_TAG in tags and tags_match(tags, wanted)


# --------------------------------------------------------------------------- states


def _transition_time(raw: Mapping[str, Any]) -> datetime | None:
    """The time in ``StateTransitionReason`` ("User initiated (2024-05-01 10:00:00 GMT)"), if any."""
    match = _TRANSITION_TIME.search(str(raw.get("StateTransitionReason", "") or ""))
    if match is None:
        return None
    return datetime.fromisoformat(match.group(1)).replace(tzinfo=UTC)


def map_state(raw: Mapping[str, Any], spot_request_status: str | None = None) -> InstanceState:
    """The :class:`InstanceState` of one ``describe_instances`` instance.

    A spot instance that is shutting down, terminated or stopped because AWS took it back (its
    ``StateReason.Code`` is ``Server.SpotInstanceTermination``/``Server.SpotInstanceShutdown``, or
    ``spot_request_status`` is one of AWS's interruption statuses) is PREEMPTED.
    """
    name = str(raw.get("State", {}).get("Name", ""))
    if name == "pending":
        return InstanceState.PENDING
    if name == "running":
        return InstanceState.RUNNING
    reason = str((raw.get("StateReason") or {}).get("Code", "") or "")
    if name in ("shutting-down", "terminated", "stopping", "stopped") and (
        reason in _PREEMPTION_REASONS or (spot_request_status or "") in _PREEMPTION_REQUEST_STATUSES
    ):
        return InstanceState.PREEMPTED
    if name == "terminated":
        return InstanceState.TERMINATED
    if name == "stopped":
        return InstanceState.STOPPED
    if name in ("shutting-down", "stopping"):
        return InstanceState.STOPPING
    raise CloudError(f"AWS reported instance {raw.get('InstanceId')} in an unknown state {name!r}")


def _needs_request_status(raw: Mapping[str, Any]) -> bool:
    """A spot instance gone without a conclusive state reason: its spot request's status tells why."""
    name = str(raw.get("State", {}).get("Name", ""))
    reason = str((raw.get("StateReason") or {}).get("Code", "") or "")
    return (
        raw.get("InstanceLifecycle") == "spot"
        and bool(raw.get("SpotInstanceRequestId"))
        and name in ("shutting-down", "terminated", "stopping", "stopped")
        and reason not in _PREEMPTION_REASONS
        and not reason.startswith("Client.")
    )


def _expired(raw: Mapping[str, Any], horizon: datetime) -> bool:
    """A terminated instance whose termination time is known and before ``horizon``."""
    if str(raw.get("State", {}).get("Name", "")) != "terminated":
        return False
    ended = _transition_time(raw)
    return ended is not None and ended < horizon


def to_instance(raw: Mapping[str, Any], region: str, spot_request_status: str | None = None) -> Instance:
    """An :class:`Instance` from one ``describe_instances``/``run_instances`` instance of ``region``.

    ``offer.zone`` is the zone the instance actually runs in; ``offer.market`` is SPOT when EC2 reports
    ``InstanceLifecycle == "spot"``. ``terminated_at`` is read from ``StateTransitionReason`` when the
    instance is gone and the reason carries a time.
    """
    state = map_state(raw, spot_request_status)
    market = Market.SPOT if raw.get("InstanceLifecycle") == "spot" else Market.ON_DEMAND
    zone = str((raw.get("Placement") or {}).get("AvailabilityZone", "") or "")
    launched = raw.get("LaunchTime")
    launched_at = utc(launched) if isinstance(launched, datetime) else None
    terminated_at = None
    if str(raw.get("State", {}).get("Name", "")) in _GONE_STATES:
        terminated_at = _transition_time(raw)
    return Instance(
        instance_id=str(raw["InstanceId"]),
        offer=OfferKey(Cloud.AWS, region, zone, str(raw["InstanceType"]), market),
        state=state,
        tags=_tags_of(raw),
        launched_at=launched_at,
        terminated_at=terminated_at,
    )


# --------------------------------------------------------------------------- interruption events


def parse_interruption_event(body: str) -> Interruption:
    """One SQS message body holding an EventBridge spot interruption warning -> a "notice" whose deadline
    is two minutes after the event's ``time``. An SNS envelope (``{"Type": "Notification", "Message": ...}``)
    is unwrapped. Raises :class:`BadRecord` for anything else (not JSON, another event type, no instance id,
    no parsable time)."""
    try:
        event = json.loads(body)
        if isinstance(event, dict) and event.get("Type") == "Notification" and isinstance(event.get("Message"), str):
            event = json.loads(event["Message"])
    except (json.JSONDecodeError, TypeError) as exc:
        raise BadRecord(f"not JSON: {exc}") from exc
    if not isinstance(event, dict):
        raise BadRecord(f"not a JSON object but {type(event).__name__}")
    if event.get("detail-type") != INTERRUPTION_DETAIL_TYPE:
        raise BadRecord(f"detail-type is {event.get('detail-type')!r}, not {INTERRUPTION_DETAIL_TYPE!r}")
    detail = event.get("detail")
    if not isinstance(detail, dict):
        raise BadRecord("no 'detail' object")
    instance_id = detail.get("instance-id")
    if not isinstance(instance_id, str) or not instance_id.startswith("i-"):
        raise BadRecord(f"detail.instance-id is {instance_id!r}, not an EC2 instance id")
    when = event.get("time")
    if not isinstance(when, str):
        raise BadRecord(f"time is {when!r}, not an ISO 8601 string")
    noticed_at = parse_utc(when)
    return Interruption(
        instance_id=instance_id, noticed_at=noticed_at, deadline=noticed_at + SPOT_NOTICE, kind="notice"
    )


# --------------------------------------------------------------------------- the provider


class AwsProvider:
    """EC2 behind :class:`costopt.cloud.CloudProvider` (``name == "aws"``); see the module docstring for
    the contracts kept. Thread-safe: boto3 clients are created once per (service, region) under a lock."""

    name = "aws"

    def __init__(
        self,
        regions: Sequence[str] = DEFAULT_AWS_REGIONS,
        *,
        ami_ids: Mapping[str, str] | None = None,
        default_image: str = DEFAULT_IMAGE,
        interruption_queue_urls: Mapping[str, str] | None = None,
        iam_instance_profile: str | None = None,
        security_group_ids: Mapping[str, Sequence[str]] | None = None,
        subnet_ids: Mapping[str, str] | None = None,
        key_name: str | None = None,
        session: boto3.Session | None = None,
        endpoint_url: str | None = None,
        client_factory: ServiceClientFactory | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 30.0,
        max_attempts: int = 5,
        queue_wait_seconds: int = 1,
        notice_visibility_seconds: int = 60,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        """
        - ``regions``: where ``describe``, ``list`` and the instance-state checks of ``interruptions`` look;
          ``launch`` refuses offers of other regions (a restarted provider would never find their instances).
        - ``ami_ids``: region -> AMI id (or ``resolve:ssm:...`` reference) to launch; ``default_image`` for
          other regions. ``LaunchSpec.image`` overrides both.
        - ``interruption_queue_urls``: region -> URL of the SQS queue receiving that region's EventBridge
          spot interruption warnings (EventBridge rules are regional; make them with
          :func:`setup_interruption_queue`). None: notices are not read, only instance states.
        - ``iam_instance_profile``: name or ARN of the instance profile the job runs with (e.g. to reach
          the checkpoint bucket); ``security_group_ids``: region -> groups of the instance (a region not
          listed: the VPC's default group).
        - ``subnet_ids``: availability zone or region -> subnet to launch in; the offer's zone is looked
          up first, then its region (a region's subnet must lie in the zone launched, or the offer be
          regional). None, or neither listed: the default VPC's subnet.
        - ``key_name``: EC2 key pair for SSH (None: none).
        - ``client_factory(service, region)`` overrides ``session``/``endpoint_url``/timeouts/``max_attempts``
          (botocore standard retry mode, ``max_attempts`` tries in all).
        - ``queue_wait_seconds``: SQS long-poll wait of the first receive (0: short poll, which may miss
          messages on a real queue until the next call).
        - ``notice_visibility_seconds``: how long a notice read from the queue stays hidden from other
          reads (SQS ``VisibilityTimeout``); one not acknowledged by then is returned again.
        - ``clock``: now, for preemptions whose time AWS does not report and for ``list``'s retention of
          terminated instances.
        """
        if not regions:
            raise ValueError("AwsProvider needs at least one region (e.g. COSTOPT_AWS_REGIONS=us-east-1)")
        if not 0 <= queue_wait_seconds <= 20:
            raise ValueError("queue_wait_seconds must be within 0..20 (SQS's long-poll limit)")
        if not 1 <= notice_visibility_seconds <= 43_200:
            raise ValueError("notice_visibility_seconds must be within 1..43200 (SQS's visibility limits)")
        self.regions: tuple[str, ...] = tuple(dict.fromkeys(regions))
        self.ami_ids = dict(ami_ids or {})
        self.default_image = default_image
        self.interruption_queue_urls = dict(interruption_queue_urls or {})
        self.iam_instance_profile = iam_instance_profile
        self.security_group_ids = {r: tuple(groups) for r, groups in (security_group_ids or {}).items()}
        self.subnet_ids = dict(subnet_ids or {})
        self.key_name = key_name
        self.queue_wait_seconds = queue_wait_seconds
        self.notice_visibility_seconds = notice_visibility_seconds
        self._clock = clock
        self._factory = client_factory or service_client_factory(
            session=session,
            endpoint_url=endpoint_url,
            config=aws_client_config(
                connect_timeout=connect_timeout, read_timeout=read_timeout, max_attempts=max_attempts
            ),
        )
        self._clients: dict[tuple[str, str], Any] = {}
        self._region_of: dict[str, str] = {}
        self._reported_preemptions: set[str] = set()
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> AwsProvider:
        """Built from :class:`Settings`: ``aws_regions``, ``aws_ami_ids``, ``aws_default_image`` (None: the
        DLAMI SSM parameter), ``aws_interruption_queue_urls``, ``aws_instance_profile``,
        ``aws_security_group_ids``, ``aws_subnet_ids``, ``aws_key_name``, ``aws_endpoint_url`` and
        ``http_timeout_s`` (read timeout). ``overrides`` (constructor arguments, e.g. ``session``) win.

        Raises :class:`ProviderConfigError` when no region is set, or an AMI, queue, security group or
        subnet names a region outside ``aws_regions`` (it would never be used: launches go there only)."""
        regions = list(settings.aws_regions)
        if not regions and "regions" not in overrides:
            raise ProviderConfigError("AWS: no region: set COSTOPT_AWS_REGIONS (e.g. us-east-1,us-west-2)")
        known = set(overrides.get("regions", regions))
        for var, keys in (
            ("COSTOPT_AWS_INTERRUPTION_QUEUE_URLS", settings.aws_interruption_queue_urls),
            ("COSTOPT_AWS_SECURITY_GROUP_IDS", settings.aws_security_group_ids),
            ("COSTOPT_AWS_AMI_IDS", settings.aws_ami_ids),
        ):
            stray = sorted(set(keys) - known)
            if stray:
                raise ProviderConfigError(
                    f"AWS: {var} names regions {stray} that are not in COSTOPT_AWS_REGIONS {sorted(known)}: "
                    "add them to COSTOPT_AWS_REGIONS or remove them"
                )
        stray = sorted(k for k in settings.aws_subnet_ids if not any(k.startswith(r) for r in known))
        if stray:
            raise ProviderConfigError(
                f"AWS: COSTOPT_AWS_SUBNET_IDS names zones or regions {stray} outside COSTOPT_AWS_REGIONS "
                f"{sorted(known)}: add their regions to COSTOPT_AWS_REGIONS or remove them"
            )
        kwargs: dict[str, Any] = {
            "regions": regions,
            "ami_ids": settings.aws_ami_ids,
            "default_image": settings.aws_default_image or DEFAULT_IMAGE,
            "interruption_queue_urls": settings.aws_interruption_queue_urls,
            "iam_instance_profile": settings.aws_instance_profile,
            "security_group_ids": settings.aws_security_group_ids,
            "subnet_ids": settings.aws_subnet_ids,
            "key_name": settings.aws_key_name,
            "endpoint_url": settings.aws_endpoint_url,
            "read_timeout": settings.http_timeout_s,
        }
        kwargs.update(overrides)
        return cls(**kwargs)

    # ------------------------------------------------------------------ plumbing

    def _client(self, service: str, region: str) -> Any:
        key = (service, region)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._factory(service, region)
                self._clients[key] = client
            return client

    def _remember(self, instance_id: str, region: str) -> None:
        with self._lock:
            self._region_of[instance_id] = region

    def _all_regions(self) -> builtins.list[str]:
        """The configured regions, then any other region a launch went to."""
        with self._lock:
            extra = [r for r in self._region_of.values() if r not in self.regions]
        return list(dict.fromkeys((*self.regions, *extra)))

    def _search_order(self, instance_id: str) -> builtins.list[str]:
        """Where to look for ``instance_id``: the region it was last seen in first."""
        with self._lock:
            known = self._region_of.get(instance_id)
        rest = [r for r in self._all_regions() if r != known]
        return [known, *rest] if known else rest

    def subnet_for(self, offer: OfferKey) -> str | None:
        """The subnet to launch ``offer`` in: ``subnet_ids[zone]``, else ``subnet_ids[region]``, else None."""
        return (self.subnet_ids.get(offer.zone) if offer.zone else None) or self.subnet_ids.get(offer.region)

    def image_for(self, spec: LaunchSpec) -> str:
        """The image to launch: ``spec.image``, else ``ami_ids[region]``, else ``default_image``."""
        return spec.image or self.ami_ids.get(spec.offer.region) or self.default_image

    def _describe_raw(self, region: str, filters: builtins.list[dict[str, Any]]) -> builtins.list[dict[str, Any]]:
        ec2 = self._client("ec2", region)
        found: builtins.list[dict[str, Any]] = []
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page.get("Reservations", []):
                found.extend(reservation.get("Instances", []))
        return found

    def _spot_request_statuses(self, region: str, raws: Iterable[Mapping[str, Any]]) -> dict[str, str]:
        """Spot request status codes by instance id, for gone spot instances whose state reason is inconclusive."""
        ids = [str(r["SpotInstanceRequestId"]) for r in raws if _needs_request_status(r)]
        if not ids:
            return {}
        try:
            answer = self._client("ec2", region).describe_spot_instance_requests(SpotInstanceRequestIds=ids)
        except ClientError as exc:  # e.g. a request AWS no longer keeps: the state reason alone decides
            log.warning("spot requests %s in %s not readable: %s", ", ".join(ids), region, describe_aws_error(exc))
            return {}
        return {
            str(req["InstanceId"]): str(req.get("Status", {}).get("Code", ""))
            for req in answer.get("SpotInstanceRequests", [])
            if req.get("InstanceId")
        }

    def _to_instances(self, region: str, raws: builtins.list[dict[str, Any]]) -> builtins.list[Instance]:
        statuses = self._spot_request_statuses(region, raws)
        out = [to_instance(r, region, statuses.get(str(r["InstanceId"]))) for r in raws]
        for inst in out:
            self._remember(inst.instance_id, region)
        return out

    # ------------------------------------------------------------------ launch

    def find_by_token(self, region: str, token: str) -> Instance | None:
        """The instance launched with ``token`` in ``region``, whatever its state (a live one first, then the
        newest), or None. Several live ones (only possible where ``ClientToken`` is not enforced) are logged."""
        try:
            raws = self._describe_raw(region, [{"Name": f"tag:{TOKEN_TAG}", "Values": [token]}])
            raws = [r for r in raws if _tags_of(r).get(TOKEN_TAG) == token]  # filter values are wildcards: be exact
            found = self._to_instances(region, raws)
        except (ClientError, BotoCoreError) as exc:
            raise translate_error(exc, f"look up the instance of token {token!r} in {region}") from exc
        if not found:
            return None
        gone = (InstanceState.TERMINATED, InstanceState.PREEMPTED)
        live = sorted(
            (i for i in found if i.state not in gone),
            key=lambda i: i.launched_at or datetime.max.replace(tzinfo=UTC),
        )
        if len(live) > 1:
            log.warning(
                "token %s has %d live instances in %s (%s); returning the first, terminate the others",
                token, len(live), region, ", ".join(i.instance_id for i in live),
            )  # fmt: skip
        if live:
            return live[0]
        return max(found, key=lambda i: i.launched_at or datetime.min.replace(tzinfo=UTC))

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        """Launch one instance of ``spec.offer`` (spot: a one-time spot request that terminates on
        interruption; on-demand otherwise) in its zone when it has one, tagged with ``spec.tags`` and
        ``costopt:token``, booting :func:`user_data_script`. Returns the instance already launched for
        ``idempotency_token`` instead, if there is one (in any state: see the module docstring).

        Raises ValueError for a bad spec or token and :class:`ProviderConfigError` for a region outside
        ``regions`` (nothing is launched), :class:`CapacityError`,
        :class:`QuotaError`, :class:`AuthError` or :class:`CloudError`.
        """
        _check_token(idempotency_token)
        offer = spec.offer
        if offer.cloud is not Cloud.AWS:
            raise ValueError(f"AwsProvider cannot launch an offer of {offer.cloud.value}: {offer!r}")
        if offer.region not in self.regions:
            raise ProviderConfigError(
                f"AWS: region {offer.region} is not one of the provider's regions {list(self.regions)}: add it to "
                "COSTOPT_AWS_REGIONS (describe, list and interruptions only look there)"
            )
        tags = launch_tags(spec, idempotency_token)
        script = user_data_script(spec)
        existing = self.find_by_token(offer.region, idempotency_token)
        if existing is not None:
            log.info(
                "launch %s: token %s already launched %s (%s); not launching again",
                offer.instance_type, idempotency_token, existing.instance_id, existing.state.value,
            )  # fmt: skip
            return existing
        request: dict[str, Any] = {
            "ImageId": self.image_for(spec),
            "InstanceType": offer.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": idempotency_token,
            "UserData": script,
            "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": _tag_list(tags)},
                {"ResourceType": "volume", "Tags": _tag_list(tags)},
            ],
        }
        if offer.market is Market.SPOT:
            request["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        if offer.zone:
            request["Placement"] = {"AvailabilityZone": offer.zone}
        if self.iam_instance_profile:
            key = "Arn" if self.iam_instance_profile.startswith("arn:") else "Name"
            request["IamInstanceProfile"] = {key: self.iam_instance_profile}
        groups = self.security_group_ids.get(offer.region)
        if groups:
            request["SecurityGroupIds"] = list(groups)
        subnet = self.subnet_for(offer)
        if subnet:
            request["SubnetId"] = subnet
        if self.key_name:
            request["KeyName"] = self.key_name
        where = f"{offer.region}/{offer.zone or '-'}"
        action = f"launch {offer.instance_type} {offer.market.value} in {where}"
        try:
            answer = self._client("ec2", offer.region).run_instances(**request)
        except (ClientError, BotoCoreError) as exc:
            err = translate_error(exc, action)
            log.warning("%s failed: %s", action, err)
            raise err from exc
        instance = to_instance(answer["Instances"][0], offer.region)
        if not instance.tags:  # the launch answer may omit tags; they were applied atomically with it
            instance = replace(instance, tags=tags)
        self._remember(instance.instance_id, offer.region)
        log.info("launched %s: %s %s (token %s)", instance.instance_id, action, instance.state.value, idempotency_token)
        return instance

    # ------------------------------------------------------------------ describe, list, terminate

    def _locate(self, instance_id: str) -> tuple[str, dict[str, Any]] | None:
        """``(region, raw instance)`` of ``instance_id`` in the known regions, or None when no region has it."""
        for region in self._search_order(instance_id):
            ec2 = self._client("ec2", region)
            try:
                answer = ec2.describe_instances(InstanceIds=[instance_id])
            except ClientError as exc:
                if aws_error_code(exc) == _INSTANCE_NOT_FOUND:
                    continue
                raise translate_error(exc, f"describe {instance_id} in {region}") from exc
            except BotoCoreError as exc:
                raise translate_error(exc, f"describe {instance_id} in {region}") from exc
            for reservation in answer.get("Reservations", []):
                for raw in reservation.get("Instances", []):
                    if raw.get("InstanceId") == instance_id:
                        self._remember(instance_id, region)
                        return region, raw
        return None

    def describe(self, instance_id: str) -> Instance:
        """The instance as EC2 reports it now. Raises :class:`NotFoundError` when no known region has it
        (right after a launch, EC2's eventual consistency can briefly say so too: retry then)."""
        located = self._locate(instance_id)
        if located is None:
            raise NotFoundError(
                f"AWS: instance {instance_id} not found in {', '.join(self._search_order(instance_id))}: it never "
                "existed there or was terminated long ago (add its region to AwsProvider(regions=...) if missing)"
            )
        region, raw = located
        return self._to_instances(region, [raw])[0]

    def list(self, tags: Mapping[str, str]) -> builtins.list[Instance]:
        """costopt's instances (those with a ``costopt:token`` tag) carrying every ``tags`` key with exactly
        its value, in every known region, oldest launch first: every one that still exists (pending,
        running, stopping, shutting down, stopped), and terminated ones until
        :data:`~costopt.cloud.ENDED_RETENTION` after their termination (by the provider's clock; one whose
        termination time EC2 does not give stays as long as EC2 reports it, about an hour)."""
        filters: builtins.list[dict[str, Any]] = [{"Name": "tag-key", "Values": [TOKEN_TAG]}]
        filters += [{"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()]
        horizon = utc(self._clock()) - ENDED_RETENTION
        out: builtins.list[Instance] = []
        for region in self._all_regions():
            try:
                raws = [
                    r for r in self._describe_raw(region, filters) if _has_tags(r, tags) and not _expired(r, horizon)
                ]
                out.extend(self._to_instances(region, raws))
            except (ClientError, BotoCoreError) as exc:
                raise translate_error(exc, f"list instances tagged {dict(tags)} in {region}") from exc
        return sorted(out, key=lambda i: i.launched_at or datetime.min.replace(tzinfo=UTC))

    def terminate(self, instance_id: str) -> None:
        """Terminate ``instance_id``. Idempotent: an unknown, terminated or shutting-down instance is left
        as it is. Raises :class:`CloudError` (nothing done) for an instance not launched by costopt, and the
        typed errors of :func:`translate_error` when AWS refuses."""
        located = self._locate(instance_id)
        if located is None:
            log.info("terminate %s: not found in any known region, nothing to do", instance_id)
            return
        region, raw = located
        state = str(raw.get("State", {}).get("Name", ""))
        if state in _GONE_STATES:
            log.info("terminate %s: already %s", instance_id, state)
            return
        if TOKEN_TAG not in _tags_of(raw):
            raise CloudError(
                f"AWS: refusing to terminate {instance_id} in {region}: it has no {TOKEN_TAG} tag, so costopt did "
                "not launch it. Terminate it yourself if it really is costopt's."
            )
        try:
            self._client("ec2", region).terminate_instances(InstanceIds=[instance_id])
        except ClientError as exc:
            if aws_error_code(exc) == _INSTANCE_NOT_FOUND:
                log.info("terminate %s: gone meanwhile", instance_id)
                return
            raise translate_error(exc, f"terminate {instance_id} in {region}") from exc
        except BotoCoreError as exc:
            raise translate_error(exc, f"terminate {instance_id} in {region}") from exc
        log.info("terminate %s in %s: requested (was %s)", instance_id, region, state)

    def output(self, instance_id: str, *, tail: int | None = None) -> str:
        """The instance's console output as EC2 captured it (``get_console_output`` with ``Latest``: the
        most recent 64 KB on Nitro instances, where EC2 keeps it; older types give the last output EC2
        posted), the last ``tail`` lines (None: all); "" before EC2 has any. Raises :class:`NotFoundError`
        for an instance no known region has."""
        if tail is not None and tail < 0:
            raise ValueError(f"tail must be >= 0 lines, got {tail}")
        located = self._locate(instance_id)
        if located is None:
            raise NotFoundError(
                f"AWS: instance {instance_id} not found in {', '.join(self._search_order(instance_id))}"
            )
        region, _ = located
        try:
            answer = self._client("ec2", region).get_console_output(InstanceId=instance_id, Latest=True)
        except (ClientError, BotoCoreError) as exc:
            raise translate_error(exc, f"read the console output of {instance_id} in {region}") from exc
        return tail_lines(decode_console(answer.get("Output")), tail)

    # ------------------------------------------------------------------ interruptions

    def interruptions(self, since: datetime) -> builtins.list[Interruption]:
        """Spot interruption notices read from each region's queue, then spot instances found preempted.

        Notices: every queued warning whose deadline is not before ``since`` (a notice is judged by its
        deadline, not its event time, so one delivered late by EventBridge is not lost). A notice's message
        stays in the queue until :meth:`acknowledge` deletes it (its ``receipt`` names it): hidden for
        ``notice_visibility_seconds``, then returned again, so a watcher that dies between reading and
        acting does not lose it. Messages that are not interruption warnings, and stale warnings, are
        logged and deleted at once, never raised. The queue holds the whole region's warnings, costopt's
        instances or not.

        Preemptions: costopt's spot instances that AWS took back (see :func:`map_state`) with a known
        termination time not before ``since``, or with no time reported (those are returned once per
        provider object, at the time of the call).
        """
        since = utc(since)
        found: builtins.list[Interruption] = []
        for region, queue_url in self.interruption_queue_urls.items():
            found.extend(self._drain_queue(region, queue_url, since))
        for region in self._all_regions():
            found.extend(self._preempted(region, since))
        return found

    def _drain_queue(self, region: str, queue_url: str, since: datetime) -> builtins.list[Interruption]:
        sqs = self._client("sqs", region)
        notices: builtins.list[Interruption] = []
        seen: set[str] = set()
        for batch in range(_MAX_RECEIVE_BATCHES):
            try:
                answer = sqs.receive_message(
                    QueueUrl=queue_url,
                    MaxNumberOfMessages=10,
                    WaitTimeSeconds=self.queue_wait_seconds if batch == 0 else 0,
                    VisibilityTimeout=self.notice_visibility_seconds,
                )
            except (ClientError, BotoCoreError) as exc:
                raise translate_error(exc, f"read interruption notices from {queue_url}") from exc
            messages = [m for m in answer.get("Messages", []) if str(m.get("MessageId")) not in seen]
            if not messages:
                break
            dropped: builtins.list[dict[str, str]] = []
            for message in messages:
                seen.add(str(message.get("MessageId")))
                handle = str(message["ReceiptHandle"])
                try:
                    notice = parse_interruption_event(str(message.get("Body", "")))
                except BadRecord as exc:
                    log.warning(
                        "interruption queue %s: dropping message %s: %s (body starts %r)",
                        queue_url, message.get("MessageId"), exc, str(message.get("Body", ""))[:200],
                    )  # fmt: skip
                    dropped.append({"Id": str(len(dropped)), "ReceiptHandle": handle})
                    continue
                if notice.deadline is not None and notice.deadline < since:
                    log.info("interruption queue %s: stale notice for %s dropped", queue_url, notice.instance_id)
                    dropped.append({"Id": str(len(dropped)), "ReceiptHandle": handle})
                    continue
                log.info("spot interruption notice: %s, deadline %s", notice.instance_id, notice.deadline)
                notices.append(replace(notice, receipt=_encode_receipt(region, handle)))
            if dropped:
                self._delete(sqs, queue_url, dropped)
        return notices

    def acknowledge(self, interruptions: Sequence[Interruption]) -> None:
        """Delete the queue messages of notices the caller acted on (events without a ``receipt``, or of
        a queue this provider does not read, are ignored). A failed deletion is logged: the notice comes
        again after ``notice_visibility_seconds``."""
        by_region: dict[str, builtins.list[str]] = {}
        for event in interruptions:
            decoded = _decode_receipt(event.receipt)
            if decoded is not None and decoded[0] in self.interruption_queue_urls:
                by_region.setdefault(decoded[0], []).append(decoded[1])
        for region, handles in by_region.items():
            queue_url = self.interruption_queue_urls[region]
            try:
                sqs = self._client("sqs", region)
            except (ClientError, BotoCoreError) as exc:
                log.warning("interruption queue %s: cannot acknowledge %d notice(s) (they will come again): %s",
                            queue_url, len(handles), describe_aws_error(exc))  # fmt: skip
                continue
            unique = list(dict.fromkeys(handles))
            for lo in range(0, len(unique), 10):  # DeleteMessageBatch takes 10 entries at most
                entries = [{"Id": str(n), "ReceiptHandle": h} for n, h in enumerate(unique[lo : lo + 10])]
                self._delete(sqs, queue_url, entries)
            log.info("interruption queue %s: %d notice(s) acknowledged", queue_url, len(unique))

    @staticmethod
    def _delete(sqs: Any, queue_url: str, entries: builtins.list[dict[str, str]]) -> None:
        try:
            answer = sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)
        except (ClientError, BotoCoreError) as exc:
            log.warning("interruption queue %s: cannot delete %d messages (they will come again): %s",
                        queue_url, len(entries), describe_aws_error(exc))  # fmt: skip
            return
        for failed in answer.get("Failed", []) or []:
            log.warning("interruption queue %s: message %s not deleted: %s", queue_url, failed.get("Id"),
                        failed.get("Message"))  # fmt: skip

    def _preempted(self, region: str, since: datetime) -> builtins.list[Interruption]:
        filters = [
            {"Name": "tag-key", "Values": [TOKEN_TAG]},
            {"Name": "instance-state-name", "Values": ["shutting-down", "terminated", "stopping", "stopped"]},
        ]
        try:
            raws = [r for r in self._describe_raw(region, filters) if r.get("InstanceLifecycle") == "spot"]
            instances = self._to_instances(region, raws)
        except (ClientError, BotoCoreError) as exc:
            raise translate_error(exc, f"check spot instance states in {region}") from exc
        out: builtins.list[Interruption] = []
        now = utc(self._clock())
        for inst in instances:
            if inst.state is not InstanceState.PREEMPTED:
                continue
            if inst.terminated_at is not None:
                if inst.terminated_at < since:
                    continue
                when = inst.terminated_at
            else:
                with self._lock:
                    if inst.instance_id in self._reported_preemptions:
                        continue
                    self._reported_preemptions.add(inst.instance_id)
                when = now
            log.info("spot instance %s in %s was preempted (at %s)", inst.instance_id, region, when)
            out.append(Interruption(instance_id=inst.instance_id, noticed_at=when, deadline=None, kind="preempted"))
        return out


# --------------------------------------------------------------------------- operator helper


@dataclass(frozen=True, slots=True)
class InterruptionQueue:
    """What :func:`setup_interruption_queue` made: pass ``{region: queue_url}`` as the provider's
    ``interruption_queue_urls``."""

    region: str
    queue_url: str
    queue_arn: str
    rule_arn: str


def setup_interruption_queue(
    region: str,
    *,
    queue_name: str = DEFAULT_QUEUE_NAME,
    rule_name: str = DEFAULT_RULE_NAME,
    session: boto3.Session | None = None,
    endpoint_url: str | None = None,
    client_factory: ServiceClientFactory | None = None,
) -> InterruptionQueue:
    """Create (or update: safe to run again) ``region``'s path of spot interruption warnings: an SQS queue
    (messages kept an hour) whose policy lets this EventBridge rule send to it, and the rule on the default
    bus matching "EC2 Spot Instance Interruption Warning" with the queue as its target. Needs
    ``sqs:CreateQueue/GetQueueAttributes/SetQueueAttributes`` and ``events:PutRule/PutTargets``.

    Raises the typed errors of :func:`translate_error`.
    """
    factory = client_factory or service_client_factory(session=session, endpoint_url=endpoint_url)
    sqs = factory("sqs", region)
    events = factory("events", region)
    step = "create the SQS queue"
    try:
        queue_url = str(sqs.create_queue(QueueName=queue_name)["QueueUrl"])
        queue_arn = str(
            sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        )
        step = "create the EventBridge rule"
        rule_arn = str(
            events.put_rule(
                Name=rule_name,
                EventPattern=json.dumps(INTERRUPTION_EVENT_PATTERN),
                State="ENABLED",
                Description="costopt: EC2 spot interruption warnings to SQS",
            )["RuleArn"]
        )
        step = "allow the rule to send to the queue"
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "costopt-eventbridge-to-sqs",
                    "Effect": "Allow",
                    "Principal": {"Service": "events.amazonaws.com"},
                    "Action": "sqs:SendMessage",
                    "Resource": queue_arn,
                    "Condition": {"ArnEquals": {"aws:SourceArn": rule_arn}},
                }
            ],
        }
        sqs.set_queue_attributes(
            QueueUrl=queue_url,
            Attributes={"Policy": json.dumps(policy), "MessageRetentionPeriod": str(QUEUE_RETENTION_SECONDS)},
        )
        step = "target the queue from the rule"
        answer = events.put_targets(Rule=rule_name, Targets=[{"Id": "costopt-sqs", "Arn": queue_arn}])
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, f"set up spot interruption notices in {region} ({step})") from exc
    if answer.get("FailedEntryCount"):
        raise CloudError(
            f"AWS: cannot target {queue_arn} from rule {rule_name}: {answer.get('FailedEntries')}. Check the "
            "queue exists in the rule's region and is not encrypted with a key EventBridge cannot use."
        )
    log.info("spot interruption warnings of %s go to %s (rule %s)", region, queue_url, rule_arn)
    return InterruptionQueue(region=region, queue_url=queue_url, queue_arn=queue_arn, rule_arn=rule_arn)
