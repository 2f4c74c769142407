"""``mem://`` locations keep what readers derived: a log is folded only over the lines appended since the
last look, a file is parsed once per write, and a progress poll over a growing log gives exactly what a
full read gives (the simulated agents' checkpoint locations, polled thousands of times per run)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from costopt.agent import control
from costopt.agent.layout import EPOCH_MARKER, progress_name, read_epoch_marker, write_epoch_marker
from costopt.agent.progress import RecordLine, epoch_progress, read_records, record_line, storage_epoch_progress
from costopt.agent.storage import MemoryStorage, drop_memory

URI = "mem://folds-test"


@pytest.fixture
def mem() -> Iterator[MemoryStorage]:
    yield MemoryStorage(URI)
    drop_memory(URI)


def test_a_fold_sees_each_appended_line_once(mem: MemoryStorage) -> None:
    seen: list[str] = []

    def add(acc: list[str], line: str) -> None:
        seen.append(line)
        acc.append(line)

    mem.append_lines("logs/a.jsonl", ["1", "2"])
    assert mem.fold_lines("logs/a.jsonl", "k", list, add) == ["1", "2"]
    mem.append_lines("logs/a.jsonl", ["3", "", "4\n5"])  # what a file reader gets: no empty lines, split
    assert mem.fold_lines("logs/a.jsonl", "k", list, add) == ["1", "2", "3", "4", "5"]
    assert mem.fold_lines("logs/a.jsonl", "k", list, add) == ["1", "2", "3", "4", "5"]
    assert seen == ["1", "2", "3", "4", "5"]  # never folded twice
    assert mem.read_lines("logs/a.jsonl") == ["1", "2", "3", "4", "5"]
    assert mem.read_bytes("logs/a.jsonl") == b"1\n2\n3\n4\n5\n"
    assert mem.fold_lines("logs/missing.jsonl", "k", list, add) == []


def test_a_file_is_parsed_once_per_write(mem: MemoryStorage) -> None:
    calls: list[bytes] = []

    def parse(data: bytes) -> int:
        calls.append(data)
        return int(json.loads(data)["epoch"])

    assert mem.read_parsed(EPOCH_MARKER, parse) is None
    write_epoch_marker(mem, 3, at=0.0, by="test")
    assert mem.read_parsed(EPOCH_MARKER, parse) == 3
    assert mem.read_parsed(EPOCH_MARKER, parse) == 3
    assert len(calls) == 1
    write_epoch_marker(mem, 4, at=1.0, by="test")
    assert read_epoch_marker(mem) == 4 and mem.read_parsed(EPOCH_MARKER, parse) == 4
    assert len(calls) == 2
    mem.delete(EPOCH_MARKER)
    assert read_epoch_marker(mem) == 0


def test_a_record_line_carries_its_record_and_reads_back_as_its_json() -> None:
    rec = {"event": "step", "epoch": 1, "run": "r", "t": 1.5, "step": 10, "first": 1}
    line = record_line(rec)
    assert isinstance(line, RecordLine) and json.loads(line) == rec and line.record == rec
    rec["step"] = 11  # the line keeps what was written
    assert line.record["step"] == 10
    odd = record_line({"event": "step", "loss": [0.1, 0.2]})  # not plain values: only its text
    assert not isinstance(odd, RecordLine) and json.loads(odd) == {"event": "step", "loss": [0.1, 0.2]}


def test_a_progress_poll_over_a_growing_log_equals_a_full_read(mem: MemoryStorage) -> None:
    name = progress_name(2)
    records = [
        {"event": "start", "epoch": 2, "run": "a", "t": 0.0, "restored_step": 5},
        {"event": "step", "epoch": 2, "run": "a", "t": 1.0, "step": 9, "first": 6},
        {"event": "checkpoint", "epoch": 2, "run": "a", "t": 2.0, "step": 9},
        {"event": "step", "epoch": 2, "run": "a", "t": 3.0, "step": 20, "first": 10},
        {"event": "done", "epoch": 2, "run": "a", "t": 4.0, "step": 20},
    ]
    for i, rec in enumerate(records):
        text = record_line(rec) if i % 2 else json.dumps(rec)  # lines of this process and plain text alike
        mem.append_lines(name, [text])
        if i == 2:
            mem.append_lines(name, ["not json"])  # skipped by both reads
        full = epoch_progress([json.loads(json.dumps(r)) for r in records[: i + 1]], 2)
        assert storage_epoch_progress(mem, 2) == full
        assert control.progress(URI, 2) == full
    assert read_records(mem, 2) == records
    assert control.audit_job(URI, 20).steps_done == 15
