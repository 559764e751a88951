"""`riverbed users` run as a user runs it (a subprocess) against the real ZooKeeper: what lands in
the znodes is salted keys only, and every failure is one line on stderr."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from riverbed.coordination import layout
from riverbed.coordination.zk import AsyncZooKeeper
from riverbed.security.credentials import read_scram_credentials
from riverbed.security.scram import ScramCredential, ScramMechanism, password_matches

from tests.support.ports import free_port

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
CLI_TIMEOUT_S = 60
PASSWORD = "correct horse battery staple"


async def riverbed(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "riverbed.cli", "users", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )


async def zk_dump(zk_connect: str) -> dict[str, bytes]:
    """Every znode under /config/users with its data."""
    async with AsyncZooKeeper(zk_connect) as zk:
        if await zk.exists(layout.CONFIG_USERS_PATH) is None:
            return {}
        dump = {}
        for child in await zk.get_children(layout.CONFIG_USERS_PATH):
            path = f"{layout.CONFIG_USERS_PATH}/{child}"
            dump[path] = (await zk.get(path))[0]
        return dump


async def credentials_of(zk_connect: str, user: str) -> dict[ScramMechanism, ScramCredential]:
    async with AsyncZooKeeper(zk_connect) as zk:
        return dict(await read_scram_credentials(zk, user))


def one_line_error(done: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert done.returncode == 1, done
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("riverbed: error: "), lines[0]
    assert fragment in lines[0], lines[0]
    assert done.stdout == ""


async def test_add_stores_salted_keys_only(zk_connect: str) -> None:
    done = await riverbed(
        "add", "alice@example.com", "--mechanism", "SCRAM-SHA-512", "--password", PASSWORD,
        "--zookeeper", zk_connect,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "stored the SCRAM-SHA-512 credential of user 'alice@example.com'\n"
    dump = await zk_dump(zk_connect)
    assert list(dump) == ["/config/users/alice%40example.com"]
    data = dump["/config/users/alice%40example.com"]
    config = json.loads(data)
    assert config["version"] == 1
    assert list(config["config"]) == ["SCRAM-SHA-512"]
    assert config["config"]["SCRAM-SHA-512"].startswith("salt=")
    assert PASSWORD.encode() not in data
    assert b"horse" not in data
    # A salted hash of exactly that password.
    credentials = await credentials_of(zk_connect, "alice@example.com")
    credential = credentials[SHA512]
    assert password_matches(SHA512, credential, PASSWORD)
    assert not password_matches(SHA512, credential, PASSWORD + "!")
    assert PASSWORD not in done.stdout + done.stderr


async def test_password_from_stdin_or_a_file_for_both_mechanisms(
    zk_connect: str, tmp_path: Path
) -> None:
    done = await riverbed(
        "add", "bob", "--mechanism", "SCRAM-SHA-256", "--mechanism", "SCRAM-SHA-512",
        "--password", "-", "--iterations", "8192", "--zookeeper", zk_connect,
        stdin=PASSWORD + "\n",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    credentials = await credentials_of(zk_connect, "bob")
    assert set(credentials) == {SHA256, SHA512}
    for mechanism, credential in credentials.items():
        assert password_matches(mechanism, credential, PASSWORD)
        assert credential.iterations == 8192

    secret_file = tmp_path / "secret"
    secret_file.write_text("from-a-file\r\n")
    done = await riverbed(
        "add", "bob", "--mechanism", "SCRAM-SHA-256", "--password-file", str(secret_file),
        "--zookeeper", zk_connect,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    credentials = await credentials_of(zk_connect, "bob")
    assert password_matches(SHA256, credentials[SHA256], "from-a-file")
    assert password_matches(SHA512, credentials[SHA512], PASSWORD)


async def test_list_shows_names_mechanisms_and_iterations_only(zk_connect: str) -> None:
    for name, mechanism, iterations in [
        ("zed", "SCRAM-SHA-256", "4096"),
        ("amy", "SCRAM-SHA-512", "16384"),
        ("amy", "SCRAM-SHA-256", "5000"),
    ]:
        done = await riverbed(
            "add", name, "--mechanism", mechanism, "--password", PASSWORD,
            "--iterations", iterations, "--zookeeper", zk_connect,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    listed = await riverbed("list", "--zookeeper", zk_connect)
    assert listed.returncode == 0, listed.stderr
    assert [line.split() for line in listed.stdout.splitlines()] == [
        ["USER", "MECHANISM", "ITERATIONS"],
        ["amy", "SCRAM-SHA-256", "5000"],
        ["amy", "SCRAM-SHA-512", "16384"],
        ["zed", "SCRAM-SHA-256", "4096"],
    ]
    as_json = await riverbed("list", "--json", "--zookeeper", zk_connect)
    assert json.loads(as_json.stdout) == [
        {
            "name": "amy",
            "credentials": [
                {"mechanism": "SCRAM-SHA-256", "iterations": 5000},
                {"mechanism": "SCRAM-SHA-512", "iterations": 16384},
            ],
        },
        {"name": "zed", "credentials": [{"mechanism": "SCRAM-SHA-256", "iterations": 4096}]},
    ]
    stored = b"".join((await zk_dump(zk_connect)).values()).decode()
    for secret_part in ("salt=", "stored_key=", "server_key="):
        assert secret_part in stored
        assert secret_part not in listed.stdout + as_json.stdout
    for value in stored.replace('"', ",").split(","):  # no salt or key value is printed either
        if value.startswith(("salt=", "stored_key=", "server_key=")):
            assert value.split("=", 1)[1] not in listed.stdout + as_json.stdout


async def test_delete_one_mechanism_then_the_user(zk_connect: str) -> None:
    done = await riverbed(
        "add", "carol", "--mechanism", "SCRAM-SHA-256", "--mechanism", "SCRAM-SHA-512",
        "--password", PASSWORD, "--zookeeper", zk_connect,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    done = await riverbed(
        "delete", "carol", "--mechanism", "SCRAM-SHA-256", "--zookeeper", zk_connect
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "deleted the SCRAM-SHA-256 credential of user 'carol'\n"
    assert set(await credentials_of(zk_connect, "carol")) == {SHA512}
    done = await riverbed("delete", "carol", "--zookeeper", zk_connect)
    assert done.stdout == "deleted the SCRAM-SHA-512 credential of user 'carol'\n"
    assert await zk_dump(zk_connect) == {}
    one_line_error(
        await riverbed("delete", "carol", "--zookeeper", zk_connect),
        "user 'carol' has no SCRAM-SHA-256/SCRAM-SHA-512 credential",
    )


@pytest.mark.parametrize(
    ("args", "stdin", "fragment"),
    [
        (["add", "u", "--mechanism", "SCRAM-SHA-1", "--password", "pw"], None, "SCRAM-SHA-1"),
        (["add", "u", "--mechanism", "PLAIN", "--password", "pw"], None, "unknown SCRAM"),
        (
            [
                "add",
                "u",
                "--mechanism",
                "SCRAM-SHA-256",
                "--password",
                "pw",
                "--iterations",
                "4095",
            ],
            None,
            "iterations must be in [4096, 16384], got 4095",
        ),
        (
            [
                "add",
                "u",
                "--mechanism",
                "SCRAM-SHA-256",
                "--password",
                "pw",
                "--iterations",
                "16385",
            ],
            None,
            "got 16385",
        ),
        (
            ["add", "u", "--mechanism", "SCRAM-SHA-256", "--password", "-"],
            "\n",
            "password is empty",
        ),
        (
            ["add", "u", "--mechanism", "SCRAM-SHA-256", "--password-file", "/nonexistent"],
            None,
            "/nonexistent",
        ),
        (["add", "", "--mechanism", "SCRAM-SHA-256", "--password", "pw"], None, "name is empty"),
        (["delete", "nobody"], None, "user 'nobody' has no"),
        (["delete", "u", "--mechanism", "MD5"], None, "unknown SCRAM mechanism 'MD5'"),
    ],
)
async def test_errors_are_one_line_and_write_nothing(
    zk_connect: str, args: list[str], stdin: str | None, fragment: str
) -> None:
    one_line_error(await riverbed(*args, "--zookeeper", zk_connect, stdin=stdin), fragment)
    assert await zk_dump(zk_connect) == {}


@pytest.mark.processes
@pytest.mark.parametrize("chroot", ["", "/riverbed"])
async def test_unreachable_zookeeper_is_one_line(chroot: str) -> None:
    nobody = f"127.0.0.1:{free_port()}{chroot}"
    for args in (
        ["list"],
        ["delete", "u"],
        ["add", "u", "--mechanism", "SCRAM-SHA-256", "--password", "pw"],
    ):
        done = await riverbed(*args, "--zookeeper", nobody, "--zookeeper-timeout-ms", "500")
        one_line_error(done, "could not connect to ZooKeeper at 127.0.0.1:")
