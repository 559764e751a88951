"""Broker settings from `RIVERBED_*` environment variables, the way Confluent's Kafka images take
theirs, so a container is configured without a config file.

`RIVERBED_<NAME>` sets the broker setting NAME lower-cased, with `___` -> `-`, `__` -> `_` and
`_` -> `.`: `RIVERBED_LOG_RETENTION_MS` sets `log.retention.ms`, `RIVERBED_ZOOKEEPER_CONNECT`
sets `zookeeper.connect`, `RIVERBED_REMOTE_STORAGE_S3_ENDPOINT` sets
`remote.storage.s3.endpoint`.

Variables that are not broker settings (NOT_SETTINGS, read elsewhere) are skipped. Any other
`RIVERBED_*` variable must name a known broker setting: a typo is an error naming the variable,
never a silently ignored setting. Values are checked here too, so a bad one is reported with the
variable that carried it. The standard AWS_* variables are not ours: the S3 store reads them.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from typing import Final

from riverbed.configs import BROKER_CONFIGS, REMOTE_STORAGE_S3, ConfigError

PREFIX: Final = "RIVERBED_"
# RIVERBED_* variables with another reader: the CLI's logging level and format.
NOT_SETTINGS: Final = frozenset({"RIVERBED_LOG_LEVEL", "RIVERBED_LOG_FORMAT"})

_SEPARATORS: Final = {"___": "-", "__": "_", "_": "."}
# Longest first, so `___` is one dash rather than an underscore and a dot.
_SEPARATOR: Final = re.compile("___|__|_")


def setting_name(variable: str) -> str:
    """The broker setting a `RIVERBED_*` variable sets: `RIVERBED_LOG_DIRS` -> `log.dirs`."""
    if not variable.startswith(PREFIX):
        raise ValueError(f"{variable} does not start with {PREFIX}")
    name = variable[len(PREFIX) :].lower()
    return _SEPARATOR.sub(lambda match: _SEPARATORS[match.group()], name)


def settings_from_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The broker settings the `RIVERBED_*` variables of `environ` set. ConfigError (one line,
    naming the variable) for a variable that names no broker setting or holds a bad value."""
    settings: dict[str, str] = {}
    for variable, value in sorted(environ.items()):
        if not variable.startswith(PREFIX) or variable in NOT_SETTINGS:
            continue
        name = setting_name(variable)
        if name.startswith(REMOTE_STORAGE_S3):
            _check_s3_setting(variable, name)
        elif name in BROKER_CONFIGS:
            try:
                BROKER_CONFIGS[name].parse(value)
            except ConfigError as error:
                message = f"environment variable {variable}: {error.message}"
                raise ConfigError(name, message) from None
        else:
            raise ConfigError(name, _unknown(variable, name))
        settings[name] = value
    return settings


def _check_s3_setting(variable: str, name: str) -> None:
    # Imported here: the S3 store pulls in aiobotocore, which only brokers that tier to S3 need
    # (every `riverbed` command reads the environment through this module).
    from riverbed.tiering.stores import S3_SETTINGS

    if name[len(REMOTE_STORAGE_S3) :] not in S3_SETTINGS:
        known = sorted(REMOTE_STORAGE_S3 + setting for setting in S3_SETTINGS)
        raise ConfigError(name, _unknown(variable, name, known))


def _unknown(variable: str, name: str, known: list[str] | None = None) -> str:
    candidates = known if known is not None else sorted(BROKER_CONFIGS)
    close = difflib.get_close_matches(name, candidates, n=1)
    hint = f"; did you mean {_variable(close[0])}?" if close else ""
    skipped = ", ".join(sorted(NOT_SETTINGS))
    return (
        f"environment variable {variable} names no broker setting ({name!r}){hint} "
        f"(RIVERBED_* variables other than {skipped} must be broker settings)"
    )


def _variable(name: str) -> str:
    """The variable that sets `name`: the inverse of setting_name, for suggestions."""
    return PREFIX + name.replace("_", "__").replace("-", "___").replace(".", "_").upper()
