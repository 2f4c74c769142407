"""The one boot script behind AWS user data, GCP startup scripts and Azure custom data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from costopt.cloud import LaunchSpec
from costopt.domain import Cloud, Market, OfferKey
from providers.aws import user_data_script
from providers.azure import custom_data_script
from providers.boot import boot_script
from providers.gcp import startup_script

SPEC = LaunchSpec(
    offer=OfferKey(Cloud.AWS, "us-east-1", "", "g5.xlarge", Market.SPOT),
    command=(sys.executable, "-c", "import os, sys; print(os.environ['VALUE']); print(sys.argv[1:])", "a b", "$x"),
    env={"COSTOPT_JOB_ID": "job-1", "VALUE": "it's $(not run) `either`\nand a second line"},
)


def test_every_cloud_boots_the_same_script() -> None:
    assert user_data_script(SPEC) == startup_script(SPEC) == custom_data_script(SPEC) == boot_script(SPEC)


def test_the_script_exports_values_verbatim_and_passes_arguments_verbatim(tmp_path: Path) -> None:
    ran = subprocess.run(["bash", "-c", boot_script(SPEC)], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert ran.stdout == "it's $(not run) `either`\nand a second line\n['a b', '$x']\n"


def test_each_cloud_has_its_own_size_limit() -> None:
    big = LaunchSpec(offer=SPEC.offer, command=("true",), env={"BIG": "x" * 20_000})
    with pytest.raises(ValueError, match="above EC2's limit"):
        user_data_script(big)
    assert custom_data_script(big) == startup_script(big)  # 64 KB and 256 KB are enough
    with pytest.raises(ValueError, match="above Azure's limit"):
        custom_data_script(LaunchSpec(offer=SPEC.offer, command=("true",), env={"BIG": "x" * 70_000}))
    with pytest.raises(ValueError, match="not a shell identifier"):
        boot_script(LaunchSpec(offer=SPEC.offer, command=("true",), env={"1X": "y"}))
