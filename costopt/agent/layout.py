"""The files at a checkpoint location, their names and formats (shared by the agent and the migrator).

::

    <checkpoint URI>/
        epoch.json                               fencing marker: the highest epoch that claimed the job
        checkpoints/ckpt-e<epoch>-s<step>.ckpt    one file per checkpoint (header line + payload)
        checkpoints/ckpt-e<epoch>-s<step>.manifest.json   its manifest (what the migrator polls)
        progress/e<epoch>.jsonl                   progress log of the copies that ran with that epoch
        control/request.json                      a checkpoint request written by the migrator

A checkpoint file is ``MAGIC``, one JSON header line, then the payload. The header carries the job,
epoch, step, run, request served, encoding (``bytes`` or ``json``), payload size and SHA-256, so a
torn or foreign file is recognised and skipped. The *latest* checkpoint is the valid one with the
greatest ``(epoch, step)``: a newer epoch always supersedes an older one, whatever the steps.

A *manifest* is a small JSON file the agent publishes (atomically) next to each checkpoint once the
checkpoint itself is published: its name, epoch, step, job, run, size, payload SHA-256, the request
ids it serves and when it was written. Polls (:func:`costopt.agent.control.latest`,
:func:`~costopt.agent.control.request_served`) read the manifest of the newest checkpoint name and
never the checkpoint; only a restore reads and verifies the checkpoint itself. A checkpoint without a
manifest (written by an older agent, or by one that died between the two writes) is described by
reading its header the old way. The agent deletes a checkpoint's manifest before the checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, TypeVar

from costopt.agent.errors import AgentError, CheckpointError
from costopt.agent.storage import Storage

log = logging.getLogger("costopt.agent")

_T = TypeVar("_T")


def _read_parsed(storage: Storage, name: str, parse: Callable[[bytes], _T]) -> _T | None:
    """``parse`` of the file ``name`` (None: no such file). A storage that keeps parsed files
    (``MemoryStorage.read_parsed``) parses each write once; the value is then shared: never change it."""
    read = getattr(storage, "read_parsed", None)
    if read is not None:
        value: _T | None = read(name, parse)
        return value
    data = storage.read_bytes(name)
    return None if data is None else parse(data)


MAGIC = b"COSTOPT-CKPT/1\n"
MANIFEST_FORMAT = "costopt-manifest/1"
MANIFEST_SUFFIX = ".manifest.json"
MAX_SERVED_IDS = 32
"""A manifest lists at most this many served request ids (the newest)."""
EPOCH_MARKER = "epoch.json"
CHECKPOINT_DIR = "checkpoints"
PROGRESS_DIR = "progress"
REQUEST_FILE = "control/request.json"

_NAME_RE = re.compile(r"^ckpt-e(\d+)-s(\d+)\.ckpt$")
_TEMP_EPOCH_RE = re.compile(r"^\.tmp-e(\d+)-")


@dataclass(frozen=True, slots=True, order=True)
class CheckpointRef:
    """A checkpoint known by its name only (ordered by ``(epoch, step)``, the order of recency)."""

    epoch: int
    step: int
    name: str = field(compare=False)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A restored checkpoint: the step count reached and the user's state (``bytes`` or a JSON value)."""

    step: int
    epoch: int
    state: Any
    job_id: str
    run_id: str
    created_at: float
    request_id: str | None
    meta: dict[str, Any]
    name: str

    @property
    def ref(self) -> CheckpointRef:
        return CheckpointRef(self.epoch, self.step, self.name)


def checkpoint_name(epoch: int, step: int) -> str:
    return f"{CHECKPOINT_DIR}/ckpt-e{epoch:010d}-s{step:015d}.ckpt"


@lru_cache(maxsize=1024)
def progress_name(epoch: int) -> str:
    return f"{PROGRESS_DIR}/e{epoch:010d}.jsonl"


@lru_cache(maxsize=4096)
def parse_checkpoint_name(name: str) -> CheckpointRef | None:
    """The checkpoint a file name names (None: not a checkpoint's name); parsed once per name."""
    m = _NAME_RE.match(name.rsplit("/", 1)[-1])
    if m is None:
        return None
    return CheckpointRef(int(m.group(1)), int(m.group(2)), name)


