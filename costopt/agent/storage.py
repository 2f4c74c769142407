"""Where checkpoints live: a directory named by a URI, behind a tiny storage interface.

Local paths and ``file://`` URIs use the standard library (write to a temporary name, ``fsync``,
``os.replace``: a crash never leaves a torn file under the final name). Any other scheme (``s3://``,
``gs://``, ``az://``, ``memory://`` ...) goes through fsspec, imported only when such a URI is opened,
so the agent runs in a training image that carries nothing but Python. Object stores publish an
object only once its upload completed, so there the final name is written directly; other fsspec
file systems write a temporary name and move it. ``mem://<name>`` is :class:`MemoryStorage`: files in
this process's memory (offline runs of simulated agents, :mod:`costopt.jobs.offline`), freed with
:func:`drop_memory`.

Names inside the storage are relative POSIX paths (``checkpoints/ckpt-...``, ``epoch.json``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

_T = TypeVar("_T")
_S = TypeVar("_S")

TEMP_PREFIX = ".tmp-"
"""Temporary files start with this; readers ignore them."""

_OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "memory"})


class Storage(Protocol):
    """The few operations the agent and the migrator need on a checkpoint location."""

    uri: str

    def read_bytes(self, name: str) -> bytes | None:
        """The whole content of ``name``, or None when it does not exist."""
        ...

    def write_atomic(self, name: str, data: bytes, *, temp_tag: str = "") -> None:
        """Publish ``data`` under ``name`` all at once: a reader sees the old content or the new, never
        part of it. ``temp_tag`` goes into the temporary name (the agent puts its epoch there)."""
        ...

    def list_files(self, directory: str) -> list[str]:
        """Names (relative to the root, not temporary files) of the files directly in ``directory``."""
        ...

    def delete(self, name: str) -> None:
        """Remove ``name``; a missing file is not an error."""
        ...

    def append_lines(self, name: str, lines: list[str]) -> None:
        """Append text lines to the log ``name`` (one writer per log)."""
        ...

    def read_lines(self, name: str) -> list[str]:
        """Every line appended to ``name`` so far (empty when none)."""
        ...

    def list_temps(self, directory: str) -> list[str]:
        """Temporary files left in ``directory`` (by a writer that crashed)."""
        ...

    def list_logs(self, directory: str) -> list[str]:
        """Names of the ``*.jsonl`` logs in ``directory`` (as passed to :meth:`append_lines`)."""
        ...


def _split(name: str) -> tuple[str, str]:
    head, _, tail = name.rpartition("/")
    return head, tail


class LocalStorage:
    """A directory on this machine."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.uri = str(self.root)

    def _path(self, name: str) -> Path:
        return self.root / name

    def read_bytes(self, name: str) -> bytes | None:
        try:
            return self._path(name).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write_atomic(self, name: str, data: bytes, *, temp_tag: str = "") -> None:
        final = self._path(name)
        final.parent.mkdir(parents=True, exist_ok=True)
        tag = f"{temp_tag}-" if temp_tag else ""
        temp = final.parent / f"{TEMP_PREFIX}{tag}{final.name}-{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, final)
        _fsync_dir(final.parent)

    def _entries(self, directory: str) -> tuple[Path, list[str]]:
        base = self._path(directory) if directory else self.root
        try:
            return base, sorted(os.listdir(base))
        except (FileNotFoundError, NotADirectoryError):
            return base, []

    def list_files(self, directory: str) -> list[str]:
        base, entries = self._entries(directory)
        prefix = f"{directory}/" if directory else ""
        return [prefix + e for e in entries if not e.startswith(TEMP_PREFIX) and (base / e).is_file()]

    def list_temps(self, directory: str) -> list[str]:
        _, entries = self._entries(directory)
        prefix = f"{directory}/" if directory else ""
        return [prefix + e for e in entries if e.startswith(TEMP_PREFIX)]

    def list_logs(self, directory: str) -> list[str]:
        return [n for n in self.list_files(directory) if n.endswith(".jsonl")]

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(name).unlink()

    def append_lines(self, name: str, lines: list[str]) -> None:
        if not lines:
            return
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(line + "\n" for line in lines).encode()
        # O_APPEND: each write lands at the end even with another process appending to the same file.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)

    def read_lines(self, name: str) -> list[str]:
        data = self.read_bytes(name)
        if not data:
            return []
        lines = data.decode(errors="replace").split("\n")
        # A writer killed mid-line leaves a last line without its newline: drop it.
        return [line for line in lines[:-1] if line]


class _Log:
    """An appended log in memory: its lines (as :meth:`LocalStorage.read_lines` would return them) and
    what readers derived from them so far (:meth:`MemoryStorage.fold_lines`)."""

    __slots__ = ("lines", "memo")

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.memo: dict[object, list[Any]] = {}


