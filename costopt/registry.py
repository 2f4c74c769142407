"""One name -> factory registry type for every plug-in family (providers, price sources, import file
kinds, planning objectives, Gavel policies).

A :class:`Registry` maps canonical names (and aliases) to entries. Look-ups ignore case; the names keep
the spelling they were registered with. An unknown name raises :class:`UnknownName` (or the family's
subclass of it), whose message lists the known names and the close matches (:mod:`difflib`), so a
typo on the command line, in a REST body or in a setting says what to write instead.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

from costopt.errors import CostoptError

T = TypeVar("T")


class UnknownName(CostoptError, ValueError):
    """A name that is not in a registry. ``kind`` is the family ("provider", "objective"...), ``known``
    its canonical names in registration order, ``close`` the close matches (names or aliases)."""

    def __init__(
        self, kind: str, name: str, known: tuple[str, ...], close: tuple[str, ...] = (), hint: str = ""
    ) -> None:
        self.kind = kind
        self.name = name
        self.known = known
        self.close = close
        msg = f"unknown {kind} {name!r}"
        if close:
            msg += f" (did you mean {' or '.join(repr(c) for c in close)}?)"
        msg += f"; known: {', '.join(known) if known else '(none)'}"
        if hint:
            msg += f"; {hint}"
        super().__init__(msg)


class Registry(Generic[T]):
    """Entries of one plug-in family by name.

    ``kind`` names the family in error messages; ``error`` is the :class:`UnknownName` subclass raised
    for an unknown name (constructed as ``error(kind, name, known, close, hint)``); ``hint`` is appended
    to that message (e.g. which setting holds the name).
    """

    def __init__(self, kind: str, *, error: type[UnknownName] = UnknownName, hint: str = "") -> None:
        self.kind = kind
        self.error = error
        self.hint = hint
        self._entries: dict[str, T] = {}  # canonical name (as registered) -> entry
        self._keys: dict[str, str] = {}  # casefolded name or alias -> canonical name
        self._aliases: dict[str, str] = {}  # alias (as registered) -> canonical name

    @overload
    def register(self, name: str, entry: T, *, aliases: tuple[str, ...] = ()) -> T: ...

    @overload
    def register(self, name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]: ...

    def register(self, name: str, entry: T | None = None, *, aliases: tuple[str, ...] = ()) -> T | Callable[[T], T]:
        """Register ``entry`` under ``name`` (and ``aliases``); without ``entry``, a decorator that
        registers what it decorates. Raises ``ValueError`` when a name or alias is taken (ignoring case)."""

        def add(item: T) -> T:
            for key in (name, *aliases):
                if not key or key != key.strip():
                    raise ValueError(f"{self.kind} name {key!r} must be non-empty without surrounding spaces")
                taken = self._keys.get(key.casefold())
                if taken is not None:
                    raise ValueError(f"{self.kind} name {key!r} is already registered (for {taken!r})")
            self._entries[name] = item
            self._keys[name.casefold()] = name
            for alias in aliases:
                self._keys[alias.casefold()] = name
                self._aliases[alias] = name
            return item

        return add if entry is None else add(entry)

    def canonical(self, name: str) -> str:
        """The canonical name of ``name`` (any case, or an alias); raises ``self.error`` otherwise."""
        found = self._keys.get(name.strip().casefold())
        if found is None:
            raise self.error(self.kind, name, self.names(), self.close_matches(name), self.hint)
        return found

    def get(self, name: str) -> T:
        """The entry registered under ``name`` (any case, or an alias); raises ``self.error`` otherwise."""
        return self._entries[self.canonical(name)]

    def names(self) -> tuple[str, ...]:
        """The canonical names, in registration order."""
        return tuple(self._entries)

    def aliases(self) -> dict[str, str]:
        """Each alias -> its canonical name."""
        return dict(self._aliases)

    def items(self) -> Iterator[tuple[str, T]]:
        """``(canonical name, entry)`` in registration order."""
        return iter(list(self._entries.items()))

    def close_matches(self, name: str, n: int = 3) -> tuple[str, ...]:
        """Registered names or aliases that look like ``name`` (best first, as registered)."""
        spelled = {key: self._display(key) for key in self._keys}
        found = difflib.get_close_matches(name.strip().casefold(), list(spelled), n=n, cutoff=0.6)
        return tuple(dict.fromkeys(spelled[k] for k in found))

    def _display(self, key: str) -> str:
        canonical = self._keys[key]
        if canonical.casefold() == key:
            return canonical
        return next(a for a in self._aliases if a.casefold() == key)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.strip().casefold() in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={list(self._entries)})"
