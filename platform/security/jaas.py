"""The one part of a JAAS line Riverbed reads: the username and password of a login module.

Kafka configures SASL credentials as JAAS text, e.g.

    org.apache.kafka.common.security.scram.ScramLoginModule required
        username="broker" password="broker-secret";

Riverbed takes `sasl.jaas.config` in that form so Kafka's configs carry over, and reads the
`username` and `password` options; the module class is not loaded (there is no JVM), so any
module name is accepted. Values are double-quoted, with backslash escaping the next character.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_OPTION: Final = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')
_HEAD: Final = re.compile(r"\s*[\w.$]+\s+(required|requisite|sufficient|optional)\b")


class JaasError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str

    def __repr__(self) -> str:  # never log the password
        return f"Credentials(username={self.username!r})"


def parse_credentials(text: str) -> Credentials:
    """username and password of a JAAS login module line; a JaasError says what is missing."""
    if _HEAD.match(text) is None:
        raise JaasError(
            "sasl.jaas.config must start with a login module and a flag, e.g. "
            "'org.apache.kafka.common.security.scram.ScramLoginModule required ...'"
        )
    options = {name: re.sub(r"\\(.)", r"\1", value) for name, value in _OPTION.findall(text)}
    missing = [name for name in ("username", "password") if not options.get(name)]
    if missing:
        raise JaasError(f'sasl.jaas.config has no {" or ".join(missing)}="..." option')
    return Credentials(options["username"], options["password"])
