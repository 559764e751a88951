"""DescribeConfigs: effective topic configs (with their source), read-only broker configs and the
cluster-wide dynamic broker configs."""

from __future__ import annotations

from riverbed.broker.handlers.context import BrokerContext
from riverbed.configs import ConfigValue, effective_broker_config, effective_topic_config
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

Result = m.DescribeConfigsResponse.DescribeConfigsResult
Entry = m.DescribeConfigsResponse.DescribeConfigsResourceResult
Synonym = m.DescribeConfigsResponse.DescribeConfigsSynonym

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4


def config_refusal(
    access: Access, operation: AclOperation, resource_type: int, name: str
) -> KafkaError | None:
    """The error of a config request on a topic or broker resource the principal may not
    `operation` (DESCRIBE_CONFIGS or ALTER_CONFIGS): a broker's configs are the cluster's."""
    if resource_type == RESOURCE_TOPIC:
        if not access.allows(operation, ResourceType.TOPIC, name):
            return KafkaError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed.")
    elif resource_type == RESOURCE_BROKER and not access.allows_cluster(operation):
        return KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")
    return None


async def handle_describe_configs(
    ctx: BrokerContext, request: m.DescribeConfigsRequest, version: int, access: Access
) -> m.DescribeConfigsResponse:
    """Needs DESCRIBE_CONFIGS on the topic (TOPIC_AUTHORIZATION_FAILED) or, for the broker, on
    the cluster (CLUSTER_AUTHORIZATION_FAILED)."""
    results = []
    for resource in request.resources:
        result = Result(resource_type=resource.resource_type, resource_name=resource.resource_name)
        results.append(result)
        refusal = config_refusal(
            access, AclOperation.DESCRIBE_CONFIGS, resource.resource_type, resource.resource_name
        )
        if refusal is not None:
            result.error_code, result.error_message = refusal.code, refusal.message or None
            continue
        values = _resource_configs(ctx, resource.resource_type, resource.resource_name, result)
        if values is None:
            continue
        keys = resource.configuration_keys
        for value in values.values():
            if keys is not None and value.name not in keys:
                continue
            result.configs.append(_entry(value, version, request))
    return m.DescribeConfigsResponse(results=results)


def _resource_configs(
    ctx: BrokerContext, resource_type: int, name: str, result: Result
) -> dict[str, ConfigValue] | None:
    if resource_type == RESOURCE_TOPIC:
        metadata = ctx.cache.topic(name)
        if metadata is None:
            result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            result.error_message = f"unknown topic {name!r}"
            return None
        return effective_topic_config(ctx.config, metadata.configs)
    if resource_type == RESOURCE_BROKER:
        if name not in ("", str(ctx.broker_id)):
            result.error_code = ErrorCode.INVALID_REQUEST
            result.error_message = f"broker {name} is not this broker ({ctx.broker_id})"
            return None
        return effective_broker_config(ctx.config, ctx.cache.broker_default_configs)
    result.error_code = ErrorCode.INVALID_REQUEST
    result.error_message = f"unsupported resource type {resource_type}"
    return None


def _entry(value: ConfigValue, version: int, request: m.DescribeConfigsRequest) -> Entry:
    entry = Entry(
        name=value.name,
        value=None if value.sensitive else value.value,
        read_only=value.read_only,
        config_source=int(value.source),
        is_sensitive=value.sensitive,
        config_type=value.type.value,
    )
    if request.include_synonyms:
        entry.synonyms = [
            Synonym(name=s.name, value=s.value, source=int(s.source)) for s in value.synonyms
        ]
    if request.include_documentation:
        entry.documentation = value.documentation
    return entry
