"""ApiVersions: the API version ranges this broker implements, straight from the spec files."""

from __future__ import annotations

from riverbed.protocol import messages as m
from riverbed.protocol.connection import supported_api_versions
from riverbed.protocol.errors import ErrorCode

ApiVersion = m.ApiVersionsResponse.ApiVersion


async def handle_api_versions(request: m.ApiVersionsRequest) -> m.ApiVersionsResponse:
    api_keys = [
        ApiVersion(api_key=key, min_version=low, max_version=high)
        for key, (low, high) in sorted(supported_api_versions().items())
    ]
    return m.ApiVersionsResponse(error_code=ErrorCode.NONE, api_keys=api_keys)
