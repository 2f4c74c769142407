"""The one settings object of costopt (environment prefix ``COSTOPT_``).

Every component receives plain values taken from :class:`Settings` by the composition root
(``api/``, and ``providers/factory.py`` for the cloud providers); nothing deeper reads the environment.
Cloud credentials are never settings: each SDK finds them through its own default chain (AWS
profile/env/instance role, GCP ADC, Azure DefaultAzureCredential).

Environment formats: lists are comma-separated (``us-east-1,us-west-2``) or a JSON array; mappings
are ``key=value`` pairs separated by commas (``us-east-1=ami-0abc,us-west-2=ami-0def``) or a JSON
object; in a mapping whose values are lists (``COSTOPT_AWS_SECURITY_GROUP_IDS``), the items of one
value are separated by spaces (``us-east-1=sg-1 sg-2,us-west-2=sg-3``) or given as a JSON array.
Durations are seconds or ISO 8601 (``PT6H``).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def _default_data_dir() -> Path | None:
    """``../shared/data`` beside the checkout when present, else None (no real data available)."""
    for candidate in (PROJECT_ROOT.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"):
        if candidate.is_dir():
            return candidate.resolve()
    return None


DEFAULT_AWS_REGIONS = (
    "us-east-1",
    "us-east-2",
    "us-west-1",
    "us-west-2",
    "ca-central-1",
    "sa-east-1",
    "eu-central-1",
    "eu-west-1",
    "eu-west-2",
    "eu-west-3",
    "eu-north-1",
    "ap-northeast-1",
    "ap-northeast-2",
    "ap-southeast-1",
    "ap-southeast-2",
    "ap-south-1",
)


ProviderName = Literal["sim", "local", "aws", "gcp", "azure"]
"""The cloud providers costopt can launch on (``providers/<name>.py``)."""

PROVIDER_NAMES: tuple[str, ...] = get_args(ProviderName)


def parse_list(value: object) -> object:
    """An environment list: a JSON array, or comma-separated items (blanks dropped). Other values as given."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        return json.loads(text)
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_mapping(value: object, *, list_values: bool = False) -> object:
    """An environment mapping: a JSON object, or ``key=value`` pairs separated by commas (blank: empty).
    With ``list_values``, a value given as text is split on whitespace into a list. Raises ValueError
    (naming the expected format) for a pair without ``=``, an empty key or a key given twice."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON object: {exc}") from exc
        else:
            pairs: dict[str, str] = {}
            for part in (p.strip() for p in text.split(",")):
                if not part:
                    continue
                key, sep, val = part.partition("=")
                key = key.strip()
                if not sep or not key:
                    raise ValueError(f"expected key=value pairs separated by commas (or a JSON object), got {part!r}")
                if key in pairs:
                    raise ValueError(f"key {key!r} given twice")
                pairs[key] = val.strip()
            value = pairs
    if list_values and isinstance(value, dict):
        return {k: v.split() if isinstance(v, str) else v for k, v in value.items()}
    return value


_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,\-]+$")


def check_crontab(expr: str) -> str:
    """``expr`` when it has the shape of a crontab expression (5 fields of digits, names, ``* / , -``);
    raises ValueError saying what a valid one looks like. (The scheduler checks the values at start-up.)"""
    fields = expr.split()
    if len(fields) != 5 or not all(_CRON_FIELD.match(f) for f in fields):
        raise ValueError(
            f"{expr!r} is not a crontab expression: give 5 fields 'minute hour day-of-month month day-of-week' "
            "in UTC, e.g. '0 * * * *' (hourly, on the hour), '*/15 * * * *' (every 15 minutes) or "
            "'30 2 * * mon-fri' (02:30 on weekdays)"
        )
    return " ".join(fields)


class Settings(BaseSettings):
    """Runtime configuration. Durations are ``timedelta`` (env: seconds or ISO 8601, e.g. ``PT6H``)."""

    model_config = SettingsConfigDict(env_prefix="COSTOPT_", env_file=".env", extra="ignore")

    database_url: str = Field(
        default=f"sqlite:///{PROJECT_ROOT / 'var' / 'costopt.db'}",
        description="SQLAlchemy URL. SQLite file by default; postgresql+psycopg://... for PostgreSQL.",
    )
    db_pool_size: int = Field(
        default=20,
        ge=1,
        description="Database connections each service process keeps open (the REST requests in flight, the "
        "scheduler's jobs and the engine's workers share them); a connection opened beyond them is closed "
        "after use.",
    )
    db_max_overflow: int = Field(
        default=10, ge=0, description="Connections a service process may open beyond db_pool_size at a peak."
    )
    db_statement_timeout_s: float = Field(
        default=30.0,
        ge=0,
        allow_inf_nan=False,
        description="Seconds one database statement may wait before the database cancels it (0: no bound): "
        "PostgreSQL's statement_timeout, and lock_timeout at half of it (a query stuck behind another "
        "session's lock, a stalled server); SQLite's busy timeout (another connection's write lock). A "
        "request so cancelled answers 503; a scheduled job logs one line and runs again at its next tick.",
    )
    db_answer_timeout_s: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="PostgreSQL: seconds a connection waits for the server's answer (a query, a commit, the "
        "pool's ping) before the client gives up and closes it, for a server that cannot cancel on its own "
        "(frozen, or a network path that drops packets); TCP keepalives and tcp_user_timeout are derived from "
        "it. None: db_statement_timeout_s + 5 (none when that is 0); 0: no bound. The request answers 503.",
    )
    data_dir: Path | None = Field(
        default_factory=_default_data_dir,
        description="Folder of real public data (../shared/data when present); None when absent.",
    )
    catalog_dir: Path = Field(
        default=PROJECT_ROOT / "data" / "catalog",
        description="Curated instance catalog and list prices shipped with the project.",
    )
    throughput_file: Path | None = Field(
        default=None,
        description=(
            "Measured throughputs (Gavel format or the older single-GPU format). None: "
            "<data_dir>/gavel/simulation_throughputs.json."
        ),
    )
    estimate_new_accelerators: bool = Field(
        default=True, description="Estimate throughputs on GPUs no job type was measured on (marked estimated)."
    )
    availability_logs_dir: Path | None = Field(
        default=None,
        description="Spot availability logs for preemption hazards. None: <data_dir>/raw/training_on_a_dime/logs.",
    )
    checkpoint_interval: timedelta = Field(default=timedelta(hours=1), description="How often jobs checkpoint.")
    restart_time: timedelta = Field(
        default=timedelta(minutes=10), description="Boot + restore after a preemption or move (billed)."
    )
    deadline_confidence: float = Field(default=0.95, description="Probability a deadline must be met with.")
    stale_after: timedelta = Field(
        default=timedelta(days=7),
        description="A live price not confirmed within this long is stale and left out of plans at now.",
    )
    clock: Literal["live", "replay", "auto"] = Field(
        default="auto",
        description=(
            "What 'now' means for plans and snapshots. live: wall-clock now. replay: the data's own "
            "time (newest confirmation in the store). auto: live when any offer is fresh, else replay."
        ),
    )
    # Collector schedule (one interval per source).
    aws_spot_interval: timedelta = timedelta(minutes=30)
    aws_on_demand_interval: timedelta = timedelta(hours=24)
    gcp_interval: timedelta = timedelta(hours=6)
    azure_interval: timedelta = timedelta(hours=6)
    catalog_interval: timedelta = timedelta(days=7)
    # Sanity rules of every collected or imported price (pricing/screen.py, docs/reliability.md).
    max_usd_per_gpu_hour: float = Field(
        default=100.0,
        gt=0,
        description="A price above this many USD per GPU-hour (instance price / its GPU count, when the "
        "instance type is known) is refused as absurd (the dearest GPU lists near 15 USD/GPU-h).",
    )
    price_future_tolerance: timedelta = Field(
        default=timedelta(hours=1),
        description="A price whose valid_from is later than now plus this is refused (clock skew allowance).",
    )
    collectors_enabled: bool = True
    seed_on_start: bool = Field(
        default=True, description="Seed an empty store from data_dir and the curated catalog at startup."
    )
    demo_on_empty: bool = Field(
        default=False,
        description="`costopt serve` (and `make run`) first fills a database without jobs with the demo month "
        "(`costopt demo`'s defaults: 3 teams, 30 days of 2020 on the simulated cloud; docs/jobs.md).",
    )
    # Migration jobs of the service (the reconciler and the interruption watcher; docs/migration.md).
    migration_jobs_enabled: bool = Field(
        default=True,
        description="Run the job engine's tick, the rebalancer, the reconciler and the interruption watcher in "
        "the service (without them a submitted job stays queued). Over the embedded simulated cloud their "
        "schedules count simulated time (docs/jobs.md 'Service time').",
    )
    reconcile_interval: timedelta = Field(
        default=timedelta(minutes=5), description="How often every provider's instances are reconciled with jobs."
    )
    interruption_poll_interval: timedelta = Field(
        default=timedelta(seconds=5),
        description="How often preemption notices are polled (the shortest notice, GCP's and Azure's, is 30 s).",
    )
    interruption_overlap: timedelta = Field(
        default=timedelta(minutes=10),
        description="How far back each poll re-reads before the previous one (events are de-duplicated).",
    )
    unavailable_ttl_preempted: timedelta = Field(
        default=timedelta(hours=1), description="How long a preempted offer is kept out of plans."
    )
    unavailable_ttl_capacity: timedelta = Field(
        default=timedelta(minutes=30), description="How long an offer that had no capacity is kept out of plans."
    )
    unavailable_ttl_quota: timedelta = Field(
        default=timedelta(hours=6), description="How long an offer refused for quota is kept out of plans."
    )
    # The job service's scheduled work (docs/jobs.md, docs/architecture.md "Replicas").
    rebalance_cron: str = Field(
        default="0 * * * *",
        description="When the rebalancer runs: a crontab expression of 5 fields 'minute hour day-of-month month "
        "day-of-week', in UTC (default hourly, on the hour).",
    )
    engine_interval: timedelta = Field(
        default=timedelta(seconds=5), description="How often the job engine advances managed jobs (one tick)."
    )
    scheduler_lease_ttl: timedelta = Field(
        default=timedelta(seconds=60),
        description="Longest lease of a scheduled run (renewed while it runs; a job's lease is at most its "
        "interval): a replica killed mid-run blocks that job at most this long.",
    )
    rebalance_margin_fraction: float = Field(
        default=0.05, ge=0, description="Share of the remaining cost a move must save beyond its cost."
    )
    rebalance_margin_min_usd: float = Field(default=1.0, ge=0, description="The smallest such margin (USD).")
    rebalance_dwell: timedelta = Field(
        default=timedelta(hours=1),
        description="No move within this long of a job's previous move or recovery (1 h: the rebalancer's "
        "period and how long a preempted offer stays unavailable, so a job recovered on a dearer offer can go "
        "back; the margin is the hysteresis. 24 h never moved a job under `make run`: docs/migration.md).",
    )
    # Regions polled per cloud (None = the collector's built-in default list).
    aws_regions: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_AWS_REGIONS),
        description="AWS regions priced, and searched by the AWS provider (describe, list, interruptions).",
    )
    gcp_regions: Annotated[list[str] | None, NoDecode] = Field(
        default=None,
        description="GCP regions priced (None: the collector's default list); the GCP provider's zones when "
        "gcp_zones is None.",
    )
    azure_regions: Annotated[list[str] | None, NoDecode] = None
    gcp_project: str | None = Field(
        default=None, description="GCP project for zone/accelerator queries, and where the GCP provider launches."
    )
    azure_subscription_id: str | None = Field(
        default=None,
        description="Azure subscription for resource-SKU discovery and the Azure provider (None: neither).",
    )
    # Cloud providers: where jobs are launched (see docs/providers.md).
    provider: ProviderName = Field(
        default="sim",
        description="The provider the service launches jobs on by default: sim (the simulated cloud), local "
        "(subprocesses on this machine), aws, gcp or azure.",
    )
    providers: Annotated[list[ProviderName], NoDecode] = Field(
        default_factory=list,
        description="Every provider the service uses (launches on, and the reconciler sweeps); `provider` is "
        "always one of them. Empty: `provider` alone.",
    )
    sim_start: datetime = Field(
        default=datetime(2020, 3, 1, tzinfo=UTC),
        description="Where the service's simulated cloud's clock starts (tz-aware; default inside the seeded "
        "real prices: AWS spot Dec 2019 - Mar 2020, Azure Feb - Mar 2020).",
    )
    sim_time_scale: float = Field(
        default=600.0,
        gt=0,
        description="Simulated seconds per wall-clock second of the service's simulated cloud (600: ten "
        "simulated minutes per second, so a job visibly progresses, moves and finishes within minutes).",
    )
    sim_tick: timedelta = Field(
        default=timedelta(milliseconds=200),
        description="How often (wall clock) the service moves its simulated cloud's clock forward.",
    )
    sim_max_tick: timedelta | None = Field(
        default=None,
        description="The most one tick may move the service's simulated clock (simulated time): a tick that "
        "comes late (a loaded machine) moves this much, not scale x its wall time, and the clock runs slower "
        "than sim_time_scale while the service is behind. None: 5 nominal ticks (5 x sim_tick x "
        "sim_time_scale: 10 simulated minutes at the defaults).",
    )
    sim_clock: Literal["wall", "stepped"] = Field(
        default="wall",
        description="What moves the service's simulated clock: wall (sim_time_scale x the wall time, every "
        "sim_tick: make run) or stepped (lockstep, the kill drill: sim_step of simulated time at a time, only once "
        "every scheduled job due at the current simulated time and the work it started have run or wait on the "
        "clock, whatever the wall time; sim_time_scale, sim_tick and sim_max_tick are then unused; docs/jobs.md "
        "'Service time').",
    )
    sim_step: timedelta = Field(
        default=timedelta(seconds=30),
        description="With sim_clock=stepped: how much simulated time each step of the clock moves.",
    )
    sim_state_file: Path | None = Field(
        default=None,
        description="Where the service's simulated cloud keeps its state (clock, instances, their agents, "
        "draws), written at every change and read back at start, so a restarted service (even after kill -9) "
        "finds its instances as on a real cloud. None: the simulated cloud lives and dies with the process.",
    )
    sim_forget_ended_after: timedelta | None = Field(
        default=timedelta(days=1),
        description="How long after its end the service's simulated cloud keeps an ended instance (its record, "
        "agent and console) before it forgets it, as a real cloud does: describe then answers not found and a "
        "launch with its token launches anew. At least 1 hour (ENDED_RETENTION). Bounds the simulated cloud's "
        "memory in a long-running service (it kept every instance ever launched). None: keep them all.",
    )
    recovery_workers: int = Field(
        default=8,
        ge=1,
        description="How many recoveries one pass of the service's interruption watcher runs at once (each "
        "waits for its new copy's first progress): a reclaim that takes every instance of an offer is "
        "recovered side by side. 1: one job after another. Also the recovery cap per provider: a pass starts "
        "this many minus the recoveries already active in the database (those a restarted service resumes "
        "included), the next ones in order of the time their copies were lost.",
    )
    sim_seed: int = Field(
        default=0,
        description="Seed of the service's simulated cloud: each spot offer's reclaim times (drawn in simulated "
        "time from it and the offer) and its launches' capacity failures.",
    )
    sim_spot_hazard_per_hour: float | None = Field(
        default=None,
        ge=0,
        description="Reclaims per hour of every spot offer of the service's simulated cloud (a Poisson process "
        "per offer; every instance alive on the offer at a reclaim is preempted), instead of the hazard model's "
        "rates from the availability logs. The planner's hazards are unchanged. None: the hazard model's; 0: "
        "no reclaim. For drills (bench/kill_drill.py --spot-hazard).",
    )
    local_provider_dir: Path = Field(
        default=PROJECT_ROOT / "var" / "local-provider",
        description="State folder of the local provider (instances, tokens, events): a restarted service finds "
        "its instances there.",
    )
    aws_ami_ids: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="AMI id (or resolve:ssm:... reference) per region. A region not listed: aws_default_image.",
    )
    aws_default_image: str | None = Field(
        default=None,
        description="Image for regions without an AMI in aws_ami_ids. None: the latest Deep Learning Base OSS "
        "Nvidia Driver GPU AMI, resolved by EC2 from AWS's public SSM parameter.",
    )
    aws_interruption_queue_urls: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="SQS queue URL per region receiving the EventBridge 'EC2 Spot Instance Interruption "
        "Warning' rule (made by providers.aws.setup_interruption_queue). A region without one: its 2-minute "
        "notices are not read, only preemptions seen in instance states.",
    )
    aws_instance_profile: str | None = Field(
        default=None,
        description="IAM instance profile (name or ARN) the job's instances run with, e.g. to reach the "
        "checkpoint bucket. None: no instance profile.",
    )
    aws_security_group_ids: Annotated[dict[str, list[str]], NoDecode] = Field(
        default_factory=dict,
        description="Security group ids per region (space-separated within a region). A region not listed: "
        "the VPC's default group.",
    )
    aws_subnet_ids: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="Subnet per availability zone (us-east-1a=subnet-...) or per region (used when the offer's "
        "zone has none; it must then be in that zone, or the offer regional). Not listed: the default VPC.",
    )
    aws_key_name: str | None = Field(default=None, description="EC2 key pair for SSH access. None: no key pair.")
    gcp_zones: Annotated[list[str] | None, NoDecode] = Field(
        default=None,
        description="Zones the GCP provider watches and launches regional offers in. None: every zone of "
        "gcp_regions, or of the project when gcp_regions is None (read from the Zones API).",
    )
    gcp_image: str | None = Field(
        default=None,
        description="Boot image (projects/<p>/global/images/family/<f> or an image URI). None: Google's Deep "
        "Learning VM family with CUDA.",
    )
    gcp_network: str = Field(default="global/networks/default", description="VPC network of the instances.")
    gcp_subnetwork: str | None = Field(
        default=None, description="Subnetwork (regions/<r>/subnetworks/<s>). None: the network's auto subnet."
    )
    gcp_service_account_email: str | None = Field(
        default=None,
        description="Service account the instances run as (cloud-platform scope), e.g. to reach the checkpoint "
        "bucket. None: no service account.",
    )
    gcp_external_ip: bool = Field(default=True, description="Give each instance an ephemeral external IP.")
    azure_resource_group: str | None = Field(
        default=None, description="Resource group the Azure provider creates, lists and deletes VMs and NICs in."
    )
    azure_subnet_ids: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="Subnet resource id per region (/subscriptions/.../virtualNetworks/<v>/subnets/<s>); the "
        "Azure provider launches only in regions listed here.",
    )
    azure_image: str | None = Field(
        default=None,
        description="Image URN publisher:offer:sku:version or resource id. None: "
        "microsoft-dsvm:ubuntu-hpc:2204:latest (Ubuntu HPC 22.04 with NVIDIA drivers).",
    )
    azure_ssh_public_key: str | None = Field(
        default=None,
        description="The VMs' admin SSH public key: the key itself (ssh-ed25519 AAAA...) or the path of a .pub "
        "file. Required by the Azure provider (password login is disabled).",
    )
    azure_admin_username: str = Field(default="costopt", description="Admin user of the VMs.")
    # Endpoints: None means each SDK's real endpoint; tests point these at local fakes.
    aws_endpoint_url: str | None = None
    gcp_billing_endpoint: str | None = None
    gcp_compute_endpoint: str | None = None
    azure_arm_endpoint: str | None = Field(
        default=None, description="Azure Resource Manager endpoint. None: the public cloud's (management.azure.com)."
    )
    azure_retail_prices_url: str = "https://prices.azure.com/api/retail/prices"
    http_timeout_s: float = 30.0
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    worker_max_rss_mb: float | None = Field(
        default=None,
        ge=64,
        description="`costopt serve --workers N` (N >= 2): a worker process whose resident memory passes this "
        "many MB (after its first minute) is replaced: its replacement starts and serves first, then the old "
        "one answers its in-flight requests and exits, one worker at a time (as uWSGI's reload-on-rss). Bounds "
        "the allocators' growth under sustained traffic (docs/reliability.md, Soak); set it above a worker's "
        "size after start-up (~300 MB with the simulated cloud's seeded prices). None: never. Ignored, with "
        "a warning, by one process (nothing would take its place).",
    )
    job_id_seed: str | None = Field(
        default=None,
        description="Drills only (bench/kill_drill.py): a job submitted with an Idempotency-Key gets an id "
        "derived from this seed, its team's name and the key (costopt.jobs.records.seeded_job_id), the same in "
        "every run with the seed, so runs compare job by job; so do a fleet leased with an Idempotency-Key, its "
        "first instances, their replacements and their launch tokens (costopt.fleets.model.seeded_id). None: random "
        "ids (a service's default).",
    )
    gc_freeze: bool = Field(
        default=True,
        description="At the end of the service's start-up, freeze the objects alive then out of the garbage "
        "collector's full passes (api/heap.py: otherwise 100-450 ms pauses of a worker's requests under load, the "
        "REST p99). The test suite turns it off (its processes build and drop hundreds of apps).",
    )
    # The CLI as a client of the service (costopt jobs ..., costopt admin ...).
    api_url: str = Field(
        default="http://127.0.0.1:8000", description="Where the CLI's job and admin commands reach the service."
    )
    api_key: str | None = Field(
        default=None,
        description="The API key the CLI sends (Authorization: Bearer). `make run` prints the first admin key once; "
        "`costopt admin create-team NAME` prints a team key.",
    )

    api_max_body_bytes: int = Field(
        default=64 * 1024, ge=1024, description="Largest request body the REST API accepts (bytes); larger -> 413."
    )
    # Per-key rate limit of the REST API (a token bucket per key and process; docs/api.md).
    rate_limit_per_s: float = Field(
        default=100.0,
        ge=0,
        description="Requests per second one API key may send, sustained, to one service process (0: no limit); "
        "over it -> 429 with Retry-After.",
    )
    rate_limit_burst: int = Field(default=300, ge=1, description="Requests one API key may send at once (the bucket).")
    # Where a team's jobs may checkpoint and which images they may name, unless an admin set the team's own
    # lists (PATCH /v1/admin/teams/{id}). Empty: no checkpoint_uri or image may be given (the job checkpoints
    # under checkpoint_root, and runs the provider's image).
    allowed_checkpoint_prefixes: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated URI prefixes every team's checkpoint_uri may start with (each ending in '/').",
    )
    allowed_image_prefixes: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated prefixes every team's image may start with (e.g. ghcr.io/acme/).",
    )
    checkpoint_root: str = Field(
        default="file:///tmp/costopt-checkpoints",
        description="Where a managed job's checkpoints go when its submission names no checkpoint_uri: "
        "<checkpoint_root>/<job id>.",
    )
    launch_attempts: int = Field(
        default=3,
        ge=1,
        description="How many times the job engine launches a job (and recovers it in a row) before it fails it.",
    )
    cancel_timeout: timedelta = Field(
        default=timedelta(minutes=5),
        description="How long the job engine waits for a cancelled job's checkpoint before terminating it.",
    )
    engine_workers: int = Field(
        default=4, ge=0, description="Worker threads of the job engine (starts, recoveries); 0 runs them in the tick."
    )
    report_baselines: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=lambda: {"*": "aws/us-east-1"},
        description="Savings reports: where each team's on-demand baseline runs. Keys: a team id or name, or * "
        "(every team), optionally :<gpus>; values cloud/region (the planner picks the cheapest on-demand instance "
        "there for the job at its submission) or cloud/region/instance_type. JSON object or key=value pairs.",
    )
    fleet_executor_enabled: bool | None = Field(
        default=None,
        description="Run the fleets' round executor in this service (once per tick across replicas); None: "
        "with the migration jobs (COSTOPT_MIGRATION_JOBS_ENABLED).",
    )
    fleet_tick: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        description="Seconds between passes of the fleets' round executor (a round starts at the first pass at "
        "or after its boundary).",
    )
    fleet_worker_poll: float = Field(
        default=0.5, gt=0, le=600, description="Seconds between a fleet worker's syncs with the service."
    )
    fleet_dead_after: float = Field(
        default=30.0,
        gt=0,
        description="A fleet instance whose worker has not synced for this many seconds is lost (its jobs resume "
        "elsewhere from their last checkpoint; a replacement is launched).",
    )
    fleet_boot_timeout: float = Field(
        default=600.0, gt=0, description="Seconds a new fleet instance's worker has to sync for the first time."
    )
    fleet_restart_overhead: float = Field(
        default=1.5,
        ge=0,
        description="Seconds a fleet job loses when a round moves it (its copy checkpoints, exits and starts "
        "again elsewhere; 1.4-1.5 s measured by `costopt gavel validate` with local workers). Heterogeneity-aware "
        "policies keep a running job on its GPUs unless a challenger's priority beats it by 1 + 6 x this / the "
        "fleet's round_s, as in the simulator. 0: no hysteresis.",
    )
    service_url: str = Field(
        default="http://127.0.0.1:8000",
        description="The URL fleet workers reach this service at (they sync over HTTP). Cloud instances cannot "
        "reach a loopback URL (the default): with one, the fleet instances of aws, gcp and azure are not launched "
        "and wait, saying so (local and sim workers run on this machine).",
    )
    fleet_worker_command: str | None = Field(
        default=None,
        description="The command a fleet instance runs (default: python3 -m costopt.agent.worker; on the local "
        "provider, this service's own Python).",
    )

    def resolved_throughput_file(self) -> Path | None:
        """The throughput file to load (None: no file configured and no data folder)."""
        if self.throughput_file is not None:
            return self.throughput_file
        if self.data_dir is None:
            return None
        return self.data_dir / "gavel" / "simulation_throughputs.json"

    def resolved_availability_logs(self) -> Path | None:
        if self.availability_logs_dir is not None:
            return self.availability_logs_dir
        if self.data_dir is None:
            return None
        return self.data_dir / "raw" / "training_on_a_dime" / "logs"

    def all_providers(self) -> list[str]:
        """``provider`` then every other name of ``providers``, each once."""
        return list(dict.fromkeys([self.provider, *self.providers]))

    @field_validator(
        "aws_regions",
        "gcp_regions",
        "azure_regions",
        "gcp_zones",
        "providers",
        "allowed_checkpoint_prefixes",
        "allowed_image_prefixes",
        mode="before",
    )
    @classmethod
    def _split_csv(cls, v: object) -> object:
        return parse_list(v)

    @field_validator(
        "aws_ami_ids",
        "aws_interruption_queue_urls",
        "aws_subnet_ids",
        "azure_subnet_ids",
        "report_baselines",
        mode="before",
    )
    @classmethod
    def _mapping(cls, v: object) -> object:
        return parse_mapping(v)

    @field_validator("rebalance_cron")
    @classmethod
    def _crontab(cls, v: str) -> str:
        return check_crontab(v)

    @field_validator("sim_start")
    @classmethod
    def _sim_start_aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("COSTOPT_SIM_START must carry a time zone, e.g. 2020-03-01T00:00:00Z")
        return value.astimezone(UTC)

    @field_validator("sim_tick")
    @classmethod
    def _sim_tick_positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError(f"COSTOPT_SIM_TICK must be > 0, got {value}")
        return value

    @field_validator("sim_step")
    @classmethod
    def _sim_step_positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError(f"COSTOPT_SIM_STEP must be > 0, got {value}")
        return value

    @field_validator("sim_max_tick")
    @classmethod
    def _sim_max_tick_positive(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError(
                f"COSTOPT_SIM_MAX_TICK must be > 0 (simulated seconds or ISO 8601, e.g. PT10M), got {value}"
            )
        return value

    @field_validator("engine_interval", "scheduler_lease_ttl")
    @classmethod
    def _positive(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError(f"must be a positive duration (seconds or ISO 8601 like PT30S), got {v}")
        return v

    @field_validator("report_baselines")
    @classmethod
    def _report_baselines(cls, v: dict[str, str]) -> dict[str, str]:
        from costopt.reports.references import ReferenceRules  # checked at start-up (a light module)

        ReferenceRules(v)
        return v

    @field_validator("aws_security_group_ids", mode="before")
    @classmethod
    def _mapping_of_lists(cls, v: object) -> object:
        return parse_mapping(v, list_values=True)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
