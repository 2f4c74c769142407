"""The calibration set: the shipped file loads, and every kind of bad row is refused with its line and reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from costopt.throughput.calibration import CALIBRATION_COLUMNS, DEFAULT_CALIBRATION_FILE, UNITS, load_calibration
from costopt.throughput.errors import MalformedCalibrationFile
from costopt.throughput.estimate import AcceleratorSpec
from costopt.throughput.model import MODEL_FAMILIES, PRECISIONS


def test_the_shipped_calibration_set_loads_and_names_a_source_on_every_row(specs: dict[str, AcceleratorSpec]) -> None:
    rows = load_calibration(DEFAULT_CALIBRATION_FILE, specs)
    assert len(rows) > 300
    assert all(r.source.startswith("https://") for r in rows)
    assert {r.unit for r in rows} <= UNITS
    single = [r for r in rows if r.gpu_count == 1]
    # every family with calibration data has figures at every precision, on Volta and on Hopper
    for family in ("convolutional", "transformer", "recurrent", "recommendation"):
        for precision in ("tf32", "amp"):
            gpus = {r.gpu for r in single if r.family == family and r.precision == precision}
            assert {"h100", "a100-80gb"} <= gpus, (family, precision)
        assert "v100" in {r.gpu for r in single if r.family == family and r.precision == "fp32"}
    # a figure read from a published table: Lambda's ResNet-50 on one H100 SXM5, fp32 table (TF32)
    (h100,) = [r for r in single if r.gpu == "h100" and r.model == "ResNet-50" and r.precision == "tf32"]
    assert (h100.throughput, h100.batch_size, h100.unit) == (1753.0, None, "images/s")


GOOD = "v100,1,ResNet-50,convolutional,fp32,256,367,images/s,https://example.org/table,"


def _file(tmp_path: Path, *rows: str, header: str = ",".join(CALIBRATION_COLUMNS)) -> Path:
    path = tmp_path / "calibration.csv"
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


def test_a_good_row_loads(tmp_path: Path, specs: dict[str, AcceleratorSpec]) -> None:
    (row,) = load_calibration(_file(tmp_path, GOOD), specs)
    assert (row.gpu, row.gpu_count, row.family, row.precision, row.batch_size, row.throughput) == (
        "v100",
        1,
        "convolutional",
        "fp32",
        256,
        367.0,
    )
    assert row.line == 2


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (GOOD.replace("images/s", "furlongs/fortnight"), "unknown unit 'furlongs/fortnight'"),
        (GOOD.replace(",fp32,", ",int4,"), "unknown precision 'int4'"),
        (GOOD.replace(",convolutional,", ",diffusion,"), "unknown model_family 'diffusion'"),
        (GOOD.replace(",367,", ",-367,"), "positive finite number, got '-367'"),
        (GOOD.replace(",367,", ",0,"), "positive finite number, got '0'"),
        (GOOD.replace(",367,", ",nan,"), "positive finite number"),
        (GOOD.replace(",367,", ",fast,"), "not a number"),
        (GOOD.replace("v100,", "voodoo-5500,", 1), "'voodoo-5500' has no specs"),
        (GOOD.replace(",1,", ",0,", 1), "gpu_count"),
        (GOOD.replace(",256,", ",big,"), "batch_size"),
        (GOOD.replace("https://example.org/table", ""), "source"),
        (GOOD.rsplit(",", 2)[0], "fields"),
    ],
)
def test_a_bad_row_is_refused_with_its_line_and_reason(
    tmp_path: Path, specs: dict[str, AcceleratorSpec], row: str, reason: str
) -> None:
    path = _file(tmp_path, GOOD, row)
    with pytest.raises(MalformedCalibrationFile) as info:
        load_calibration(path, specs)
    message = str(info.value)
    assert str(path) in message
    assert "line 3" in message
    assert reason in message
    if reason != "fields":  # the row itself: its GPU and model (a short row is named by its line only)
        assert f"({row.split(',')[0]}, ResNet-50)" in message


def test_a_wrong_header_or_an_empty_file_is_refused(tmp_path: Path, specs: dict[str, AcceleratorSpec]) -> None:
    with pytest.raises(MalformedCalibrationFile, match="expected columns"):
        load_calibration(_file(tmp_path, GOOD, header="gpu,model,throughput"), specs)
    with pytest.raises(MalformedCalibrationFile, match="no calibration rows"):
        load_calibration(_file(tmp_path), specs)


def test_vocabularies_are_the_documented_ones() -> None:
    assert PRECISIONS == ("fp32", "tf32", "amp")
    assert MODEL_FAMILIES == (
        "convolutional",
        "transformer",
        "recurrent",
        "reinforcement_learning",
        "recommendation",
        "gan",
    )
