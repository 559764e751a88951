"""DescribeAcls, CreateAcls and DeleteAcls: list and change the ACLs in ZooKeeper (KIP-140).

As in Kafka: with no authorizer configured every request is answered SECURITY_DISABLED; listing
needs DESCRIBE on the cluster and changing ALTER on the cluster (CLUSTER_AUTHORIZATION_FAILED
otherwise). Any broker answers. A malformed binding or filter (unknown codes, a CLUSTER name
other than kafka-cluster, an empty name, a principal not written Type:name) fails alone with
INVALID_REQUEST and a message saying why; Kafka refuses unknown codes for the whole request.

Changes are version-conditional writes (riverbed.security.acl_store), one per resource pattern
touched; the answer comes once this broker's cache shows them, so a DescribeAcls sent next to
the same broker sees the change (other brokers follow within moments). DescribeAcls, and
DeleteAcls with filters that can match many patterns, work on this broker's cache; a DeleteAcls
filter naming one pattern exactly also reads it from ZooKeeper, as Kafka's does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Protocol, TypeVar

from riverbed.broker.handlers.context import BrokerContext
from riverbed.broker.handlers.zookeeper_bound import zookeeper_bound
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    InvalidAclError,
    ResourcePattern,
)
from riverbed.security.acl_store import AclDeletion, AclStore

NO_AUTHORIZER: Final = "No Authorizer is configured on the broker"
NOT_AUTHORIZED: Final = "Cluster authorization failed: the principal may not {} ACLs"

DescribedResource = m.DescribeAclsResponse.DescribeAclsResource
AclDescription = m.DescribeAclsResponse.AclDescription
CreationResult = m.CreateAclsResponse.AclCreationResult
FilterResult = m.DeleteAclsResponse.DeleteAclsFilterResult
MatchingAcl = m.DeleteAclsResponse.DeleteAclsMatchingAcl
E = TypeVar("E")
T = TypeVar("T")


async def handle_describe_acls(
    ctx: BrokerContext, request: m.DescribeAclsRequest, access: Access
) -> m.DescribeAclsResponse:
    store = ctx.acl_store
    if store is None:
        return m.DescribeAclsResponse(
            error_code=ErrorCode.SECURITY_DISABLED, error_message=NO_AUTHORIZER
        )
    if not access.allows_cluster(AclOperation.DESCRIBE):
        return m.DescribeAclsResponse(
            error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            error_message=NOT_AUTHORIZED.format("describe"),
        )
    try:
        wanted = _binding_filter(request)
    except InvalidAclError as error:
        return m.DescribeAclsResponse(
            error_code=ErrorCode.INVALID_REQUEST, error_message=str(error)
        )
    resources: dict[ResourcePattern, DescribedResource] = {}
    for binding in store.snapshot.bindings(wanted):
        pattern = binding.pattern
        described = resources.get(pattern)
        if described is None:
            described = DescribedResource(
                resource_type=pattern.resource_type,
                resource_name=pattern.name,
                pattern_type=pattern.pattern_type,
            )
            resources[pattern] = described
        described.acls.append(
            AclDescription(
                principal=binding.principal,
                host=binding.host,
                operation=binding.operation,
                permission_type=binding.permission,
            )
        )
    return m.DescribeAclsResponse(
        error_code=ErrorCode.NONE, error_message=None, resources=list(resources.values())
    )


async def handle_create_acls(
    ctx: BrokerContext, request: m.CreateAclsRequest, access: Access
) -> m.CreateAclsResponse:
    results = [CreationResult(error_message=None) for _ in request.creations]
    refusal = _refusal(ctx.acl_store, access, "create")
    if refusal is not None:
        for result in results:
            result.error_code, result.error_message = refusal
        return m.CreateAclsResponse(results=results)
    assert ctx.acl_store is not None
    valid = _parse_each(request.creations, _binding, results, "Failed to create ACL: ")
    creating = ctx.acl_store.create([binding for _, binding in valid])
    outcomes = await _bounded(ctx, "creating ACLs", creating, valid, results)
    if outcomes is None:
        return m.CreateAclsResponse(results=results)
    for (index, binding), failure in zip(valid, outcomes, strict=True):
        if failure is not None:
            results[index].error_code = ErrorCode.UNKNOWN_SERVER_ERROR
            results[index].error_message = f"Failed to create ACL {binding}: {failure}"
    return m.CreateAclsResponse(results=results)


async def handle_delete_acls(
    ctx: BrokerContext, request: m.DeleteAclsRequest, access: Access
) -> m.DeleteAclsResponse:
    results = [FilterResult(error_message=None) for _ in request.filters]
    refusal = _refusal(ctx.acl_store, access, "delete")
    if refusal is not None:
        for result in results:
            result.error_code, result.error_message = refusal
        return m.DeleteAclsResponse(filter_results=results)
    assert ctx.acl_store is not None
    valid = _parse_each(request.filters, _binding_filter, results, "")
    deleting = ctx.acl_store.delete([wanted for _, wanted in valid])
    deleted = await _bounded(ctx, "deleting ACLs", deleting, valid, results)
    if deleted is None:
        return m.DeleteAclsResponse(filter_results=results)
    for (index, _), deletions in zip(valid, deleted, strict=True):
        results[index].matching_acls = [_matching(deletion) for deletion in deletions]
    return m.DeleteAclsResponse(filter_results=results)


def _matching(deletion: AclDeletion) -> MatchingAcl:
    binding, error = deletion.binding, deletion.error
    return MatchingAcl(
        error_code=ErrorCode.NONE if error is None else ErrorCode.UNKNOWN_SERVER_ERROR,
        error_message=None if error is None else f"Failed to delete ACL {binding}: {error}",
        resource_type=binding.resource_type,
        resource_name=binding.resource_name,
        pattern_type=binding.pattern_type,
        principal=binding.principal,
        host=binding.host,
        operation=binding.operation,
        permission_type=binding.permission,
    )


def _refusal(store: AclStore | None, access: Access, doing: str) -> tuple[int, str] | None:
    """The error of a whole CreateAcls / DeleteAcls, or None if it may go ahead."""
    if store is None:
        return ErrorCode.SECURITY_DISABLED, NO_AUTHORIZER
    if not access.allows_cluster(AclOperation.ALTER):
        return ErrorCode.CLUSTER_AUTHORIZATION_FAILED, NOT_AUTHORIZED.format(doing)
    return None


class _EntryResult(Protocol):
    error_code: int
    error_message: str | None


async def _bounded(
    ctx: BrokerContext,
    what: str,
    call: Awaitable[T],
    valid: Sequence[tuple[int, object]],
    results: Sequence[_EntryResult],
) -> T | None:
    """The store's answer; None once ZooKeeper did not answer in time (or the connection was
    lost), with that error set on the result of every entry the store was given."""
    try:
        async with zookeeper_bound(ctx.config, what):
            return await call
    except KafkaError as error:
        for index, _ in valid:
            results[index].error_code = error.code
            results[index].error_message = str(error)
        return None


def _parse_each(
    entries: Sequence[E], parse: Callable[[E], T], results: Sequence[_EntryResult], prefix: str
) -> list[tuple[int, T]]:
    """Each entry of a request parsed on its own: a malformed one fails alone, its result set to
    INVALID_REQUEST; the others, with their index, go on."""
    valid = []
    for index, entry in enumerate(entries):
        try:
            valid.append((index, parse(entry)))
        except InvalidAclError as error:
            results[index].error_code = ErrorCode.INVALID_REQUEST
            results[index].error_message = f"{prefix}{error}"
    return valid


def _binding(c: m.CreateAclsRequest.AclCreation) -> AclBinding:
    return AclBinding.from_codes(
        c.resource_type,
        c.resource_name,
        c.resource_pattern_type,
        c.principal,
        c.host,
        c.operation,
        c.permission_type,
    )


class _WireFilter(Protocol):
    """DescribeAclsRequest and DeleteAclsRequest's filters: the same fields."""

    resource_type_filter: int
    resource_name_filter: str | None
    pattern_type_filter: int
    principal_filter: str | None
    host_filter: str | None
    operation: int
    permission_type: int


def _binding_filter(f: _WireFilter) -> AclBindingFilter:
    return AclBindingFilter.from_codes(
        f.resource_type_filter,
        f.resource_name_filter,
        f.pattern_type_filter,
        f.principal_filter,
        f.host_filter,
        f.operation,
        f.permission_type,
    )
