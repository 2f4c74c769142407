"""Credentials per cloud, found without the network; a cloud without them has its collectors off, said in
one log line, and the service schedules no collector job for it."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import api.credentials as credentials
from api.app import create_app
from api.credentials import SOURCE_CLOUDS, available_clouds, collector_names
from api.metrics import PRICE_COLLECTORS_ENABLED
from costopt.domain import Cloud
from costopt.settings import Settings
from pricing.base import PriceSource
from pricing.collect import CollectOutcome
from pricing.sources import SOURCES
from pricing.store import PriceStore

CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_EC2_METADATA_DISABLED",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "CLOUDSDK_CONFIG",
    "AZURE_CLIENT_ID",
    "AZURE_TENANT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_CLIENT_CERTIFICATE_PATH",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_USERNAME",
    "AZURE_PASSWORD",
    "AZURE_CONFIG_DIR",
    "IDENTITY_ENDPOINT",
    "MSI_ENDPOINT",
)


@pytest.fixture
def bare(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A fresh machine: no credential variable, an empty home, no cloud firmware identity, no network
    (any socket connection attempted while the test runs fails it). Returns the home folder."""
    for name in CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    dmi = tmp_path / "dmi"
    dmi.mkdir()
    monkeypatch.setattr(credentials, "DMI_DIR", dmi)
    monkeypatch.setattr(credentials, "XEN_UUID", tmp_path / "no-hypervisor-uuid")

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"credential detection tried the network: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    return home


def _settings(tmp_path: Path, **kw: Any) -> Settings:
    return Settings(
        database_url=f"sqlite:///{tmp_path / 'costopt.db'}",
        seed_on_start=False,
        collectors_enabled=True,
        migration_jobs_enabled=False,
        **kw,
    )


def _credential_lines(caplog: pytest.LogCaptureFixture) -> dict[str, str]:
    lines = [r.getMessage() for r in caplog.records if r.name == "costopt.credentials"]
    by_cloud = {line.split(":", 1)[0]: line for line in lines}
    assert len(by_cloud) == len(lines), f"more than one line for a cloud: {lines}"
    return by_cloud


