"""Value types: job-type names round-trip, keys normalise, throughputs validate."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costopt.throughput import InvalidThroughput, JobType, Throughput, ThroughputKey
from costopt.throughput.model import PairKey, _parse_name


def test_job_type_parses_model_and_batch_size_from_gavel_names() -> None:
    jt = JobType.parse("ResNet-50 (batch size 128)")
    assert (jt.model, jt.batch_size) == ("ResNet-50", 128)
    assert jt.name == "ResNet-50 (batch size 128)"
    assert JobType.parse("A3C") == JobType("A3C", None)
    assert str(JobType("LM", 5)) == "LM (batch size 5)"


@given(
    model=st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=20),
    batch=st.one_of(st.none(), st.integers(min_value=1, max_value=10**6)),
)
def test_job_type_name_round_trips(model: str, batch: int | None) -> None:
    # refused: a name with outer blanks, or a batch-less model whose name already carries a batch size;
    # every other draw must round-trip (both branches assert: no silent return on a refusal)
    refused = model != model.strip() or (batch is None and _parse_name(model) is not None)
    if refused:
        with pytest.raises(InvalidThroughput):
            JobType(model, batch)
    else:
        jt = JobType(model, batch)
        assert JobType.parse(jt.name) == jt
        assert (jt.model, jt.batch_size) == (model, batch)


def test_job_type_refuses_empty_names_bad_batch_sizes_and_hidden_batch_sizes() -> None:
    for bad in [("", None), (" x", None), ("x", 0), ("x", -3), ("x (batch size 8)", None)]:
        with pytest.raises(InvalidThroughput):
            JobType(*bad)


def test_single_gpu_key_is_always_consolidated() -> None:
    jt = JobType("LM", 5)
    assert ThroughputKey(jt, "v100", 1, "spread") == ThroughputKey(jt, "v100")
    assert ThroughputKey(jt, "v100", 2, "spread").placement == "spread"


@pytest.mark.parametrize("gpus", [0, -1, 1.5, True])
def test_key_refuses_non_positive_or_non_integer_gpu_counts(gpus: object) -> None:
    with pytest.raises(InvalidThroughput):
        ThroughputKey(JobType("LM", 5), "v100", gpus)  # type: ignore[arg-type]
    with pytest.raises(InvalidThroughput):
        PairKey(JobType("LM", 5), JobType("LM", 10), "v100", gpus)  # type: ignore[arg-type]


def test_key_refuses_unknown_placement() -> None:
    with pytest.raises(InvalidThroughput):
        ThroughputKey(JobType("LM", 5), "v100", 2, "scattered")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf, "3"])
def test_throughput_refuses_negative_nan_infinite_or_non_numeric_values(value: object) -> None:
    with pytest.raises(InvalidThroughput):
        Throughput(value, "measured")  # type: ignore[arg-type]


def test_zero_throughput_means_cannot_run() -> None:
    assert not Throughput(0.0, "measured").can_run
    assert Throughput(0.1, "measured").can_run


def test_estimates_name_their_estimator_and_measurements_do_not() -> None:
    assert Throughput(1.0, "estimated", 0, "hardware-loglinear").is_estimate
    with pytest.raises(InvalidThroughput):
        Throughput(1.0, "estimated", 0)
    with pytest.raises(InvalidThroughput):
        Throughput(1.0, "estimated", 2, "x")
    with pytest.raises(InvalidThroughput):
        Throughput(1.0, "user", 1, "x")
    with pytest.raises(InvalidThroughput):
        Throughput(1.0, "measured", 0)
