"""Hypothesis strategies for ACLs: few names, principals and hosts, so that draws collide,
overlap as prefixes and hit the wildcards often."""

from __future__ import annotations

from hypothesis import strategies as st
from riverbed.security.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

RESOURCE_TYPES = st.sampled_from([ResourceType.TOPIC, ResourceType.GROUP])
names = st.text(alphabet="ab", min_size=1, max_size=3)
resource_names = names | st.just("*")
principals = st.sampled_from(["User:alice", "User:bob", "User:*"])
request_principals = st.sampled_from(["User:alice", "User:bob", "User:ANONYMOUS"])
hosts = st.sampled_from(["10.0.0.1", "10.0.0.2", "*"])
request_hosts = st.sampled_from(["10.0.0.1", "10.0.0.2"])
# Operations whose implications (rule 5) and ALL are in play.
operations = st.sampled_from(
    [
        AclOperation.ALL,
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.DELETE,
        AclOperation.DESCRIBE,
        AclOperation.ALTER_CONFIGS,
        AclOperation.DESCRIBE_CONFIGS,
    ]
)
PERMISSIONS = st.sampled_from([AclPermissionType.ALLOW, AclPermissionType.DENY])
request_operations = operations.filter(lambda op: op is not AclOperation.ALL)


@st.composite
def bindings(
    draw: st.DrawFn, permission: st.SearchStrategy[AclPermissionType] | None = None
) -> AclBinding:
    return AclBinding(
        draw(RESOURCE_TYPES),
        draw(resource_names),
        draw(st.sampled_from([PatternType.LITERAL, PatternType.PREFIXED])),
        draw(principals),
        draw(hosts),
        draw(operations),
        draw(PERMISSIONS if permission is None else permission),
    )
