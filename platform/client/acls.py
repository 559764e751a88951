"""The admin client's ACL requests and answers: AclBinding / AclBindingFilter to and from the
wire structs of CreateAcls, DescribeAcls and DeleteAcls (the model is riverbed.security.acl).

Pure conversions; `riverbed.client.admin.Admin` sends the requests. An error in an answer
becomes its `riverbed.errors` class with the broker's message; an ACL the broker lists with a
code this client does not know is skipped, as it can match nothing the client could name.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from riverbed.errors import KafkaError, error_for
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.security.acl import AclBinding, AclBindingFilter, InvalidAclError

log = logging.getLogger(__name__)


def create_request(bindings: Sequence[AclBinding]) -> m.CreateAclsRequest:
    return m.CreateAclsRequest(
        creations=[
            m.CreateAclsRequest.AclCreation(
                resource_type=binding.resource_type,
                resource_name=binding.resource_name,
                resource_pattern_type=binding.pattern_type,
                principal=binding.principal,
                host=binding.host,
                operation=binding.operation,
                permission_type=binding.permission,
            )
            for binding in bindings
        ]
    )


def creation_errors(
    bindings: Sequence[AclBinding], response: m.CreateAclsResponse
) -> list[KafkaError | None]:
    """Per binding, in order: None, or the error the broker refused it with."""
    if len(response.results) != len(bindings):
        raise error_for(
            ErrorCode.UNKNOWN_SERVER_ERROR,
            f"{len(response.results)} CreateAcls results for {len(bindings)} ACLs",
        )
    return [
        None
        if result.error_code == ErrorCode.NONE
        else error_for(result.error_code, f"{binding}: {result.error_message or ''}".rstrip(": "))
        for binding, result in zip(bindings, response.results, strict=True)
    ]


def describe_request(wanted: AclBindingFilter) -> m.DescribeAclsRequest:
    return m.DescribeAclsRequest(
        resource_type_filter=wanted.resource_type,
        resource_name_filter=wanted.resource_name,
        pattern_type_filter=wanted.pattern_type,
        principal_filter=wanted.principal,
        host_filter=wanted.host,
        operation=wanted.operation,
        permission_type=wanted.permission,
    )


def described_bindings(response: m.DescribeAclsResponse) -> list[AclBinding]:
    """The bindings of a DescribeAcls answer; its error raised as its typed class."""
    if response.error_code != ErrorCode.NONE:
        raise error_for(response.error_code, response.error_message)
    found = []
    for resource in response.resources:
        for acl in resource.acls:
            binding = _binding(
                resource.resource_type,
                resource.resource_name,
                resource.pattern_type,
                acl.principal,
                acl.host,
                acl.operation,
                acl.permission_type,
            )
            if binding is not None:
                found.append(binding)
    return found


def delete_request(filters: Sequence[AclBindingFilter]) -> m.DeleteAclsRequest:
    return m.DeleteAclsRequest(
        filters=[
            m.DeleteAclsRequest.DeleteAclsFilter(
                resource_type_filter=wanted.resource_type,
                resource_name_filter=wanted.resource_name,
                pattern_type_filter=wanted.pattern_type,
                principal_filter=wanted.principal,
                host_filter=wanted.host,
                operation=wanted.operation,
                permission_type=wanted.permission,
            )
            for wanted in filters
        ]
    )


def deleted_bindings(
    filters: Sequence[AclBindingFilter], response: m.DeleteAclsResponse
) -> list[AclBinding]:
    """Every binding the filters removed, in filter order; the first error raised."""
    if len(response.filter_results) != len(filters):
        raise error_for(
            ErrorCode.UNKNOWN_SERVER_ERROR,
            f"{len(response.filter_results)} DeleteAcls results for {len(filters)} filters",
        )
    deleted = []
    for result in response.filter_results:
        if result.error_code != ErrorCode.NONE:
            raise error_for(result.error_code, result.error_message)
        for acl in result.matching_acls:
            if acl.error_code != ErrorCode.NONE:
                raise error_for(acl.error_code, acl.error_message)
            binding = _binding(
                acl.resource_type,
                acl.resource_name,
                acl.pattern_type,
                acl.principal,
                acl.host,
                acl.operation,
                acl.permission_type,
            )
            if binding is not None:
                deleted.append(binding)
    return deleted


def _binding(
    resource_type: int,
    name: str,
    pattern_type: int,
    principal: str,
    host: str,
    operation: int,
    permission: int,
) -> AclBinding | None:
    try:
        return AclBinding.from_codes(
            resource_type, name, pattern_type, principal, host, operation, permission
        )
    except InvalidAclError as error:
        log.warning("skipping an ACL this client cannot represent: %s", error)
        return None
