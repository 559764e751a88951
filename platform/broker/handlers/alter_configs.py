"""AlterConfigs and IncrementalAlterConfigs: change a topic's config overrides.

Any broker serves these, not only the controller: Kafka's admin clients send topic config changes
to whichever broker they like (only BROKER resources go to the broker named), and the change is
one write of the topic's config znode, which every broker watches and applies live. The answer
waits, boundedly, until this broker's own metadata cache shows the new overrides, so a
DescribeConfigs sent next on the same connection reads the change back.

Broker configs are static in Riverbed (read from the config file and flags at start), except the
replication throttle rates (`configs.DYNAMIC_BROKER_CONFIGS`), which are set cluster-wide on
Kafka's default broker entity (a BROKER resource with an empty name) and watched by every broker.
Anything else on a BROKER resource, or a broker id as its name, is refused with INVALID_REQUEST,
as Kafka refuses a config it cannot update dynamically.

The incremental form is a read-modify-write of the overrides, made conditional on the config
znode's version by ClusterMetadataStore.update_topic_config: concurrent changes, on one broker or
several, never lose each other's keys (the loser re-reads and re-applies its operations).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Final, TypeVar

from riverbed.broker.handlers.context import BrokerContext
from riverbed.broker.handlers.describe_configs import config_refusal
from riverbed.broker.handlers.zookeeper_bound import zookeeper_bound
from riverbed.configs import (
    DYNAMIC_BROKER_CONFIGS,
    TOPIC_CONFIGS,
    BrokerConfig,
    ConfigDef,
    ConfigError,
    ConfigType,
    effective_topic_config,
)
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation

RESOURCE_TOPIC: Final = 2
RESOURCE_BROKER: Final = 4
# How long an accepted change waits for this broker to apply it before answering anyway (the
# change is durable in ZooKeeper by then; only read-your-writes on this broker is at stake).
CONFIG_APPLIED_WAIT_MS_MAX: Final = 10_000

AlterResult = m.AlterConfigsResponse.AlterConfigsResourceResponse
IncrementalResult = m.IncrementalAlterConfigsResponse.AlterConfigsResourceResponse
Overrides = dict[str, str | None]

V = TypeVar("V")


class ConfigOperation(enum.IntEnum):
    """IncrementalAlterConfigs' per-key operations (the wire values)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


async def handle_alter_configs(
    ctx: BrokerContext, request: m.AlterConfigsRequest, access: Access
) -> m.AlterConfigsResponse:
    """Replace each topic's whole set of overrides with the given configs (keys left out go back
    to their defaults)."""
    responses = []
    for resource in request.resources:
        result = AlterResult(
            resource_type=resource.resource_type, resource_name=resource.resource_name
        )
        responses.append(result)
        change = functools.partial(_replace, [(c.name, c.value) for c in resource.configs])
        result.error_code, result.error_message = await _alter(
            ctx,
            access,
            resource.resource_type,
            resource.resource_name,
            change,
            request.validate_only,
        )
    return m.AlterConfigsResponse(responses=responses)


async def handle_incremental_alter_configs(
    ctx: BrokerContext, request: m.IncrementalAlterConfigsRequest, access: Access
) -> m.IncrementalAlterConfigsResponse:
    """SET, DELETE, APPEND to or SUBTRACT from single keys of each topic's overrides."""
    responses = []
    for resource in request.resources:
        result = IncrementalResult(
            resource_type=resource.resource_type, resource_name=resource.resource_name
        )
        responses.append(result)
        change = functools.partial(_apply_operations, ctx.config, resource.configs)
        result.error_code, result.error_message = await _alter(
            ctx,
            access,
            resource.resource_type,
            resource.resource_name,
            change,
            request.validate_only,
        )
    return m.IncrementalAlterConfigsResponse(responses=responses)


async def _alter(
    ctx: BrokerContext,
    access: Access,
    resource_type: int,
    name: str,
    change: Callable[[Mapping[str, ConfigDef], Mapping[str, str]], Overrides],
    validate_only: bool,
) -> tuple[int, str | None]:
    """Apply `change` to one resource; the (error code, message) of its result. Needs
    ALTER_CONFIGS on the topic, or on the cluster for broker configs."""
    refusal = config_refusal(access, AclOperation.ALTER_CONFIGS, resource_type, name)
    if refusal is not None:
        return refusal.code, str(refusal)
    try:
        if resource_type == RESOURCE_BROKER:
            await _alter_broker_defaults(ctx, name, change, validate_only=validate_only)
        elif resource_type == RESOURCE_TOPIC:
            await _alter_topic(ctx, name, change, validate_only=validate_only)
        else:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"unsupported resource type {resource_type}: only topic configs and dynamic "
                "broker configs can be altered",
            )
    except KafkaError as error:
        return error.code, str(error)
    return ErrorCode.NONE, None


