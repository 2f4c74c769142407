"""The one settings object of costopt (environment prefix ``COSTOPT_``).

Every component receives plain values taken from :class:`Settings` by the composition root
(``api/``); nothing deeper reads the environment. Cloud credentials are never settings: each SDK
finds them through its own default chain (AWS profile/env/instance role, GCP ADC, Azure
DefaultAzureCredential).
"""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

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


class Settings(BaseSettings):
    """Runtime configuration. Durations are ``timedelta`` (env: seconds or ISO 8601, e.g. ``PT6H``)."""

    model_config = SettingsConfigDict(env_prefix="COSTOPT_", env_file=".env", extra="ignore")

    database_url: str = Field(
        default=f"sqlite:///{PROJECT_ROOT / 'var' / 'costopt.db'}",
        description="SQLAlchemy URL. SQLite file by default; postgresql+psycopg://... for PostgreSQL.",
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
    collectors_enabled: bool = True
    seed_on_start: bool = Field(
        default=True, description="Seed an empty store from data_dir and the curated catalog at startup."
    )
    # Regions polled per cloud (None = the collector's built-in default list).
    aws_regions: list[str] = Field(default_factory=lambda: list(DEFAULT_AWS_REGIONS))
    gcp_regions: list[str] | None = None
    azure_regions: list[str] | None = None
    gcp_project: str | None = Field(default=None, description="GCP project for zone/accelerator queries.")
    azure_subscription_id: str | None = Field(
        default=None, description="Azure subscription for resource-SKU discovery (None: not scheduled)."
    )
    # Endpoints: None means each SDK's real endpoint; tests point these at local fakes.
    aws_endpoint_url: str | None = None
    gcp_billing_endpoint: str | None = None
    gcp_compute_endpoint: str | None = None
    azure_retail_prices_url: str = "https://prices.azure.com/api/retail/prices"
    http_timeout_s: float = 30.0
    api_host: str = "127.0.0.1"
    api_port: int = 8000

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

    @field_validator("aws_regions", "gcp_regions", "azure_regions", mode="before")
    @classmethod
    def _split_csv(cls, v: object) -> object:
        if isinstance(v, str) and not v.lstrip().startswith("["):
            return [part.strip() for part in v.split(",") if part.strip()]
        return v


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