def temp_epoch(name: str) -> int | None:
    """The epoch an agent's temporary file was written by (None: not an agent's temporary file)."""
    m = _TEMP_EPOCH_RE.match(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


_COMPACT = json.JSONEncoder(separators=(",", ":"))
_FAST = (
    None
    if c_make_encoder is None
    else c_make_encoder(None, _COMPACT.default, encode_basestring_ascii, None, ":", ",", False, False, True)
)


def compact_json(doc: Any) -> str:
    """``json.dumps(doc, separators=(",", ":"))`` for the agent's own documents (records, headers,
    manifests: plain values, never circular), without building an encoder per call (``json.dumps``
    with separators does, and that is most of its cost on a small dict)."""
    if _FAST is None:  # pragma: no cover - CPython has the C encoder
        return _COMPACT.encode(doc)
    return "".join(_FAST(doc, 0))


def encode_state(state: Any) -> tuple[bytes, str]:
    """``(payload, encoding)``: raw bytes as they are, anything else as JSON."""
    if isinstance(state, (bytes, bytearray, memoryview)):
        return bytes(state), "bytes"
    try:
        return json.dumps(state, separators=(",", ":")).encode(), "json"
    except (TypeError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint state must be bytes or JSON-serializable ({exc}); serialize arrays to bytes first"
        ) from exc


def payload_digest(payload: bytes) -> str:
    """The SHA-256 (hex) a checkpoint's header and manifest carry for its payload."""
    return hashlib.sha256(payload).hexdigest()


def encode_checkpoint(header: dict[str, Any], payload: bytes, *, sha256: str | None = None) -> bytes:
    """A checkpoint file; ``sha256``: the payload's digest when the caller already computed it."""
    full = dict(header, size=len(payload), sha256=sha256 or payload_digest(payload))
    # a caller's ``meta`` may hold anything json.dumps refuses (or a cycle): it gets json.dumps's checks
    text = json.dumps(full, separators=(",", ":")) if full.get("meta") else compact_json(full)
    return MAGIC + text.encode() + b"\n" + payload


def manifest_name(checkpoint: str) -> str:
    """The manifest's name of a checkpoint name (``...ckpt-e1-s10.ckpt`` -> ``...ckpt-e1-s10.manifest.json``)."""
    return checkpoint.removesuffix(".ckpt") + MANIFEST_SUFFIX


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a poll needs to know of a checkpoint, without its state.

    ``size``: bytes of the checkpoint file; ``sha256``: of its payload (as in its header);
    ``served_request_ids``: the requests this checkpoint answers (``request_id``) or that an earlier
    checkpoint of its lineage answered, newest last, at most :data:`MAX_SERVED_IDS`; times are Unix
    seconds (``created_at``: when the checkpoint was started, ``written_at``: when it was published).
    """

    name: str
    epoch: int
    step: int
    job_id: str
    run_id: str
    created_at: float
    request_id: str | None
    served_request_ids: tuple[str, ...]
    size: int
    sha256: str
    written_at: float

    def encode(self) -> bytes:
        doc = {"format": MANIFEST_FORMAT, **{k: getattr(self, k) for k in self.__slots__}}  # as asdict, flat
        return compact_json(doc).encode()

    @classmethod
    def decode(cls, data: bytes, name: str) -> Manifest:
        """Parse a manifest; :class:`CorruptCheckpoint` when it is not one."""
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
                raise CorruptCheckpoint(f"{name}: not a {MANIFEST_FORMAT} manifest")
            rid = doc.get("request_id")
            return cls(
                name=str(doc["name"]),
                epoch=int(doc["epoch"]),
                step=int(doc["step"]),
                job_id=str(doc.get("job_id", "")),
                run_id=str(doc.get("run_id", "")),
                created_at=float(doc.get("created_at", 0.0)),
                request_id=None if rid is None else str(rid),
                served_request_ids=tuple(str(r) for r in doc.get("served_request_ids") or ()),
                size=int(doc["size"]),
                sha256=str(doc["sha256"]),
                written_at=float(doc.get("written_at", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, CorruptCheckpoint):
                raise
            raise CorruptCheckpoint(f"{name}: bad manifest ({exc})") from exc


def write_manifest(storage: Storage, manifest: Manifest, *, temp_tag: str = "") -> None:
    """Publish ``manifest`` next to its checkpoint (atomically)."""
    storage.write_atomic(manifest_name(manifest.name), manifest.encode(), temp_tag=temp_tag)


def read_manifest(storage: Storage, ref: CheckpointRef) -> Manifest | None:
    """The manifest of checkpoint ``ref``; None when it has none, or one that is unreadable or names
    another checkpoint (the caller then reads the checkpoint itself)."""
    name = manifest_name(ref.name)
    try:
        manifest = _read_parsed(storage, name, _decode_manifest)
    except CorruptCheckpoint as exc:
        log.warning("ignoring manifest %s: %s", name, exc)
        return None
    if manifest is None:
        return None
    if (manifest.name, manifest.epoch, manifest.step) != (ref.name, ref.epoch, ref.step):
        log.warning("ignoring manifest %s: it describes %s", name, manifest.name)
        return None
    return manifest


def _decode_manifest(data: bytes) -> Manifest:
    return Manifest.decode(data, "manifest")


def delete_checkpoint(storage: Storage, name: str) -> None:
    """Remove a checkpoint and its manifest (the manifest first: no manifest outlives its checkpoint)."""
    storage.delete(manifest_name(name))
    storage.delete(name)


class CorruptCheckpoint(AgentError, ValueError):
    """A checkpoint file that is torn, truncated or not a checkpoint at all."""


def decode_checkpoint(data: bytes, name: str) -> Checkpoint:
    if not data.startswith(MAGIC):
        raise CorruptCheckpoint(f"{name}: not a costopt checkpoint")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise CorruptCheckpoint(f"{name}: truncated header")
    try:
        header = json.loads(data[len(MAGIC) : end])
        payload = data[end + 1 :]
        if len(payload) != header["size"] or hashlib.sha256(payload).hexdigest() != header["sha256"]:
            raise CorruptCheckpoint(f"{name}: payload size or checksum mismatch (torn write)")
        encoding = header["encoding"]
        if encoding == "bytes":
            state: Any = payload
        elif encoding == "json":
            state = json.loads(payload)
        else:
            raise CorruptCheckpoint(f"{name}: unknown encoding {encoding!r}")
        return Checkpoint(
            step=int(header["step"]),
            epoch=int(header["epoch"]),
            state=state,
            job_id=str(header.get("job_id", "")),
            run_id=str(header.get("run_id", "")),
            created_at=float(header.get("created_at", 0.0)),
            request_id=header.get("request_id"),
            meta=dict(header.get("meta") or {}),
            name=name,
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CorruptCheckpoint):
            raise
        raise CorruptCheckpoint(f"{name}: bad header ({exc})") from exc


def list_checkpoints(storage: Storage) -> list[CheckpointRef]:
    """Every published checkpoint name at the location, oldest first (temporary files excluded)."""
    refs = [r for r in (parse_checkpoint_name(n) for n in storage.list_files(CHECKPOINT_DIR)) if r is not None]
    return sorted(refs)


def load_checkpoint(storage: Storage, ref: CheckpointRef) -> Checkpoint | None:
    """The checkpoint ``ref`` names, or None when it vanished or does not verify."""
    data = storage.read_bytes(ref.name)
    if data is None:
        return None
    try:
        ckpt = decode_checkpoint(data, ref.name)
    except CorruptCheckpoint as exc:
        log.warning("skipping checkpoint %s: %s", ref.name, exc)
        return None
    if (ckpt.epoch, ckpt.step) != (ref.epoch, ref.step):
        log.warning("skipping checkpoint %s: header says epoch %d step %d", ref.name, ckpt.epoch, ckpt.step)
        return None
    return ckpt


def latest_checkpoint(storage: Storage) -> Checkpoint | None:
    """The valid checkpoint with the greatest ``(epoch, step)``; torn or vanished files are skipped."""
    for ref in reversed(list_checkpoints(storage)):
        ckpt = load_checkpoint(storage, ref)
        if ckpt is not None:
            return ckpt
    return None


def read_epoch_marker(storage: Storage) -> int:
    """The epoch claimed at the location (0: never claimed)."""
    try:
        epoch = _read_parsed(storage, EPOCH_MARKER, _marker_epoch)
    except (KeyError, TypeError, ValueError) as exc:
        raise AgentError(f"{storage.uri}/{EPOCH_MARKER} is unreadable ({exc}); fencing cannot be checked") from exc
    return 0 if epoch is None else epoch


def _marker_epoch(data: bytes) -> int:
    return int(json.loads(data)["epoch"])


def write_epoch_marker(storage: Storage, epoch: int, *, at: float, by: str, temp_tag: str = "") -> None:
    body = json.dumps({"epoch": epoch, "claimed_at": at, "by": by}).encode()
    storage.write_atomic(EPOCH_MARKER, body, temp_tag=temp_tag)


def read_request(storage: Storage) -> dict[str, Any] | None:
    """The pending checkpoint request (``{"id", "requested_at", "epoch"?, "reason"?}``), or None."""
    try:
        return _read_parsed(storage, REQUEST_FILE, _request)
    except ValueError:
        log.warning("ignoring unreadable checkpoint request at %s/%s", storage.uri, REQUEST_FILE)
        return None


def _request(data: bytes) -> dict[str, Any] | None:
    if not data:
        return None
    req = json.loads(data)
    if not isinstance(req, dict) or not req.get("id"):
        return None
    return req
