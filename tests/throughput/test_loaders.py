"""Loaders of Gavel's two throughput formats, on the real files and on malformed copies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from costopt.errors import MalformedInput
from costopt.throughput import (
    JobType,
    MalformedThroughputFile,
    ThroughputKey,
    ThroughputMeasurements,
    load_gavel_throughputs,
    load_oracle_throughputs,
    load_throughput_file,
)
from costopt.throughput.loaders import GAVEL_ORACLE_FILE, GAVEL_PHYSICAL_FILE, GAVEL_SIMULATION_FILE
from costopt.throughput.model import PairKey

DISTRIBUTED = {"ResNet-18", "ResNet-50", "Transformer", "LM"}
REC_8192 = JobType("Recommendation", 8192)
R50_128 = JobType("ResNet-50", 128)


def test_simulation_file_has_26_job_types_on_k80_p100_v100(gavel: ThroughputMeasurements) -> None:
    assert len(gavel.job_types) == 26
    assert gavel.job_types[0] == JobType("ResNet-18", 16)  # file order
    for acc in ("k80", "p100", "v100"):
        single = {k.job_type for k in gavel.isolated if k.accelerator == acc and k.gpu_count == 1}
        assert single == set(gavel.job_types)


def test_simulation_file_has_19_distributed_job_types_at_2_4_8_gpus(gavel: ThroughputMeasurements) -> None:
    for acc in ("k80", "p100", "v100"):
        for n in (2, 4, 8):
            multi = {
                k.job_type
                for k in gavel.isolated
                if k.accelerator == acc and k.gpu_count == n and k.placement == "consolidated"
            }
            assert len(multi) == 19
            assert {jt.model for jt in multi} == DISTRIBUTED


def test_unconsolidated_worker_types_load_as_spread_placement(gavel: ThroughputMeasurements) -> None:
    r18 = JobType("ResNet-18", 16)
    assert gavel.isolated[ThroughputKey(r18, "v100", 8, "spread")] == pytest.approx(64.40995361172301)
    assert gavel.isolated[ThroughputKey(r18, "v100", 8, "consolidated")] == pytest.approx(382.5974422686407)
    # k80_unconsolidated lacks ResNet-50 bs 64/128 at 2/4/8 GPUs: unknown, not zero
    for n in (2, 4, 8):
        assert ThroughputKey(R50_128, "k80", n, "spread") not in gavel.isolated
    spread = [k for k in gavel.isolated if k.placement == "spread"]
    assert len(spread) == 19 * 3 * 3 - 6
    assert all(k.gpu_count > 1 for k in spread)


def test_known_values_differ_between_the_two_files(
    gavel: ThroughputMeasurements, oracle: ThroughputMeasurements
) -> None:
    key = ThroughputKey(REC_8192, "k80")
    assert gavel.isolated[key] == pytest.approx(2.698783123478088)
    assert oracle.isolated[key] == pytest.approx(0.21463224402531245)


def test_zero_is_kept_as_cannot_run(gavel: ThroughputMeasurements) -> None:
    for n in (2, 4, 8):
        assert gavel.isolated[ThroughputKey(R50_128, "k80", n)] == 0.0
    assert gavel.isolated[ThroughputKey(R50_128, "k80", 1)] == pytest.approx(0.3472236920519382)


def test_co_located_pairs_are_loaded_per_accelerator_and_scale_factor(gavel: ThroughputMeasurements) -> None:
    a, b = JobType("ResNet-18", 64), JobType("ResNet-18", 16)
    assert gavel.pairs[PairKey(a, b, "v100")] == pytest.approx((24.093231895382736, 32.353384328946916))
    assert gavel.pairs[PairKey(b, a, "v100")] == pytest.approx((32.353384328946916, 24.093231895382736))
    assert len(gavel.pairs) == 3 * (26 * 26 + 3 * 19 * 19)
    assert {pk.gpu_count for pk in gavel.pairs} == {1, 2, 4, 8}


def test_older_single_gpu_file_has_bare_names_and_one_gpu(oracle: ThroughputMeasurements) -> None:
    assert len(oracle.job_types) == 26
    assert len(oracle.isolated) == 78
    assert {k.gpu_count for k in oracle.isolated} == {1}
    t256 = JobType("Transformer", 256)  # the older file's known quirk: same value on P100 and V100
    assert oracle.isolated[ThroughputKey(t256, "p100")] == oracle.isolated[ThroughputKey(t256, "v100")]
    assert oracle.pairs[PairKey(JobType("A3C"), JobType("CycleGAN"), "k80")] == pytest.approx(
        (2.274686248792252, 0.24735571737197057)
    )


def test_format_is_detected_from_the_keys(shared_data: Path) -> None:
    assert len(load_throughput_file(shared_data / GAVEL_ORACLE_FILE).isolated) == 78
    physical = load_throughput_file(shared_data / GAVEL_PHYSICAL_FILE)
    assert len(physical.job_types) == 26
    assert len(load_throughput_file(shared_data / GAVEL_SIMULATION_FILE).isolated) == len(physical.isolated)


# --- malformed files -------------------------------------------------------------------------

GOOD_GAVEL = {
    "v100": {"('LM (batch size 5)', 1)": {"null": 10.0, "('LM (batch size 5)', 1)": [5.0, 5.0]}},
}


def _write(tmp_path: Path, content: object, raw: str | None = None) -> Path:
    path = tmp_path / "tput.json"
    path.write_text(raw if raw is not None else json.dumps(content))
    return path


def test_a_small_well_formed_file_loads(tmp_path: Path) -> None:
    m = load_gavel_throughputs(_write(tmp_path, GOOD_GAVEL))
    assert m.isolated == {ThroughputKey(JobType("LM", 5), "v100"): 10.0}


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ({"v100": {"('LM (batch size 5)', 1)": {"null": -1.0}}}, ">= 0"),
        ({"v100": {"('LM (batch size 5)', 1)": {"null": "fast"}}}, "finite number"),
        ({"v100": {"('LM (batch size 5)', 1)": {"null": True}}}, "finite number"),
        ({"v100": {"('LM (batch size 5)', 1)": {"other": 1.0}}}, '"null"'),
        ({"v100": {"('LM (batch size 5)', 0)": {"null": 1.0}}}, "scale factor >= 1"),
        ({"v100": {"('LM (batch size 5)',)": {"null": 1.0}}}, "scale factor"),
        ({"v100": {"(__import__('os').system('true'), 1)": {"null": 1.0}}}, "literal"),
        (
            {"v100": {"('LM (batch size 5)', 1)": {"null": 1.0, "('LM (batch size 10)', 2)": [1.0, 1.0]}}},
            "share the scale factor",
        ),
        ({"v100": {"('LM (batch size 5)', 1)": {"null": 1.0, "('LM (batch size 10)', 1)": [1.0]}}}, "[self, other]"),
        ({"v100": ["not", "an", "object"]}, "object of job types"),
        ([1, 2], "JSON object"),
    ],
)
def test_malformed_gavel_file_raises_a_typed_error_naming_file_and_entry(
    tmp_path: Path, content: object, fragment: str
) -> None:
    path = _write(tmp_path, content)
    with pytest.raises(MalformedThroughputFile) as info:
        load_gavel_throughputs(path)
    assert str(path) in str(info.value)
    assert fragment in str(info.value)
    assert isinstance(info.value, MalformedInput)


def test_error_names_the_offending_entry(tmp_path: Path) -> None:
    bad = {"k80": {"('A3C', 1)": {"null": 1.0}, "('CycleGAN', 1)": {"null": float("nan")}}}
    with pytest.raises(MalformedThroughputFile) as info:
        load_gavel_throughputs(_write(tmp_path, bad))  # json writes NaN, which Python's json reads back
    assert info.value.entry == "['k80'][\"('CycleGAN', 1)\"]['null']"
    assert info.value.path.name == "tput.json"


def test_truncated_json_raises_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(MalformedThroughputFile, match="not JSON"):
        load_gavel_throughputs(_write(tmp_path, None, raw=json.dumps(GOOD_GAVEL)[:-5]))


def test_older_format_refuses_tuple_keys_and_bad_values(tmp_path: Path) -> None:
    with pytest.raises(MalformedThroughputFile, match="simulator format"):
        load_oracle_throughputs(_write(tmp_path, GOOD_GAVEL))
    with pytest.raises(MalformedThroughputFile, match=r"\[self, other\]"):
        load_oracle_throughputs(_write(tmp_path, {"k80": {"A3C": {"null": 1.0, "CycleGAN": 3}}}))


def test_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_throughput_file(tmp_path / "absent.json")