class MemoryStorage:
    """A location in this process's memory (``mem://<root>``): the semantics of :class:`LocalStorage`
    (whole-file replaces, appended logs, directories implied by names) with dicts instead of files.
    Every :class:`MemoryStorage` on the same root sees the same files until :func:`drop_memory`.
    ``versions``: a counter per name, bumped by every write (what a simulated agent watches).

    Nothing is re-read to be parsed again: an appended log keeps its lines (an append costs the new
    lines, not a copy of the whole log), :meth:`fold_lines` folds only the lines added since the last
    call, and :meth:`read_parsed` parses a file once per write."""

    # root -> directory -> base name -> content (bytes, or the lines of an appended log)
    _ROOTS: ClassVar[dict[str, dict[str, dict[str, bytes | _Log]]]] = {}
    _VERSIONS: ClassVar[dict[str, dict[str, int]]] = {}
    # root -> name -> parser -> (the content parsed, its value)
    _PARSED: ClassVar[dict[str, dict[str, dict[object, tuple[bytes, Any]]]]] = {}

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.root = uri.split("://", 1)[1].strip("/")
        if not self.root:
            raise ValueError(f"a mem:// URI needs a name: {uri!r}")
        self._dirs = self._ROOTS.setdefault(self.root, {})
        self.versions = self._VERSIONS.setdefault(self.root, {})
        self._parsed = self._PARSED.setdefault(self.root, {})

    def read_bytes(self, name: str) -> bytes | None:
        head, tail = _split(name)
        data = self._dirs.get(head, {}).get(tail)
        if isinstance(data, _Log):
            return "".join(line + "\n" for line in data.lines).encode()
        return data

    def read_parsed(self, name: str, parse: Callable[[bytes], _T]) -> _T | None:
        """``parse(content)`` of ``name`` (None: no such file), parsed once per write of it: the value is
        shared by every caller, who must not change it. What ``parse`` raises is raised (not kept)."""
        data = self.read_bytes(name)
        if data is None:
            return None
        memo = self._parsed.setdefault(name, {})
        hit = memo.get(parse)
        if hit is not None and hit[0] is data:
            value: _T = hit[1]
            return value
        value = parse(data)
        memo[parse] = (data, value)
        return value

    def fold_lines(self, name: str, key: object, start: Callable[[], _S], add: Callable[[_S, str], None]) -> _S:
        """Fold the lines of the log ``name`` (:meth:`read_lines`) into ``start()`` with ``add(state, line)``,
        adding only the lines appended since the last fold under ``key``. The state is shared by every
        caller of that key, who must not change it beyond ``add``."""
        head, tail = _split(name)
        data = self._dirs.get(head, {}).get(tail)
        if not isinstance(data, _Log):
            state = start()
            for line in self.read_lines(name):
                add(state, line)
            return state
        memo = data.memo.get(key)
        if memo is None:
            memo = data.memo[key] = [0, start()]
        lines, done = data.lines, memo[0]
        if done < len(lines):
            state = memo[1]
            for line in lines[done:]:
                add(state, line)
            memo[0] = len(lines)
        folded: _S = memo[1]
        return folded

    def write_atomic(self, name: str, data: bytes, *, temp_tag: str = "") -> None:
        head, tail = _split(name)
        self._dirs.setdefault(head, {})[tail] = bytes(data)
        self.versions[name] = self.versions.get(name, 0) + 1

    def _names(self, directory: str) -> list[str]:
        return sorted(self._dirs.get(directory.strip("/"), {}))

    def list_files(self, directory: str) -> list[str]:
        prefix = f"{directory}/" if directory else ""
        return [prefix + e for e in self._names(directory) if not e.startswith(TEMP_PREFIX)]

    def list_temps(self, directory: str) -> list[str]:
        return []  # writes are never partial

    def list_logs(self, directory: str) -> list[str]:
        return [n for n in self.list_files(directory) if n.endswith(".jsonl")]

    def delete(self, name: str) -> None:
        head, tail = _split(name)
        self._dirs.get(head, {}).pop(tail, None)
        self._parsed.pop(name, None)
        self.versions[name] = self.versions.get(name, 0) + 1

    def append_lines(self, name: str, lines: list[str]) -> None:
        if not lines:
            return
        head, tail = _split(name)
        files = self._dirs.setdefault(head, {})
        log = files.get(tail)
        if not isinstance(log, _Log):  # a new log, or a file written whole before
            log = files[tail] = _Log(self.read_lines(name))
        for line in lines:  # what a reader of the file gets back: no empty lines, one line per newline
            if "\n" in line:
                log.lines.extend(part for part in line.split("\n") if part)
            elif line:
                log.lines.append(line)

    def read_lines(self, name: str) -> list[str]:
        head, tail = _split(name)
        data = self._dirs.get(head, {}).get(tail)
        if isinstance(data, _Log):
            return list(data.lines)
        if not data:
            return []
        return [line for line in data.decode(errors="replace").split("\n")[:-1] if line]


