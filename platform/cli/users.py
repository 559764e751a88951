"""`riverbed users ...`: add, delete and list the SCRAM users brokers authenticate, in ZooKeeper.

    riverbed users add NAME --mechanism SCRAM-SHA-512 [--mechanism SCRAM-SHA-256]
        (--password PW | --password - | --password-file FILE) [--iterations N]
        --zookeeper HOST:PORT[/chroot]
    riverbed users delete NAME [--mechanism M] --zookeeper ...
    riverbed users list [--json] --zookeeper ...

Kafka's equivalent is `kafka-configs --alter --entity-type users --add-config
'SCRAM-SHA-512=[iterations=4096,password=...]'`; the znodes written are the same
(riverbed.security.credentials). Only salted keys are stored; `list` shows names, mechanisms and
iteration counts, never salts or keys. `--password -` reads the password from stdin (and
`--password-file` from a file), so it need not appear in `ps`; one trailing newline is dropped.
Every failure is one line on stderr and exit status 1 (riverbed.cli.main prints it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, TypeVar

from riverbed.cli.render import plain_table
from riverbed.coordination.zk import AsyncZooKeeper, digest_from_environment
from riverbed.security.credentials import (
    delete_scram_credentials,
    list_users,
    set_scram_credential,
)
from riverbed.security.scram import (
    ITERATIONS_DEFAULT,
    ITERATIONS_MAX,
    ITERATIONS_MIN,
    ScramMechanism,
    iterations_error,
    new_credential,
    password_error,
    username_error,
)

# How long to wait for ZooKeeper before giving up with a one-line error.
ZOOKEEPER_TIMEOUT_MS_DEFAULT: Final = 10_000
# A password file or stdin larger than this is not a password.
PASSWORD_INPUT_BYTES_MAX: Final = 64 * 1024
STDIN: Final = "-"
_MECHANISMS: Final = ", ".join(m.value for m in ScramMechanism)

T = TypeVar("T")


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add `users` and its actions to the `riverbed` subcommands; each action is the parser's
    `command` default (`command(args) -> exit status`)."""
    users: argparse.ArgumentParser = commands.add_parser(
        "users", help="add, delete and list SASL/SCRAM users (stored in ZooKeeper)"
    )
    actions = users.add_subparsers(required=True, metavar="ACTION")

    add = actions.add_parser("add", help="add a user or replace its credential")
    add.add_argument("name")
    add.add_argument(
        "--mechanism",
        action="append",
        required=True,
        metavar="MECHANISM",
        help=f"{_MECHANISMS}; repeat it to store both",
    )
    source = add.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--password", metavar="PW", help="the password, or '-' to read it from stdin"
    )
    source.add_argument("--password-file", metavar="FILE", help="read the password from FILE")
    add.add_argument(
        "--iterations",
        type=int,
        default=ITERATIONS_DEFAULT,
        help=f"PBKDF2 iterations, {ITERATIONS_MIN}..{ITERATIONS_MAX} (default: %(default)s)",
    )
    add.set_defaults(command=_add)

    delete = actions.add_parser("delete", help="delete a user's credentials")
    delete.add_argument("name")
    delete.add_argument(
        "--mechanism",
        action="append",
        metavar="MECHANISM",
        help=f"only this mechanism's credential ({_MECHANISMS}); default: all",
    )
    delete.set_defaults(command=_delete)

    listing = actions.add_parser("list", help="users with their mechanisms and iterations")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(command=_list)

    for action in (add, delete, listing):
        action.add_argument(
            "--zookeeper", required=True, metavar="HOST:PORT[/CHROOT]", help="zookeeper.connect"
        )
        action.add_argument(
            "--zookeeper-timeout-ms",
            type=int,
            default=ZOOKEEPER_TIMEOUT_MS_DEFAULT,
            metavar="MS",
            help="how long to wait for ZooKeeper",
        )
    return users


def _add(args: argparse.Namespace) -> int:
    _check(username_error(args.name))
    mechanisms = _mechanisms(args.mechanism)
    _check(iterations_error(args.iterations))
    password = _password(args)
    _check(password_error(password))
    credentials = [(m, new_credential(m, password, args.iterations)) for m in mechanisms]

    async def action(zk: AsyncZooKeeper) -> None:
        for mechanism, credential in credentials:
            await set_scram_credential(zk, args.name, mechanism, credential)

    _with_zookeeper(args, action)
    for mechanism in mechanisms:
        print(f"stored the {mechanism.value} credential of user {args.name!r}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    _check(username_error(args.name))
    mechanisms = None if args.mechanism is None else _mechanisms(args.mechanism)
    deleted = _with_zookeeper(args, lambda zk: delete_scram_credentials(zk, args.name, mechanisms))
    for mechanism in deleted:
        print(f"deleted the {mechanism.value} credential of user {args.name!r}")
    return 0


def _list(args: argparse.Namespace) -> int:
    users = _with_zookeeper(args, list_users)
    if args.json:
        listing = [
            {
                "name": user.name,
                "credentials": [
                    {"mechanism": m.value, "iterations": n} for m, n in user.iterations.items()
                ],
            }
            for user in users
        ]
        print(json.dumps(listing, indent=2))
        return 0
    rows = [(user.name, m.value, n) for user in users for m, n in user.iterations.items()]
    print(plain_table(("USER", "MECHANISM", "ITERATIONS"), rows))
    return 0


def _with_zookeeper(
    args: argparse.Namespace, action: Callable[[AsyncZooKeeper], Awaitable[T]]
) -> T:
    # kazoo logs every failed connection attempt; an unreachable ZooKeeper is reported once, as
    # the command's one-line error.
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)

    async def run() -> T:
        zk = AsyncZooKeeper(
            args.zookeeper,
            connect_timeout_ms=args.zookeeper_timeout_ms,
            digest=digest_from_environment(os.environ),
        )
        async with zk:
            return await action(zk)

    return asyncio.run(run())


def _mechanisms(names: list[str]) -> list[ScramMechanism]:
    mechanisms: list[ScramMechanism] = []
    for name in names:
        mechanism = ScramMechanism.from_name(name)  # ValueError names the supported ones
        if mechanism not in mechanisms:
            mechanisms.append(mechanism)
    return mechanisms


def _password(args: argparse.Namespace) -> str:
    if args.password_file is not None:
        with Path(args.password_file).open("rb") as file:
            raw = file.read(PASSWORD_INPUT_BYTES_MAX + 1)
    elif args.password == STDIN:
        raw = sys.stdin.buffer.read(PASSWORD_INPUT_BYTES_MAX + 1)
    else:
        return str(args.password)
    if len(raw) > PASSWORD_INPUT_BYTES_MAX:
        raise ValueError(f"the password input is longer than {PASSWORD_INPUT_BYTES_MAX} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the password input is not UTF-8 text") from None
    return text.removesuffix("\n").removesuffix("\r")


def _check(problem: str | None) -> None:
    if problem is not None:
        raise ValueError(problem)
