"""The providers' settings: defaults, and how lists and mappings are read from the environment."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from costopt.settings import PROJECT_ROOT, Settings, parse_mapping


def test_defaults_run_the_simulated_cloud_with_local_state_under_var() -> None:
    settings = Settings()
    assert settings.provider == "sim"
    assert settings.all_providers() == ["sim"]
    assert settings.local_provider_dir == PROJECT_ROOT / "var" / "local-provider"
    assert (settings.aws_ami_ids, settings.aws_interruption_queue_urls, settings.aws_subnet_ids) == ({}, {}, {})
    assert settings.aws_default_image is None and settings.gcp_image is None and settings.azure_image is None
    assert settings.azure_admin_username == "costopt"


def test_mappings_are_read_from_key_value_pairs_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSTOPT_AWS_AMI_IDS", " us-east-1=ami-0abc , us-west-2=resolve:ssm:/my/ami ")
    monkeypatch.setenv(
        "COSTOPT_AWS_INTERRUPTION_QUEUE_URLS",
        '{"us-east-1": "https://sqs.us-east-1.amazonaws.com/123456789012/costopt-spot-interruptions"}',
    )
    monkeypatch.setenv("COSTOPT_AWS_SECURITY_GROUP_IDS", "us-east-1=sg-1 sg-2,us-west-2=sg-3")
    monkeypatch.setenv("COSTOPT_AWS_SUBNET_IDS", "us-east-1a=subnet-a,us-east-1=subnet-r")
    monkeypatch.setenv("COSTOPT_AZURE_SUBNET_IDS", "eastus=/subscriptions/s/resourceGroups/g/providers/x/subnets/a")
    settings = Settings()
    assert settings.aws_ami_ids == {"us-east-1": "ami-0abc", "us-west-2": "resolve:ssm:/my/ami"}
    assert settings.aws_interruption_queue_urls == {
        "us-east-1": "https://sqs.us-east-1.amazonaws.com/123456789012/costopt-spot-interruptions"
    }
    assert settings.aws_security_group_ids == {"us-east-1": ["sg-1", "sg-2"], "us-west-2": ["sg-3"]}
    assert settings.aws_subnet_ids == {"us-east-1a": "subnet-a", "us-east-1": "subnet-r"}
    assert settings.azure_subnet_ids == {"eastus": "/subscriptions/s/resourceGroups/g/providers/x/subnets/a"}


def test_a_value_may_hold_equal_signs_and_json_lists_work_in_list_mappings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSTOPT_AWS_INTERRUPTION_QUEUE_URLS", "us-east-1=https://q.example/?a=b")
    monkeypatch.setenv("COSTOPT_AWS_SECURITY_GROUP_IDS", '{"us-east-1": ["sg-1", "sg-2"]}')
    settings = Settings()
    assert settings.aws_interruption_queue_urls == {"us-east-1": "https://q.example/?a=b"}
    assert settings.aws_security_group_ids == {"us-east-1": ["sg-1", "sg-2"]}


@pytest.mark.parametrize("blank", ["", " ", ",", "{}"])
def test_a_blank_mapping_is_empty(monkeypatch: pytest.MonkeyPatch, blank: str) -> None:
    monkeypatch.setenv("COSTOPT_AWS_AMI_IDS", blank)
    assert Settings().aws_ami_ids == {}


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("us-east-1", "key=value pairs"),
        ("=ami-1", "key=value pairs"),
        ("us-east-1=ami-1,us-east-1=ami-2", "given twice"),
        ('{"us-east-1": ', "not a JSON object"),
        ('{"us-east-1": 3}', "string"),
    ],
)
def test_a_malformed_mapping_is_refused_naming_the_setting_and_the_format(
    monkeypatch: pytest.MonkeyPatch, value: str, why: str
) -> None:
    monkeypatch.setenv("COSTOPT_AWS_AMI_IDS", value)
    with pytest.raises(ValidationError, match=why) as caught:
        Settings()
    assert "aws_ami_ids" in str(caught.value)


def test_parse_mapping_leaves_mappings_alone_and_splits_list_values() -> None:
    assert parse_mapping({"a": "b"}) == {"a": "b"}
    assert parse_mapping("a=x y", list_values=True) == {"a": ["x", "y"]}
    assert parse_mapping("a=x y") == {"a": "x y"}


def test_lists_are_comma_separated_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSTOPT_AWS_REGIONS", "us-east-1, us-west-2,")
    monkeypatch.setenv("COSTOPT_GCP_ZONES", '["us-central1-a", "us-central1-b"]')
    monkeypatch.setenv("COSTOPT_GCP_REGIONS", "us-central1")
    settings = Settings()
    assert settings.aws_regions == ["us-east-1", "us-west-2"]
    assert settings.gcp_zones == ["us-central1-a", "us-central1-b"]
    assert settings.gcp_regions == ["us-central1"]


def test_the_provider_is_one_of_five_and_providers_add_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSTOPT_PROVIDER", "local")
    monkeypatch.setenv("COSTOPT_PROVIDERS", "aws,local,gcp")
    settings = Settings()
    assert settings.all_providers() == ["local", "aws", "gcp"]
    monkeypatch.setenv("COSTOPT_PROVIDER", "ibm")
    with pytest.raises(ValidationError, match="provider"):
        Settings()
    monkeypatch.setenv("COSTOPT_PROVIDER", "sim")
    monkeypatch.setenv("COSTOPT_PROVIDERS", "aws,oracle")
    with pytest.raises(ValidationError, match="providers"):
        Settings()
