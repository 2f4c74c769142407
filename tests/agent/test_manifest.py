"""Checkpoint manifests: the migrator's polls read a small manifest, never the checkpoint itself;
checkpoints written without one (older agents) are still described, the old way."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest

from costopt.agent import control
from costopt.agent.layout import (
    CHECKPOINT_DIR,
    MAX_SERVED_IDS,
    checkpoint_name,
    list_checkpoints,
    manifest_name,
    read_manifest,
)
from costopt.agent.storage import LocalStorage, Storage, open_storage

BIG = bytes(range(256)) * 8192  # a 2 MiB "model"


class CountingStorage:
    """Wraps a storage and counts the bytes read from each name."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.bytes_read: Counter[str] = Counter()

    def read_bytes(self, name: str) -> bytes | None:
        data = self.inner.read_bytes(name)
        self.bytes_read[name] += len(data or b"")
        return data

    def read_lines(self, name: str) -> list[str]:
        lines = self.inner.read_lines(name)
        self.bytes_read[name] += sum(len(line) + 1 for line in lines)
        return lines

    def write_atomic(self, name: str, data: bytes, *, temp_tag: str = "") -> None:
        self.inner.write_atomic(name, data, temp_tag=temp_tag)

    def list_files(self, directory: str) -> list[str]:
        return self.inner.list_files(directory)

    def delete(self, name: str) -> None:
        self.inner.delete(name)

    def append_lines(self, name: str, lines: list[str]) -> None:
        self.inner.append_lines(name, lines)

    def list_temps(self, directory: str) -> list[str]:
        return self.inner.list_temps(directory)

    def list_logs(self, directory: str) -> list[str]:
        return self.inner.list_logs(directory)

    def checkpoint_bytes(self) -> int:
        return sum(n for name, n in self.bytes_read.items() if name.endswith(".ckpt"))


@pytest.fixture(params=["local", "memory"])
def location(request: pytest.FixtureRequest, uri: str) -> str:
    """A local directory, or an fsspec object store (``memory://``: published only when complete)."""
    if request.param == "local":
        return uri
    pytest.importorskip("fsspec")
    return f"memory://costopt-tests/{Path(uri).parent.name}/ckpt"


def test_polls_read_the_manifest_and_never_the_checkpoint(make_agent, location, clock):
    agent = make_agent(uri=location)
    agent.restore()
    agent.checkpoint(10, BIG)
    rid = control.request_checkpoint(location, epoch=1)
    clock.advance(5.0)
    assert agent.should_checkpoint()
    agent.checkpoint(20, BIG)

    counting = CountingStorage(open_storage(location))
    for _ in range(3):  # three polls
        assert control.request_served(counting, rid)
        info = control.latest(counting)
        assert info is not None and (info.epoch, info.step, info.request_id) == (1, 20, rid)

    assert counting.checkpoint_bytes() == 0
    assert set(counting.bytes_read) == {manifest_name(checkpoint_name(1, 20))}
    assert sum(counting.bytes_read.values()) < 3 * 2 * 1024  # six small manifest reads, no 2 MiB checkpoint
    # A restore needs the state: it reads (and verifies) the checkpoint itself.
    ckpt = control.restore_latest(counting)
    assert ckpt is not None and ckpt.state == BIG
    assert counting.checkpoint_bytes() > len(BIG)


def test_a_manifest_describes_its_checkpoint(make_agent, uri, clock):
    agent = make_agent()
    agent.restore()
    rid = control.request_checkpoint(uri)
    clock.advance(5.0)
    assert agent.should_checkpoint()
    agent.checkpoint(7, BIG)

    storage = open_storage(uri)
    (ref,) = list_checkpoints(storage)
    manifest = read_manifest(storage, ref)
    raw = json.loads((Path(uri) / manifest_name(ref.name)).read_bytes())
    assert manifest is not None
    assert (manifest.name, manifest.epoch, manifest.step, manifest.job_id, manifest.run_id) == (
        checkpoint_name(1, 7),
        1,
        7,
        "job-1",
        agent.run_id,
    )
    assert manifest.size == (Path(uri) / ref.name).stat().st_size
    assert manifest.sha256 == hashlib.sha256(BIG).hexdigest()
    assert (manifest.request_id, manifest.served_request_ids) == (rid, (rid,))
    assert manifest.written_at == clock()
    assert raw["format"] == "costopt-manifest/1" and raw["step"] == 7


def test_a_checkpoint_without_a_manifest_is_read_the_old_way(make_agent, uri, clock):
    agent = make_agent()
    agent.restore()
    rid = control.request_checkpoint(uri)
    clock.advance(5.0)
    assert agent.should_checkpoint()
    agent.checkpoint(10, BIG)
    (Path(uri) / manifest_name(checkpoint_name(1, 10))).unlink()  # as an agent before manifests left it

    counting = CountingStorage(open_storage(uri))
    info = control.latest(counting)
    assert info is not None and (info.step, info.request_id, info.served_request_ids) == (10, rid, (rid,))
    assert info.size is None  # not known without a manifest
    assert control.request_served(counting, rid)
    assert counting.checkpoint_bytes() > len(BIG)


