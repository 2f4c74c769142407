"""GPU instance catalog discovery: moto's EC2 server on loopback (real ``describe_instance_types``
data for the families moto knows) and the Stubber for pagination and damaged records."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from botocore.stub import Stubber

from costopt.domain import Cloud, InstanceType
from costopt.errors import MalformedInput, SourceUnavailable
from costopt.settings import Settings
from pricing.aws import AWS_GPU_FAMILIES, AwsInstanceTypeSource
from pricing.aws_pages import family_of, parse_instance_type_record, parse_instance_types_page
from tests.aws_support import fake_session
from tests.net_support import closed_port_url


class NoHistory:
    """The catalog never reads price history."""

    def last_change(self, cloud: Cloud, **kwargs: Any) -> datetime | None:
        raise AssertionError(f"catalog source asked the store last_change({cloud!r}, {kwargs!r})")


def by_name(shapes: list[InstanceType]) -> dict[str, InstanceType]:
    return {s.name: s for s in shapes}


# --------------------------------------------------------------------------- moto server on loopback


@pytest.fixture(scope="module")
def moto_catalog(moto_url: str) -> dict[str, InstanceType]:
    source = AwsInstanceTypeSource(["us-east-1"], session=fake_session(), endpoint_url=moto_url)
    result = source.fetch(NoHistory())
    assert (result.partial, result.errors, result.bad_records) == (False, [], 0)
    return by_name(result.instance_types)


def test_gpu_instance_types_come_with_accelerator_gpu_count_vcpus_and_memory(
    moto_catalog: dict[str, InstanceType],
) -> None:
    assert moto_catalog["g4dn.xlarge"] == InstanceType(Cloud.AWS, "g4dn.xlarge", "t4", 1.0, 4, 16.0, "aws-api")
    p3dn = moto_catalog["p3dn.24xlarge"]
    assert (p3dn.accelerator, p3dn.gpu_count, p3dn.vcpus, p3dn.memory_gib) == ("v100", 8.0, 96, 768.0)
    assert moto_catalog["g6e.xlarge"].accelerator == "l40s"
    assert moto_catalog["p5e.48xlarge"].accelerator == "h200"


def test_an_a100_with_80_gib_per_gpu_is_told_apart_from_the_40_gib_one(
    moto_catalog: dict[str, InstanceType],
) -> None:
    assert moto_catalog["p4d.24xlarge"].accelerator == "a100"
    assert moto_catalog["p4de.24xlarge"].accelerator == "a100-80gb"


def test_only_the_requested_gpu_families_are_listed(moto_catalog: dict[str, InstanceType]) -> None:
    assert moto_catalog, "moto should know some GPU families"
    assert {family_of(name) for name in moto_catalog} <= set(AWS_GPU_FAMILIES)
    assert "g5g.xlarge" not in moto_catalog  # "g5.*" does not match the Graviton g5g family


def test_discover_merges_regions_into_one_shape_per_name(moto_url: str) -> None:
    source = AwsInstanceTypeSource(["us-east-1", "us-west-2"], session=fake_session(), endpoint_url=moto_url)

    shapes = source.discover()

    assert len(shapes) == len({s.name for s in shapes}) > 0


def test_when_every_region_fails_the_catalog_is_unavailable() -> None:
    closed = closed_port_url()
    source = AwsInstanceTypeSource(
        ["us-east-1"], session=fake_session(), endpoint_url=closed, connect_timeout=1.0, max_attempts=1
    )

    with pytest.raises(SourceUnavailable, match=r"us-east-1: EndpointConnectionError.*ec2:DescribeInstanceTypes"):
        source.fetch(NoHistory())


# --------------------------------------------------------------------------- pagination and damaged records


def real_shaped(name: str, gpu: str, count: int, gpu_mib: int, vcpus: int, mib: int) -> dict[str, Any]:
    return {
        "InstanceType": name,
        "VCpuInfo": {"DefaultVCpus": vcpus},
        "MemoryInfo": {"SizeInMiB": mib},
        "GpuInfo": {
            "Gpus": [{"Name": gpu, "Manufacturer": "NVIDIA", "Count": count, "MemoryInfo": {"SizeInMiB": gpu_mib}}],
            "TotalGpuMemoryInMiB": count * gpu_mib,
        },
    }


def test_pages_are_followed_and_damaged_records_counted() -> None:
    client = fake_session().client("ec2", region_name="us-east-1")
    stub = Stubber(client)
    families = ("p3",)
    expected = {"Filters": [{"Name": "instance-type", "Values": ["p3.*"]}], "MaxResults": 100}
    no_gpus = {"InstanceType": "p3.8xlarge", "GpuInfo": {"Gpus": []}}
    stub.add_response(
        "describe_instance_types",
        {"InstanceTypes": [real_shaped("p3.2xlarge", "V100", 1, 16384, 8, 62464)], "NextToken": "t2"},
        expected,
    )
    stub.add_response(
        "describe_instance_types",
        {"InstanceTypes": [real_shaped("p3.16xlarge", "V100", 8, 16384, 64, 499712), no_gpus]},
        dict(expected, NextToken="t2"),
    )
    source = AwsInstanceTypeSource(["us-east-1"], families, client_factory=lambda region: client)

    with stub:
        result = source.fetch(NoHistory())
    stub.assert_no_pending_responses()

    assert by_name(result.instance_types) == {
        "p3.2xlarge": InstanceType(Cloud.AWS, "p3.2xlarge", "v100", 1.0, 8, 61.0, "aws-api"),
        "p3.16xlarge": InstanceType(Cloud.AWS, "p3.16xlarge", "v100", 8.0, 64, 488.0, "aws-api"),
    }
    assert (result.pages, result.bad_records) == (2, 1)
    assert "GpuInfo has no Gpus" in result.reasons[0]


def test_without_a_family_filter_every_type_with_gpu_info_is_kept() -> None:
    client = fake_session().client("ec2", region_name="us-west-2")
    stub = Stubber(client)
    cpu_only = {"InstanceType": "m5.large", "VCpuInfo": {"DefaultVCpus": 2}, "MemoryInfo": {"SizeInMiB": 8192}}
    graviton = real_shaped("g5g.xlarge", "T4g", 1, 15360, 4, 8192)
    stub.add_response("describe_instance_types", {"InstanceTypes": [cpu_only, graviton]}, {"MaxResults": 100})
    source = AwsInstanceTypeSource(["us-west-2"], None, client_factory=lambda region: client)

    with stub:
        result = source.fetch(NoHistory())

    assert result.instance_types == [InstanceType(Cloud.AWS, "g5g.xlarge", "t4", 1.0, 4, 8.0, "aws-api")]
    assert (result.skipped, result.bad_records) == (1, 0)


def test_several_gpu_groups_add_up_and_the_first_names_the_accelerator() -> None:
    rec = real_shaped("x9.big", "A100", 4, 81920, 48, 393216)
    rec["GpuInfo"]["Gpus"].append({"Name": "A100", "Count": 4, "MemoryInfo": {"SizeInMiB": 81920}})

    shape = parse_instance_type_record(rec)

    assert shape is not None
    assert (shape.accelerator, shape.gpu_count, shape.memory_gib) == ("a100-80gb", 8.0, 384.0)


def test_a_page_of_the_wrong_shape_is_malformed_and_a_cpu_type_is_no_gpu_shape() -> None:
    with pytest.raises(MalformedInput, match="describe-instance-types"):
        parse_instance_types_page({"SpotPriceHistory": []})
    assert parse_instance_type_record({"InstanceType": "m5.large", "VCpuInfo": {"DefaultVCpus": 2}}) is None


def test_the_catalog_produces_no_prices(moto_url: str) -> None:
    result = AwsInstanceTypeSource(["us-east-1"], ["g5"], session=fake_session(), endpoint_url=moto_url).fetch(
        NoHistory()
    )
    assert result.points == []
    assert result.source == "aws-catalog"
    assert all(t.cloud is Cloud.AWS and t.source == "aws-api" for t in result.instance_types)


def test_settings_give_the_endpoint(moto_url: str) -> None:
    source = AwsInstanceTypeSource.from_settings(
        Settings(aws_endpoint_url=moto_url), regions=["us-east-1"], families=["g4dn"], session=fake_session()
    )

    assert {t.name for t in source.discover()} >= {"g4dn.xlarge", "g4dn.metal"}