def _scheduled(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The job ids the service's start-up schedules (the scheduler is started paused: nothing runs)."""
    start = BackgroundScheduler.start
    monkeypatch.setattr(BackgroundScheduler, "start", lambda self, paused=False: start(self, paused=True))
    app = create_app(settings)
    with TestClient(app):
        return {job.id for job in app.state.scheduler.get_jobs()}


def test_every_registered_source_says_which_credentials_it_needs() -> None:
    assert set(SOURCE_CLOUDS) == {name for name, _ in SOURCES.items()}


def test_a_fresh_machine_has_no_credentials_for_any_cloud(bare: Path, tmp_path: Path) -> None:
    found = available_clouds(_settings(tmp_path))
    assert set(found) == {Cloud.AWS, Cloud.GCP, Cloud.AZURE}
    assert all(reason == "no credentials found" for reason in found.values())


def test_without_credentials_one_line_per_cloud_and_no_collector_job_for_it(
    bare: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    jobs = _scheduled(_settings(tmp_path), monkeypatch)
    assert not {j for j in jobs if j.startswith(("collect:aws", "collect:gcp", "collect:azure-skus"))}
    assert "collect:azure" in jobs  # the public Retail Prices API needs no credentials
    lines = _credential_lines(caplog)
    assert set(lines) == {"aws", "gcp", "azure"}
    assert "AWS_PROFILE" in lines["aws"] and "AWS_ACCESS_KEY_ID" in lines["aws"]
    assert "aws-spot, aws-on-demand, aws-catalog" in lines["aws"]
    assert "GOOGLE_APPLICATION_CREDENTIALS" in lines["gcp"] and "are off: gcp" in lines["gcp"]
    assert "az login" in lines["azure"] and "azure needs none and runs" in lines["azure"]
    assert "COSTOPT_AZURE_SUBSCRIPTION_ID" in lines["azure"]
    other = [r.getMessage() for r in caplog.records if r.name != "costopt.credentials"]
    assert not [m for m in other if "credential" in m.lower()], other
    metric = PRICE_COLLECTORS_ENABLED.labels
    assert (metric(cloud="aws")._value.get(), metric(cloud="gcp")._value.get()) == (0, 0)
    assert metric(cloud="azure")._value.get() == 1


def test_fake_aws_environment_credentials_schedule_the_aws_collectors(
    bare: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKEFAKEFAKE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret")
    caplog.set_level(logging.INFO)
    jobs = _scheduled(_settings(tmp_path), monkeypatch)
    assert {"collect:aws-spot", "collect:aws-on-demand", "collect:aws-catalog", "collect:azure"} <= jobs
    assert "collect:gcp" not in jobs
    assert set(_credential_lines(caplog)) == {"gcp", "azure"}
    assert PRICE_COLLECTORS_ENABLED.labels(cloud="aws")._value.get() == 1


def test_collectors_disabled_check_nothing(
    bare: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(_settings(tmp_path).model_copy(update={"collectors_enabled": False}))
    with TestClient(app):
        assert app.state.scheduler is None
    assert not _credential_lines(caplog)


# -- each cloud's detection -----------------------------------------------------------------------


def test_aws_profile_in_the_shared_files_counts(bare: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (bare / ".aws").mkdir()
    (bare / ".aws" / "credentials").write_text("[team]\naws_access_key_id = AKIA1\naws_secret_access_key = s\n")
    assert available_clouds(_settings(tmp_path))[Cloud.AWS] == "no credentials found"  # no default profile
    monkeypatch.setenv("AWS_PROFILE", "team")
    assert available_clouds(_settings(tmp_path))[Cloud.AWS] is None
    monkeypatch.setenv("AWS_PROFILE", "nobody")
    reason = available_clouds(_settings(tmp_path))[Cloud.AWS]
    assert reason is not None and "nobody" in reason


def test_aws_container_and_instance_roles_count_without_calling_them(
    bare: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path)
    assert available_clouds(settings, {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/creds"})[Cloud.AWS] is None
    (credentials.DMI_DIR / "sys_vendor").write_text("Amazon EC2\n")
    assert available_clouds(settings, {})[Cloud.AWS] is None
    assert available_clouds(settings, {"AWS_EC2_METADATA_DISABLED": "true"})[Cloud.AWS] == "no credentials found"


def test_gcp_application_default_credentials(bare: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(tmp_path)
    gcloud = tmp_path / "gcloud"
    gcloud.mkdir()
    adc = {"type": "authorized_user", "client_id": "c", "client_secret": "s", "refresh_token": "r"}
    (gcloud / "application_default_credentials.json").write_text(json.dumps(adc))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(gcloud))  # google.auth.default() reads the process environment
    assert available_clouds(settings)[Cloud.GCP] is None
    monkeypatch.delenv("CLOUDSDK_CONFIG")
    broken = tmp_path / "key.json"
    broken.write_text("{not json")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(broken))
    reason = available_clouds(settings)[Cloud.GCP]
    assert reason is not None and "unusable" in reason
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    assert available_clouds(settings)[Cloud.GCP] == "no credentials found"
    (credentials.DMI_DIR / "product_name").write_text("Google Compute Engine\n")
    assert available_clouds(settings)[Cloud.GCP] is None


def test_azure_environment_cli_cache_and_vm(bare: Path, tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    sp = {"AZURE_CLIENT_ID": "c", "AZURE_TENANT_ID": "t", "AZURE_CLIENT_SECRET": "s"}
    assert available_clouds(settings, sp)[Cloud.AZURE] is None
    assert available_clouds(settings, {"AZURE_CLIENT_ID": "c", "AZURE_TENANT_ID": "t"})[Cloud.AZURE] is not None
    (bare / ".azure").mkdir()
    (bare / ".azure" / "msal_token_cache.json").write_text("{}")
    assert available_clouds(settings, {})[Cloud.AZURE] is None
    (bare / ".azure" / "msal_token_cache.json").unlink()
    assert available_clouds(settings, {})[Cloud.AZURE] is not None
    (credentials.DMI_DIR / "chassis_asset_tag").write_text("7783-7084-3265-9085\n")
    assert available_clouds(settings, {})[Cloud.AZURE] is None


def test_collector_names_keep_configured_sources_of_clouds_with_credentials(bare: Path, tmp_path: Path) -> None:
    settings = _settings(tmp_path, azure_subscription_id="00000000-0000-0000-0000-000000000000")
    names = collector_names(settings, {Cloud.AWS: "no credentials found", Cloud.GCP: None, Cloud.AZURE: None})
    assert names == ["gcp", "azure", "azure-skus"]
    names = collector_names(settings, {Cloud.AWS: None, Cloud.GCP: None, Cloud.AZURE: "no credentials found"})
    assert "azure-skus" not in names and "azure" in names and "aws-spot" in names


def test_cli_collect_without_source_skips_clouds_without_credentials(
    bare: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``costopt prices collect --once`` chooses its sources as the service does; ``--source`` still
    runs exactly what was named. (The fetches themselves are replaced: no test reaches a cloud.)"""
    import pricing.collect
    from api.cli.main import app
    from costopt.settings import get_settings

    ran: list[list[str]] = []

    def collect_once(store: PriceStore, sources: Sequence[PriceSource]) -> list[CollectOutcome]:
        ran.append([s.name for s in sources])
        return []

    monkeypatch.setattr(pricing.collect, "collect_once", collect_once)
    monkeypatch.setenv("COSTOPT_DATABASE_URL", f"sqlite:///{tmp_path / 'costopt.db'}")
    get_settings.cache_clear()
    try:
        caplog.set_level(logging.WARNING)
        result = CliRunner().invoke(app, ["prices", "collect", "--once", "-f", "json"])
        assert result.exit_code == 0, result.output
        assert ran == [["azure"]]
        assert set(_credential_lines(caplog)) == {"aws", "gcp", "azure"}
        caplog.clear()
        result = CliRunner().invoke(app, ["prices", "collect", "--once", "--source", "aws-spot", "-f", "json"])
        assert result.exit_code == 0, result.output
        assert ran[-1] == ["aws-spot"] and not _credential_lines(caplog)
    finally:
        get_settings.cache_clear()
