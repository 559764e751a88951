"""Open the object store a URL names: `file:///abs/path` or `s3://bucket[/prefix]`.

An S3 store's settings are `remote.storage.s3.*` keys (the broker's `--set` settings), falling
back to the standard AWS environment variables:
- `endpoint`: AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL (none: AWS itself);
- `region` (required): AWS_REGION, then AWS_DEFAULT_REGION;
- `access.key.id`, `secret.access.key`, `session.token`: AWS_ACCESS_KEY_ID,
  AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN. Taken as a whole from one place, the settings when
  they hold any of them, else the environment, so a key id from one never pairs with a secret
  from the other;
- `path.style.access` (true/false, default false): path-style addressing, for MinIO and moto;
- `connect.timeout.ms`, `request.timeout.ms`, `retries`, `retry.backoff.ms`,
  `retry.backoff.max.ms`, `multipart.threshold.bytes`, `multipart.part.bytes`, `list.max.keys`:
  the S3Settings fields of those names (`retries` is `retries_max`), defaults there.
An unknown `remote.storage.s3.*` key is refused, so a typo never silently falls back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

from riverbed.configs import REMOTE_STORAGE_S3
from riverbed.tiering.file_store import FileStore
from riverbed.tiering.s3_store import S3Settings, S3Store
from riverbed.tiering.store import ObjectStore

S3_PREFIX: Final = REMOTE_STORAGE_S3
# Integer settings: the key after S3_PREFIX -> the S3Settings field.
S3_INT_SETTINGS: Final = {
    "connect.timeout.ms": "connect_timeout_ms",
    "request.timeout.ms": "request_timeout_ms",
    "retries": "retries_max",
    "retry.backoff.ms": "retry_backoff_ms",
    "retry.backoff.max.ms": "retry_backoff_max_ms",
    "multipart.threshold.bytes": "multipart_threshold_bytes",
    "multipart.part.bytes": "multipart_part_bytes",
    "list.max.keys": "list_max_keys",
}
CREDENTIAL_SETTINGS: Final = ("access.key.id", "secret.access.key", "session.token")
S3_SETTINGS: Final = frozenset(
    {"endpoint", "region", "path.style.access", *CREDENTIAL_SETTINGS, *S3_INT_SETTINGS}
)


def open_store(
    url: str, settings: Mapping[str, str], environ: Mapping[str, str] = os.environ
) -> ObjectStore:
    """The store `url` names, not yet connected (an S3 store connects on its first call).
    ValueError, one line naming the problem, for a bad URL or setting."""
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ValueError(f"{url}: an object store URL has no query or fragment")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{url}: a file:// URL names a local path (file:///abs/path)")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ValueError(f"{url}: a file:// URL needs an absolute path (file:///abs/path)")
        return FileStore(Path(path))
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"{url}: missing bucket (s3://bucket/prefix)")
        if "@" in parts.netloc or ":" in parts.netloc:
            raise ValueError(
                f"{url}: credentials and endpoint go in {S3_PREFIX}* settings, not the URL"
            )
        try:
            return S3Store(parts.netloc, unquote(parts.path), s3_settings(settings, environ))
        except ValueError as error:
            raise ValueError(f"{url}: {error}") from None
    raise ValueError(f"{url}: unknown object store scheme {parts.scheme!r} (file:// or s3://)")


def s3_settings(settings: Mapping[str, str], environ: Mapping[str, str]) -> S3Settings:
    ours = {
        key[len(S3_PREFIX) :]: value for key, value in settings.items() if key.startswith(S3_PREFIX)
    }
    unknown = sorted(set(ours) - S3_SETTINGS)
    if unknown:
        raise ValueError(f"unknown setting {S3_PREFIX}{unknown[0]}")

    def first(name: str, *variables: str) -> str | None:
        """The setting, else the first environment variable set (to a non-empty value)."""
        value = ours.get(name) or next((environ[v] for v in variables if environ.get(v)), None)
        return value or None

    credentials: Mapping[str, str] = (
        ours
        if any(name in ours for name in CREDENTIAL_SETTINGS)
        else {
            "access.key.id": environ.get("AWS_ACCESS_KEY_ID", ""),
            "secret.access.key": environ.get("AWS_SECRET_ACCESS_KEY", ""),
            "session.token": environ.get("AWS_SESSION_TOKEN", ""),
        }
    )
    return S3Settings(
        region=first("region", "AWS_REGION", "AWS_DEFAULT_REGION") or "",
        endpoint_url=first("endpoint", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
        access_key_id=credentials.get("access.key.id") or None,
        secret_access_key=credentials.get("secret.access.key") or None,
        session_token=credentials.get("session.token") or None,
        addressing_style="path" if _boolean(ours, "path.style.access") else "virtual",
        **{field: _integer(ours, name) for name, field in S3_INT_SETTINGS.items() if name in ours},
    )


def _boolean(settings: Mapping[str, str], name: str) -> bool:
    value = settings.get(name, "false").strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"{S3_PREFIX}{name} must be true or false, got {value!r}")
    return value == "true"


def _integer(settings: Mapping[str, str], name: str) -> int:
    value = settings[name]
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError(f"{S3_PREFIX}{name} must be an integer, got {value!r}") from None
