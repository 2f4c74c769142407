"""providers.factory and api.wiring: every provider built from the settings alone (plus the credentials a
test must inject), each making real calls against its local stand-in: moto's server, the GCP and Azure
fakes, this machine, and the simulated cloud over a price store."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials

from api.wiring import build_cloud_provider, build_cloud_providers
from costopt.cloud import AuthError, CapacityError, InstanceState, LaunchSpec, ProviderConfigError
from costopt.domain import Cloud, Market, OfferKey
from costopt.ledger import StepPrices
from costopt.settings import Settings
from providers.aws import TOKEN_TAG, AwsProvider
from providers.azure import AzureProvider
from providers.factory import build_provider, build_providers
from providers.gcp import GcpProvider
from providers.local import LocalProvider
from providers.sim import SimCloud
from tests.aws_support import REGION
from tests.price_support import step_prices
from tests.providers.azure_fake import RG, SSH_KEY, SUBNET, SUBSCRIPTION, FakeArm, FakeCredential
from tests.providers.gcp_fake import PROJECT, ZONE, FakeCompute

TAGS = {"costopt-job": "factory", "costopt-epoch": "1"}


def spec(offer: OfferKey) -> LaunchSpec:
    return LaunchSpec(offer=offer, command=("true",), env={"COSTOPT_JOB_ID": "factory"}, tags=TAGS)


def test_aws_from_the_settings_and_the_sdks_default_credential_chain(
    moto_url: str, dl_ami: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")  # what a deployment gives the SDK, not costopt
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    settings = Settings(provider="aws", aws_regions=[REGION], aws_endpoint_url=moto_url, aws_ami_ids={REGION: dl_ami})
    provider = build_provider(settings)
    assert isinstance(provider, AwsProvider)
    token = f"factory-{uuid.uuid4().hex[:8]}"
    inst = provider.launch(spec(OfferKey(Cloud.AWS, REGION, "us-east-1a", "g5.xlarge", Market.SPOT)), token)
    listed = [i for i in provider.list(TAGS) if i.tags.get(TOKEN_TAG) == token]
    assert [i.instance_id for i in listed] == [inst.instance_id]
    provider.terminate(inst.instance_id)


def test_aws_without_credentials_is_an_auth_error_at_the_first_call_not_at_build(moto_url: str) -> None:
    provider = build_provider(Settings(aws_regions=[REGION], aws_endpoint_url=moto_url), name="aws")
    with pytest.raises(AuthError, match="credentials"):
        provider.list({})


def test_gcp_from_the_settings(fake_compute: FakeCompute) -> None:
    settings = Settings(provider="gcp", gcp_project=PROJECT, gcp_compute_endpoint=fake_compute.url, gcp_zones=[ZONE])
    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    provider = build_provider(settings, overrides={"credentials": credentials, "poll_interval_s": 0.01})
    assert isinstance(provider, GcpProvider)
    inst = provider.launch(spec(OfferKey(Cloud.GCP, "us-central1", ZONE, "g2-standard-4", Market.SPOT)), "tok-f")
    assert inst.state is InstanceState.RUNNING
    assert [i.instance_id for i in provider.list(TAGS)] == [inst.instance_id]
    with pytest.raises(ProviderConfigError, match="COSTOPT_GCP_PROJECT"):
        build_provider(Settings(gcp_project=None), name="gcp")


def test_azure_from_the_settings(arm: FakeArm, ca_file: str, tmp_path: Path) -> None:
    key_file = tmp_path / "id_ed25519.pub"
    key_file.write_text(SSH_KEY + "\n")
    settings = Settings(
        provider="azure",
        azure_subscription_id=SUBSCRIPTION,
        azure_resource_group=RG,
        azure_subnet_ids={"eastus": SUBNET},
        azure_ssh_public_key=str(key_file),
        azure_arm_endpoint=arm.url,
    )
    overrides = {
        "credential": FakeCredential(),
        "client_kwargs": {"connection_verify": ca_file, "retry_total": 0, "polling_interval": 0},
    }
    provider = build_provider(settings, overrides=overrides)
    assert isinstance(provider, AzureProvider)
    inst = provider.launch(spec(OfferKey(Cloud.AZURE, "eastus", "", "Standard_NC6s_v3", Market.SPOT)), "tok-f")
    assert inst.state is InstanceState.RUNNING
    assert [i.instance_id for i in provider.list(TAGS)] == [inst.instance_id]
    assert arm.puts[0][1]["properties"]["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"] == SSH_KEY
    with pytest.raises(ProviderConfigError, match="COSTOPT_AZURE_RESOURCE_GROUP"):
        build_provider(settings.model_copy(update={"azure_resource_group": None}), name="azure")


def test_local_from_the_settings(tmp_path: Path) -> None:
    provider = build_provider(Settings(provider="local", local_provider_dir=tmp_path / "local"))
    assert isinstance(provider, LocalProvider)
    inst = provider.launch(spec(OfferKey(Cloud.LOCAL, "local", "", "cpu-1", Market.ON_DEMAND)), "tok-f")
    assert (tmp_path / "local" / "instances" / inst.instance_id / "record.json").is_file()
    assert [i.instance_id for i in provider.list(TAGS)] == [inst.instance_id]
    provider.terminate(inst.instance_id)


def _prices(offer: OfferKey, since: datetime) -> StepPrices:
    return step_prices([(offer, since, 1.0)], {(offer.cloud.value, offer.instance_type): ("v100", 1.0)})


def test_sim_needs_prices_and_runs_over_them_from_the_sim_start() -> None:
    with pytest.raises(ProviderConfigError, match="needs prices"):
        build_provider(Settings(provider="sim"))
    offer = OfferKey(Cloud.AWS, REGION, "us-east-1a", "p3.2xlarge", Market.SPOT)
    start = datetime(2020, 2, 20, 12, tzinfo=UTC)
    provider = build_provider(Settings(sim_start=start), prices=_prices(offer, start - timedelta(days=1)))
    assert isinstance(provider, SimCloud)
    assert provider.now() == start
    assert build_provider(Settings(), prices=_prices(offer, start)).now() == Settings().sim_start  # type: ignore[attr-defined]
    inst = provider.launch(spec(offer), "tok-f")
    assert [i.instance_id for i in provider.list(TAGS)] == [inst.instance_id]
    # the service's cloud forgets ended instances (COSTOPT_SIM_FORGET_ENDED_AFTER, a day by default)
    assert provider.config.forget_ended_after == timedelta(days=1)
    keep_all = build_provider(Settings(sim_forget_ended_after=None), prices=_prices(offer, start))
    assert keep_all.config.forget_ended_after is None  # type: ignore[attr-defined]


def test_an_unknown_name_says_which_variable_to_fix() -> None:
    with pytest.raises(ProviderConfigError, match="COSTOPT_PROVIDER"):
        build_provider(Settings(), name="oracle")


def test_build_providers_builds_the_default_then_every_other_one(tmp_path: Path, fake_compute: FakeCompute) -> None:
    settings = Settings(
        provider="local",
        providers=["gcp", "local"],
        local_provider_dir=tmp_path / "local",
        gcp_project=PROJECT,
        gcp_compute_endpoint=fake_compute.url,
        gcp_zones=[ZONE],
    )
    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    built = build_providers(settings, overrides={"gcp": {"credentials": credentials}})
    assert list(built) == [Cloud.LOCAL, Cloud.GCP]
    assert isinstance(built[Cloud.LOCAL], LocalProvider) and isinstance(built[Cloud.GCP], GcpProvider)
    assert all(p.list({}) == [] for p in built.values())  # one real call each
    with pytest.raises(ProviderConfigError, match="COSTOPT_GCP_PROJECT"):
        build_providers(settings.model_copy(update={"gcp_project": None}))


def test_wiring_runs_the_sim_over_the_price_store(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'costopt.db'}",
        availability_logs_dir=tmp_path / "no-logs",
        providers=["local"],
        local_provider_dir=tmp_path / "local",
    )
    sim = build_cloud_provider(settings)
    assert isinstance(sim, SimCloud)
    assert sim.list({}) == []
    offer = OfferKey(Cloud.AWS, REGION, "us-east-1a", "p3.2xlarge", Market.SPOT)
    with pytest.raises(CapacityError, match="no price"):  # an empty store sells nothing
        sim.launch(spec(offer), "tok-f")
    built = build_cloud_providers(settings)
    assert list(built) == [Cloud.SIM, Cloud.LOCAL]
    assert isinstance(built[Cloud.LOCAL], LocalProvider)
