"""An immutable, indexed view of every ACL a broker knows: what the authorizer decides from.

A snapshot is never changed: `with_entries` returns a new one, so a reader holding a snapshot
(the authorizer, in the middle of a request) always sees one whole state, and the cache swaps
its current snapshot in one assignment. Changes are rare (an operator adds or removes ACLs) and
decisions frequent, so the copy on change buys index lookups per decision:

* literal patterns by (resource type, name): the resource's own name and the `*` wildcard are
  two dict lookups;
* prefixed patterns by (resource type, prefix), plus the distinct prefix lengths present per
  type: a name is checked against `name[:length]` for those lengths only, not every prefix.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from riverbed.security.acl import (
    ANY_BINDING,
    WILDCARD_RESOURCE,
    AclBinding,
    AclBindingFilter,
    AclEntry,
    PatternType,
    ResourcePattern,
    ResourceType,
)

_Key = tuple[ResourceType, str]
_NO_ENTRIES: Final[frozenset[AclEntry]] = frozenset()


@dataclass(frozen=True, slots=True)
class PatternAcls:
    """One pattern's ACL entries, also grouped by principal: a decision reads only the entries
    of the caller's principal and of `User:*`, however many other principals the pattern has."""

    entries: frozenset[AclEntry]
    by_principal: Mapping[str, tuple[AclEntry, ...]]

    @classmethod
    def of(cls, entries: frozenset[AclEntry]) -> PatternAcls:
        grouped: dict[str, list[AclEntry]] = {}
        for entry in entries:
            grouped.setdefault(entry.principal, []).append(entry)
        return cls(entries, {principal: tuple(found) for principal, found in grouped.items()})


@dataclass(frozen=True, slots=True)
class AclSnapshot:
    """Resource pattern -> its ACL entries (never an empty set: a pattern without entries is
    absent, as its znode is)."""

    acls: Mapping[ResourcePattern, frozenset[AclEntry]] = field(default_factory=dict)
    _literal: dict[_Key, PatternAcls] = field(init=False, repr=False, compare=False)
    _prefixed: dict[_Key, PatternAcls] = field(init=False, repr=False, compare=False)
    _prefix_lengths: dict[ResourceType, tuple[int, ...]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        acls = dict(self.acls)
        for pattern, entries in acls.items():
            if not entries:
                raise ValueError(f"{pattern} has no ACL entries: it must be absent instead")
        literal = {
            (p.resource_type, p.name): PatternAcls.of(e)
            for p, e in acls.items()
            if p.pattern_type is PatternType.LITERAL
        }
        prefixed = {
            (p.resource_type, p.name): PatternAcls.of(e)
            for p, e in acls.items()
            if p.pattern_type is PatternType.PREFIXED
        }
        self._set(acls, literal, prefixed)

    def _set(
        self,
        acls: dict[ResourcePattern, frozenset[AclEntry]],
        literal: dict[_Key, PatternAcls],
        prefixed: dict[_Key, PatternAcls],
    ) -> None:
        lengths: dict[ResourceType, set[int]] = {}
        for resource_type, name in prefixed:
            lengths.setdefault(resource_type, set()).add(len(name))
        object.__setattr__(self, "acls", acls)
        object.__setattr__(self, "_literal", literal)
        object.__setattr__(self, "_prefixed", prefixed)
        object.__setattr__(
            self, "_prefix_lengths", {t: tuple(sorted(n)) for t, n in lengths.items()}
        )

    def __len__(self) -> int:
        """The number of ACL bindings."""
        return sum(len(entries) for entries in self.acls.values())

    def entries(self, pattern: ResourcePattern) -> frozenset[AclEntry]:
        return self.acls.get(pattern, _NO_ENTRIES)

    def with_entries(self, pattern: ResourcePattern, entries: frozenset[AclEntry]) -> AclSnapshot:
        """A snapshot with `pattern`'s entries replaced (removed when `entries` is empty); the
        indexes of every other pattern are shared with this one, not rebuilt."""
        if self.acls.get(pattern, _NO_ENTRIES) == entries:
            return self
        acls = dict(self.acls)
        literal, prefixed = dict(self._literal), dict(self._prefixed)
        index = literal if pattern.pattern_type is PatternType.LITERAL else prefixed
        key = (pattern.resource_type, pattern.name)
        if entries:
            acls[pattern] = entries
            index[key] = PatternAcls.of(entries)
        else:
            acls.pop(pattern, None)
            index.pop(key, None)
        changed: AclSnapshot = object.__new__(AclSnapshot)
        changed._set(acls, literal, prefixed)
        return changed

    def matching(self, resource_type: ResourceType, name: str) -> list[PatternAcls]:
        """The ACLs of every pattern covering the resource `name` of `resource_type`: its
        literal pattern, the type's `*` wildcard and each prefixed pattern `name` starts with."""
        found = []
        literal = self._literal
        own = literal.get((resource_type, name))
        if own is not None:
            found.append(own)
        if name != WILDCARD_RESOURCE:
            wildcard = literal.get((resource_type, WILDCARD_RESOURCE))
            if wildcard is not None:
                found.append(wildcard)
        for length in self._prefix_lengths.get(resource_type, ()):
            if length > len(name):
                break
            acls = self._prefixed.get((resource_type, name[:length]))
            if acls is not None:
                found.append(acls)
        return found

    def patterns_of(self, resource_type: ResourceType) -> Iterator[ResourcePattern]:
        return (pattern for pattern in self.acls if pattern.resource_type is resource_type)

    def bindings(self, wanted: AclBindingFilter = ANY_BINDING) -> list[AclBinding]:
        """Every binding `wanted` matches, ordered by resource type, pattern and name."""
        found = []
        for pattern in sorted(self.acls, key=_pattern_order):
            if not wanted.matches_pattern(pattern):
                continue
            for entry in sorted(self.acls[pattern], key=entry_order):
                if wanted.matches_entry(entry):
                    found.append(AclBinding.of(pattern, entry))
        return found


def _pattern_order(pattern: ResourcePattern) -> tuple[int, int, str]:
    return (pattern.resource_type, pattern.pattern_type, pattern.name)


def entry_order(entry: AclEntry) -> tuple[str, str, int, int]:
    return (entry.principal, entry.host, entry.operation, entry.permission)


EMPTY_SNAPSHOT: Final = AclSnapshot()