def test_an_unreadable_or_mismatched_manifest_falls_back_to_the_checkpoint(make_agent, uri):
    agent = make_agent()
    agent.restore()
    agent.checkpoint(10, {"s": 10})
    agent.checkpoint(20, {"s": 20})
    m10, m20 = (Path(uri) / manifest_name(checkpoint_name(1, s)) for s in (10, 20))
    m20.write_bytes(m10.read_bytes())  # names checkpoint 10: not this one's

    info = control.latest(uri)
    assert info is not None and info.step == 20 and info.size is None
    m20.write_bytes(b"{not json")
    info = control.latest(uri)
    assert info is not None and info.step == 20


def test_a_failed_manifest_write_keeps_the_checkpoint_and_polls_fall_back(make_agent, uri, caplog):
    class NoManifests(LocalStorage):
        def write_atomic(self, name: str, data: bytes, *, temp_tag: str = "") -> None:
            if name.endswith(".manifest.json"):
                raise OSError("disk full")
            super().write_atomic(name, data, temp_tag=temp_tag)

    agent = make_agent(storage=NoManifests(uri))
    agent.restore()
    agent.checkpoint(10, {"s": 10})

    assert "could not publish the manifest" in caplog.text
    info = control.latest(uri)
    assert info is not None and info.step == 10


def test_a_rewritten_checkpoint_never_keeps_the_manifest_of_the_one_it_replaced(make_agent, uri):
    a = make_agent()
    a.restore()
    a.checkpoint(10, {"s": "first"})
    m = Path(uri) / manifest_name(checkpoint_name(1, 10))
    first = json.loads(m.read_bytes())

    a.checkpoint(10, {"s": "second, longer"})  # same epoch and step: the same name

    second = json.loads(m.read_bytes())
    assert second["sha256"] != first["sha256"]
    assert second["size"] == (Path(uri) / checkpoint_name(1, 10)).stat().st_size


def test_pruned_checkpoints_take_their_manifests_with_them(make_agent, uri):
    a = make_agent(keep=2)
    a.restore()
    for step in (1, 2, 3, 4):
        a.checkpoint(step, {"s": step})
    names = sorted(p.name for p in (Path(uri) / CHECKPOINT_DIR).iterdir())
    assert names == sorted(
        Path(n).name for s in (3, 4) for n in (checkpoint_name(1, s), manifest_name(checkpoint_name(1, s)))
    )


def test_a_request_stays_served_after_a_newer_request_and_across_epochs(make_agent, uri, clock):
    a = make_agent()
    a.restore()
    first = control.request_checkpoint(uri, epoch=1)
    clock.advance(5.0)
    assert a.should_checkpoint()
    a.checkpoint(10, {})
    second = control.request_checkpoint(uri, epoch=1)  # replaces the request file
    clock.advance(5.0)
    assert a.should_checkpoint()
    a.checkpoint(20, {})
    assert control.request_served(uri, first) and control.request_served(uri, second)

    b = make_agent(epoch=2)
    b.restore()
    b.checkpoint(30, {})
    info = control.latest(uri)
    assert info is not None and info.epoch == 2 and info.request_id is None
    assert info.served_request_ids == (first, second)
    assert control.request_served(uri, first) and control.request_served(uri, second)
    assert not control.request_served(uri, "req-never-asked")


def test_a_manifest_lists_only_the_newest_served_requests(make_agent, uri, clock):
    a = make_agent()
    a.restore()
    ids = []
    for step in range(1, MAX_SERVED_IDS + 3):
        ids.append(control.request_checkpoint(uri, epoch=1))
        clock.advance(5.0)
        assert a.should_checkpoint()
        a.checkpoint(step, {})
    info = control.latest(uri)
    assert info is not None and info.served_request_ids == tuple(ids[-MAX_SERVED_IDS:])


@pytest.mark.parametrize(
    "doc",
    [
        {"event": "progress", "step": 120, "t": 1583020800.25, "run": "r-1", "done": False, "left": None},
        {"format": 1, "name": "ckpt/ckpt-e0000000001-s000000000000120.ckpt", "size": 3, "sha256": "ab" * 32},
        {"text": 'caf\u00e9 \u2603 "quoted"\n', "nested": {"list": [1, 2.5, "x"], "empty": {}}, "big": 10**20},
        {"nan": float("nan"), "inf": float("inf")},
    ],
)
def test_the_compact_encoder_writes_what_json_dumps_writes(doc: dict[str, object]) -> None:
    from costopt.agent.layout import compact_json

    assert compact_json(doc) == json.dumps(doc, separators=(",", ":"))