async def _alter_broker_defaults(
    ctx: BrokerContext,
    name: str,
    change: Callable[[Mapping[str, ConfigDef], Mapping[str, str]], Overrides],
    *,
    validate_only: bool,
) -> None:
    if name != "":
        raise KafkaError(
            ErrorCode.INVALID_REQUEST,
            f"broker configs are static in Riverbed (broker {name!r}), except "
            f"{', '.join(DYNAMIC_BROKER_CONFIGS)}, which are set cluster-wide: use the default "
            "broker entity (an empty resource name)",
        )
    async with zookeeper_bound(ctx.config, "altering the default broker configs"):
        overrides = await ctx.store.update_broker_default_config(
            functools.partial(change, DYNAMIC_BROKER_CONFIGS), validate_only=validate_only
        )
    if not validate_only:
        await ctx.wait_until(
            lambda: dict(ctx.cache.broker_default_configs) == overrides,
            CONFIG_APPLIED_WAIT_MS_MAX / 1000,
        )


async def _alter_topic(
    ctx: BrokerContext,
    name: str,
    change: Callable[[Mapping[str, ConfigDef], Mapping[str, str]], Overrides],
    *,
    validate_only: bool,
) -> None:
    # Whether the topic exists is ZooKeeper's answer, not this broker's cache's: a topic just
    # created through another broker may not be in the cache yet (Kafka's ZooKeeper-mode
    # AlterConfigs asks ZooKeeper too). A conditional read-modify-write; an unknown topic is
    # UNKNOWN_TOPIC_OR_PARTITION and a ConfigError INVALID_CONFIG.
    known_before = ctx.cache.topic(name) is not None
    async with zookeeper_bound(ctx.config, f"altering the configs of topic {name!r}"):
        overrides = await ctx.store.update_topic_config(
            name, functools.partial(change, TOPIC_CONFIGS), validate_only=validate_only
        )
    if validate_only:
        return

    def applied() -> bool:
        current = ctx.cache.topic(name)
        if current is None:
            return known_before  # deleted since: nothing left to wait for
        return dict(current.configs) == overrides

    await ctx.wait_until(applied, CONFIG_APPLIED_WAIT_MS_MAX / 1000)


def _replace(
    configs: list[tuple[str, str | None]],
    _defs: Mapping[str, ConfigDef],
    _current: Mapping[str, str],
) -> Overrides:
    return dict(_unique(configs))


def _apply_operations(
    broker: BrokerConfig,
    operations: list[m.IncrementalAlterConfigsRequest.AlterableConfig],
    defs: Mapping[str, ConfigDef],
    current: Mapping[str, str],
) -> Overrides:
    overrides: Overrides = dict(current)
    for key, (operation, value) in _unique(
        (op.name, (op.config_operation, op.value)) for op in operations
    ):
        definition = _definition(defs, key)
        if operation == ConfigOperation.SET:
            overrides[key] = value
        elif operation == ConfigOperation.DELETE:
            overrides.pop(key, None)
        elif operation in (ConfigOperation.APPEND, ConfigOperation.SUBTRACT):
            items = _list_items(defs, definition, operation, value)
            effective = effective_topic_config(broker, current)[key].value or ""
            present = [item for item in effective.split(",") if item]
            if operation == ConfigOperation.APPEND:
                updated = present + [item for item in items if item not in present]
            else:
                updated = [item for item in present if item not in items]
            overrides[key] = ",".join(updated)
        else:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST, f"unknown config operation {operation} for {key!r}"
            )
    return overrides


def _definition(defs: Mapping[str, ConfigDef], key: str) -> ConfigDef:
    definition = defs.get(key)
    if definition is None:
        kind = "topic" if defs is TOPIC_CONFIGS else "dynamic broker"
        raise ConfigError(key, f"unknown {kind} config {key!r}; known: {', '.join(defs)}")
    return definition


def _list_items(
    defs: Mapping[str, ConfigDef], definition: ConfigDef, operation: int, value: str | None
) -> list[str]:
    name = ConfigOperation(operation).name
    if definition.type is not ConfigType.LIST:
        list_configs = ", ".join(k for k, d in defs.items() if d.type is ConfigType.LIST)
        raise ConfigError(
            definition.name,
            f"{name} applies only to list configs ({list_configs}), not {definition.name!r}",
        )
    if value is None:
        raise ConfigError(definition.name, f"{name} of {definition.name!r} needs a value")
    return [item.strip() for item in value.split(",") if item.strip()]


def _unique(pairs: Iterable[tuple[str, V]]) -> list[tuple[str, V]]:
    """The pairs in order; INVALID_REQUEST if a key repeats (which one would win is unclear)."""
    seen: dict[str, V] = {}
    for key, value in pairs:
        if key in seen:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"config {key!r} appears more than once")
        seen[key] = value
    return list(seen.items())