def drop_memory(uri: str) -> None:
    """Free every file under the ``mem://`` root of ``uri`` (nothing when there is none)."""
    root = uri.split("://", 1)[1].strip("/").split("/", 1)[0]
    for key in [k for k in MemoryStorage._ROOTS if k == root or k.startswith(root + "/")]:
        del MemoryStorage._ROOTS[key]
        MemoryStorage._VERSIONS.pop(key, None)
        MemoryStorage._PARSED.pop(key, None)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class FsspecStorage:
    """Any fsspec file system (``s3://``, ``gs://``, ``az://``, ``memory://`` ...), imported lazily.

    Object stores cannot append: a log ``name`` is kept as chunk files under ``name.d/``, one per
    :meth:`append_lines` call, named so that they sort in writing order.
    """

    def __init__(self, uri: str, **storage_options: Any) -> None:
        try:
            import fsspec  # lazy on purpose: only remote URIs need it
        except ImportError as exc:  # pragma: no cover - depends on the image
            scheme = uri.split("://", 1)[0]
            raise ImportError(
                f"checkpoint URI {uri!r} needs fsspec and the {scheme} driver; install costopt's extra "
                f"(e.g. pip install 'costopt[{_extra_for(scheme)}]')"
            ) from exc
        self.uri = uri
        self.fs, root = fsspec.core.url_to_fs(uri, **storage_options)
        self.root = str(root).rstrip("/")
        protocol = self.fs.protocol
        protocols = {protocol} if isinstance(protocol, str) else set(protocol)
        self.atomic_put = bool(protocols & _OBJECT_STORE_PROTOCOLS)

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}" if name else self.root

    def read_bytes(self, name: str) -> bytes | None:
        try:
            data = self.fs.cat_file(self._path(name))
        except (FileNotFoundError, IsADirectoryError):
            return None
        return bytes(data)

    def write_atomic(self, name: str, data: bytes, *, temp_tag: str = "") -> None:
        final = self._path(name)
        if self.atomic_put:
            self.fs.pipe_file(final, data)
            return
        head, tail = _split(final)
        tag = f"{temp_tag}-" if temp_tag else ""
        temp = f"{head}/{TEMP_PREFIX}{tag}{tail}-{os.getpid()}-{secrets.token_hex(4)}"
        with contextlib.suppress(Exception):
            self.fs.makedirs(head, exist_ok=True)
        self.fs.pipe_file(temp, data)
        self.fs.mv(temp, final)

    def _entries(self, directory: str) -> list[tuple[str, bool]]:
        try:
            infos = self.fs.ls(self._path(directory), detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        for info in infos:
            base = str(info["name"]).rstrip("/").rsplit("/", 1)[-1]
            out.append((base, info.get("type") == "file"))
        return sorted(out)

    def list_files(self, directory: str) -> list[str]:
        prefix = f"{directory}/" if directory else ""
        return [prefix + b for b, is_file in self._entries(directory) if is_file and not b.startswith(TEMP_PREFIX)]

    def list_temps(self, directory: str) -> list[str]:
        prefix = f"{directory}/" if directory else ""
        return [prefix + b for b, is_file in self._entries(directory) if is_file and b.startswith(TEMP_PREFIX)]

    def list_logs(self, directory: str) -> list[str]:
        prefix = f"{directory}/" if directory else ""
        entries = self._entries(directory)
        return [prefix + b[: -len(".d")] for b, is_file in entries if not is_file and b.endswith(".jsonl.d")]

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(name))

    def append_lines(self, name: str, lines: list[str]) -> None:
        if not lines:
            return
        chunk = f"{name}.d/{time.time_ns():020d}-{secrets.token_hex(3)}.jsonl"
        self.write_atomic(chunk, "".join(line + "\n" for line in lines).encode())

    def read_lines(self, name: str) -> list[str]:
        out: list[str] = []
        for chunk in self.list_files(f"{name}.d"):
            data = self.read_bytes(chunk) or b""
            out.extend(line for line in data.decode(errors="replace").split("\n") if line)
        return out


def _extra_for(scheme: str) -> str:
    return {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure"}.get(
        scheme, scheme
    )


def is_local_uri(uri: str) -> bool:
    """True for a plain path or a ``file://`` URI (handled with the standard library)."""
    if "://" not in uri:
        return True
    return urlsplit(uri).scheme in ("file", "")


def local_path(uri: str) -> Path:
    """The directory a local URI names (``/a/b``, ``a/b``, ``file:///a/b``, ``file://localhost/a/b``)."""
    if "://" not in uri:
        return Path(uri).expanduser()
    parts = urlsplit(uri)
    if parts.scheme != "file":
        raise ValueError(f"not a local URI: {uri!r}")
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"file URI with a remote host is not supported: {uri!r}")
    return Path(unquote(parts.path))


def open_storage(uri: str, **storage_options: Any) -> Storage:
    """The storage a checkpoint URI names: local by default, fsspec for any other scheme."""
    if not uri:
        raise ValueError("empty checkpoint URI")
    if is_local_uri(uri):
        return LocalStorage(local_path(uri))
    if uri.startswith("mem://"):
        return MemoryStorage(uri)
    return FsspecStorage(uri, **storage_options)
