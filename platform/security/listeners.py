"""Listeners in Kafka's syntax: `NAME://host:port`, each name mapped to a security protocol.

A broker binds every entry of `listeners`, tells clients the matching entry of
`advertised.listeners` (by name), and talks to other brokers on `inter.broker.listener.name`.
`listener.security.protocol.map` says what a name means (`INTERNAL:SASL_SSL`); the four
protocol names map to themselves by default, so `SASL_SSL://127.0.0.1:9094` needs no map entry.
Everything here is a pure function of the settings; a `ListenerError` names the setting at fault.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from riverbed.security.session import SecurityProtocol

LISTENER_PATTERN: Final = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)://([^:/\s]*):(\d{1,5})")
# Kafka's default listener.security.protocol.map (less its KRaft CONTROLLER entry).
DEFAULT_PROTOCOL_MAP: Final = {p.value: p for p in SecurityProtocol}
# What an empty host means. Kafka binds every interface and advertises the machine's name;
# Riverbed keeps to loopback unless an address is written out (0.0.0.0 binds every interface).
EMPTY_HOST_MEANS: Final = "127.0.0.1"


class ListenerError(ValueError):
    """A listener setting is malformed or inconsistent; `key` names the setting."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, slots=True)
class Listener:
    name: str  # upper case, as Kafka normalises listener names
    host: str
    port: int
    protocol: SecurityProtocol

    def __str__(self) -> str:
        return f"{self.name}://{self.host}:{self.port}"


def parse_protocol_map(entries: Iterable[str]) -> dict[str, SecurityProtocol]:
    """`listener.security.protocol.map` entries (`NAME:PROTOCOL`) on top of the default map."""
    mapping = dict(DEFAULT_PROTOCOL_MAP)
    for entry in entries:
        name, sep, protocol = entry.partition(":")
        try:
            mapping[name.strip().upper()] = SecurityProtocol(protocol.strip().upper())
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            allowed = ", ".join(p.value for p in SecurityProtocol)
            raise ListenerError(
                "listener.security.protocol.map",
                f"listener.security.protocol.map entry {entry!r} is not NAME:PROTOCOL "
                f"with PROTOCOL one of {allowed}",
            ) from None
    return mapping


def parse_listeners(
    key: str, entries: Iterable[str], protocols: Mapping[str, SecurityProtocol]
) -> tuple[Listener, ...]:
    """`NAME://host:port` entries with their protocols; names must be unique and mapped."""
    listeners: list[Listener] = []
    for entry in entries:
        match = LISTENER_PATTERN.fullmatch(entry.strip())
        if match is None or not 0 < int(match.group(3)) < 65536:
            raise ListenerError(key, f"{key} entry {entry!r} is not NAME://host:port")
        name = match.group(1).upper()
        if name not in protocols:
            raise ListenerError(
                key,
                f"{key} names listener {name!r}, which listener.security.protocol.map does not "
                "map to a security protocol",
            )
        if any(existing.name == name for existing in listeners):
            raise ListenerError(key, f"{key} names listener {name!r} twice")
        host = match.group(2) or EMPTY_HOST_MEANS
        listeners.append(Listener(name, host, int(match.group(3)), protocols[name]))
    if not listeners:
        raise ListenerError(key, f"{key} is empty")
    return tuple(listeners)


@dataclass(frozen=True, slots=True)
class ListenerSet:
    """What the broker binds, what it advertises (same names), and the inter-broker listener."""

    bound: tuple[Listener, ...]
    advertised: tuple[Listener, ...]
    inter_broker: str

    def advertised_by_name(self, name: str) -> Listener:
        for listener in self.advertised:
            if listener.name == name:
                return listener
        raise KeyError(name)


def listener_set(
    listeners: Iterable[str],
    advertised: Iterable[str] | None,
    protocol_map: Iterable[str],
    inter_broker_listener_name: str | None,
) -> ListenerSet:
    """Check the listener settings together, as a broker does before binding anything."""
    protocols = parse_protocol_map(protocol_map)
    bound = parse_listeners("listeners", listeners, protocols)
    ports = [listener.port for listener in bound]
    if len(set(ports)) != len(ports):
        raise ListenerError("listeners", "listeners use the same port twice")
    if advertised is None:
        announced = bound
    else:
        announced = parse_listeners("advertised.listeners", advertised, protocols)
        by_name = {listener.name for listener in bound}
        for listener in announced:
            if listener.name not in by_name:
                raise ListenerError(
                    "advertised.listeners",
                    f"advertised.listeners names {listener.name!r}, which listeners does not",
                )
        missing = [listener.name for listener in bound if listener.name not in _names(announced)]
        if missing:
            # Kafka advertises only what is listed; a bound listener nobody is told about is
            # almost always a mistake, and a client would be sent to no address on it.
            raise ListenerError(
                "advertised.listeners",
                f"advertised.listeners has no address for listener(s) {', '.join(missing)}",
            )
    # Kafka's default is the listener of security.inter.broker.protocol (PLAINTEXT), which a
    # broker with only secured listeners lacks; Riverbed defaults to the first listener instead.
    inter_broker = (inter_broker_listener_name or bound[0].name).upper()
    if inter_broker not in _names(bound):
        raise ListenerError(
            "inter.broker.listener.name",
            f"inter.broker.listener.name {inter_broker!r} is not one of the listeners "
            f"({', '.join(_names(bound))})",
        )
    return ListenerSet(bound, announced, inter_broker)


def _names(listeners: Iterable[Listener]) -> list[str]:
    return [listener.name for listener in listeners]
