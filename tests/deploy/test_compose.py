"""The Dockerfile, docker-compose.yml, .dockerignore and deploy/prometheus.yml, checked without a
Docker engine: what the files say must fit together and fit Riverbed (its CLI, its broker
settings, its object store settings). The HEALTHCHECK command is run for real against a broker.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from riverbed.cli import main as cli
from riverbed.cli.env_config import setting_name
from riverbed.configs import BrokerConfig
from riverbed.tiering.stores import open_store

from tests.support.broker import BrokerProcess

REPO = Path(__file__).resolve().parents[2]
BROKERS = ("broker-1", "broker-2", "broker-3")
METRICS_PORT = 9308
# Services that run once and exit: no healthcheck, no restart.
ONE_SHOT_RESTART = "no"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


@cache
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return loaded


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose()["services"]
    return found


@cache
def dockerfile() -> tuple[dict[str, str], list[Stage]]:
    """The Dockerfile's global ARG defaults and its stages, instructions in order."""
    text = re.sub(r"\\\n\s*", " ", (REPO / "Dockerfile").read_text())
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif not stages:
            assert instruction == "ARG", f"only ARG may come before the first FROM: {line}"
            key, _, default = rest.partition("=")
            args[key] = default
        else:
            stages[-1].instructions.append((instruction, rest.strip()))
    return args, stages


def stage_chain(target: str | None = None) -> list[Stage]:
    """The stage `target` (default: the last one, what a plain `docker build` makes) and the
    stages it is built FROM, base first."""
    _, stages = dockerfile()
    by_name = {stage.name: stage for stage in stages if stage.name}
    stage = by_name[target] if target else stages[-1]
    chain = [stage]
    while chain[0].base in by_name:
        chain.insert(0, by_name[chain[0].base])
    return chain


def instructions(target: str | None = None, kind: str | None = None) -> list[str]:
    return [
        rest
        for stage in stage_chain(target)
        for instruction, rest in stage.instructions
        if kind is None or instruction == kind
    ]


def image_env(target: str | None = None) -> dict[str, str]:
    env: dict[str, str] = {}
    for rest in instructions(target, "ENV"):
        for pair in shlex.split(rest):
            key, _, value = pair.partition("=")
            env[key] = value
    return env


def exposed_ports(target: str | None = None) -> set[int]:
    return {
        int(port.split("/")[0]) for rest in instructions(target, "EXPOSE") for port in rest.split()
    }


def healthcheck_command(target: str | None = None) -> str:
    """The shell command of the stage's HEALTHCHECK (shell form, run by /bin/sh -c)."""
    (rest,) = instructions(target, "HEALTHCHECK")
    options, _, command = rest.partition("CMD ")
    assert all(option.startswith("--") for option in options.split()), rest
    return command


def service_target(service: Mapping[str, Any]) -> str | None:
    build = service.get("build")
    if build is None:
        return None
    assert build["context"] == ".", "the only Dockerfile is at the repo root"
    target: str | None = build.get("target")
    return target


def has_healthcheck(name: str) -> bool:
    service = services()[name]
    if "healthcheck" in service:
        return not service["healthcheck"].get("disable", False)
    return "build" in service and bool(instructions(service_target(service), "HEALTHCHECK"))


def broker_environment(name: str) -> dict[str, str]:
    """What the broker process sees: the image's ENV under the service's environment."""
    environment = services()[name]["environment"]
    assert isinstance(environment, dict), "environment as a mapping, so it can be checked"
    for key, value in environment.items():
        # Compose refuses unquoted YAML booleans; numbers would pass but keep the form uniform.
        assert isinstance(value, str), f"{name}: {key} must be a quoted string, got {value!r}"
    return {**image_env(service_target(services()[name])), **environment}


def broker_config(name: str) -> BrokerConfig:
    args = cli._parser().parse_args(list(broker_entrypoint()[1:]))
    return cli.broker_config_from_args(args, broker_environment(name))


def broker_entrypoint() -> list[str]:
    (rest,) = instructions(None, "ENTRYPOINT")[-1:]
    entrypoint: list[str] = json.loads(rest)  # exec form: no shell between Docker and riverbed
    return entrypoint


def listener_port(listener: str) -> int:
    return int(listener.rsplit(":", 1)[1])


@dataclass(frozen=True)
class Published:
    host_ip: str
    host_port: int
    container_port: int


def published_ports(service: Mapping[str, Any]) -> Iterator[Published]:
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            yield Published(
                entry.get("host_ip", "0.0.0.0"), int(entry["published"]), int(entry["target"])
            )
            continue
        parts = str(entry).split("/")[0].split(":")
        assert len(parts) in (2, 3), f"give host and container ports explicitly: {entry!r}"
        host_ip = parts[0] if len(parts) == 3 else "0.0.0.0"
        yield Published(host_ip, int(parts[-2]), int(parts[-1]))


def listening_ports(name: str) -> set[int]:
    """Ports a service listens on inside the compose network: its `expose` entries, plus its
    published container ports."""
    service = services()[name]
    ports = {int(str(port).split("/")[0]) for port in service.get("expose", [])}
    return ports | {published.container_port for published in published_ports(service)}


def named_volumes(service: Mapping[str, Any]) -> list[str]:
    names = []
    for entry in service.get("volumes", []):
        source = entry["source"] if isinstance(entry, dict) else str(entry).split(":")[0]
        if not source.startswith((".", "/", "~")):  # a bind mount is a path
            names.append(source)
    return names


def depends_on(service: Mapping[str, Any]) -> dict[str, str]:
    """Each dependency and its condition (the short list form means service_started)."""
    dependencies = service.get("depends_on", {})
    if isinstance(dependencies, list):
        return dict.fromkeys(dependencies, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in dependencies.items()}


def is_one_shot(name: str) -> bool:
    return services()[name].get("restart") == ONE_SHOT_RESTART


def test_compose_defines_the_cluster_and_its_profiles() -> None:
    assert set(services()) == {
        "zookeeper", "minio", "minio-init", *BROKERS, "spark", "prometheus"
    }  # fmt: skip
    assert services()["zookeeper"]["image"] == "zookeeper:3.9"
    assert services()["minio"]["image"].split(":")[0] == "minio/minio"
    assert services()["minio-init"]["image"].split(":")[0] == "minio/mc"
    assert services()["prometheus"]["image"].split(":")[0] == "prom/prometheus"
    for name in BROKERS:
        assert service_target(services()[name]) == "broker"
        assert "entrypoint" not in services()[name], "brokers run the image's ENTRYPOINT"
    profiled = {name: s["profiles"] for name, s in services().items() if "profiles" in s}
    assert profiled == {"spark": ["spark"], "prometheus": ["prometheus"]}


def test_every_broker_environment_builds_a_broker_config() -> None:
    for name in BROKERS:
        names = {setting_name(v) for v in broker_environment(name) if v.startswith("RIVERBED_")}
        config = broker_config(name)  # raises naming any variable that is no broker setting
        s3 = {n for n in names if n.startswith("remote.storage.s3.")}
        assert config.explicit == names - s3
        assert set(config.remote_storage_s3) == s3
        assert config.default_replication_factor == 3
        assert config.min_insync_replicas == 2
        assert config.offsets_topic_replication_factor == 3
        assert config.log_dir == "/var/lib/riverbed/data"


def test_broker_ids_are_distinct() -> None:
    ids = [broker_config(name).broker_id for name in BROKERS]
    assert len(set(ids)) == len(BROKERS), ids


def test_brokers_reach_zookeeper_by_service_name_and_port() -> None:
    for name in BROKERS:
        connect = broker_config(name).zookeeper_connect
        for server in connect.split("/")[0].split(","):
            host, _, port = server.partition(":")
            assert host in services(), f"{name}: zookeeper.connect names no service: {host}"
            assert int(port) in listening_ports(host), f"{name}: {host} does not listen on {port}"
            assert depends_on(services()[name]).get(host) == "service_healthy"


def test_brokers_tier_to_the_minio_bucket_that_minio_init_creates() -> None:
    minio = services()["minio"]
    command = minio["command"]
    api_port = int(command[command.index("--address") + 1].rsplit(":", 1)[1])
    assert api_port in listening_ports("minio")
    creates = services()["minio-init"]["command"]
    assert creates[0] == "mb"
    alias, _, bucket = creates[-1].partition("/")
    mc_host = urlsplit(services()["minio-init"]["environment"][f"MC_HOST_{alias}"])
    assert (mc_host.hostname, mc_host.port) == ("minio", api_port)
    credentials = (
        minio["environment"]["MINIO_ROOT_USER"],
        minio["environment"]["MINIO_ROOT_PASSWORD"],
    )
    assert (mc_host.username, mc_host.password) == credentials
    for name in BROKERS:
        config = broker_config(name)
        assert config.remote_storage_url is not None
        url = urlsplit(config.remote_storage_url)
        assert (url.scheme, url.netloc) == ("s3", bucket), f"{name} tiers to another bucket"
        s3 = {
            key.removeprefix("remote.storage.s3."): v for key, v in config.remote_storage_s3.items()
        }
        endpoint = urlsplit(s3["endpoint"])
        assert (endpoint.hostname, endpoint.port) == ("minio", api_port), "MinIO's S3 API"
        assert (s3["access.key.id"], s3["secret.access.key"]) == credentials
        assert s3["path.style.access"] == "true", "MinIO needs path-style addressing"
        # The store the broker will open: every remote.storage.s3.* setting known and valid.
        open_store(config.remote_storage_url, config.remote_storage_s3, environ={})
        assert depends_on(services()[name]).get("minio-init") == "service_completed_successfully"


def test_each_broker_listens_and_advertises_one_port_inside_and_outside() -> None:
    # One listener serves clients on the host and replication between brokers alike, so the
    # advertised address must work in both places: the service name (resolved on the host via
    # /etc/hosts, see docs/deploy.md) and a port that is the same inside and outside.
    for name in BROKERS:
        config = broker_config(name)
        (listener,) = config.listeners
        (advertised,) = config.advertised
        assert listener == f"PLAINTEXT://0.0.0.0:{listener_port(listener)}"
        assert advertised == f"PLAINTEXT://{name}:{listener_port(listener)}"
        (published,) = published_ports(services()[name])
        assert published.host_port == published.container_port == listener_port(listener)
        assert published.host_ip == "127.0.0.1"
    spark = services()["spark"]
    bootstrap = spark["entrypoint"][spark["entrypoint"].index("--bootstrap-servers") + 1]
    assert set(bootstrap.split(",")) == {
        config.advertised[0].removeprefix("PLAINTEXT://") for config in map(broker_config, BROKERS)
    }


def test_depends_on_targets_exist_and_their_conditions_can_be_met() -> None:
    for name, service in services().items():
        for target, condition in depends_on(service).items():
            assert target in services(), f"{name} depends on a missing service {target}"
            if condition == "service_healthy":
                assert has_healthcheck(target), f"{name} waits for {target}, which has no check"
            elif condition == "service_completed_successfully":
                assert is_one_shot(target), f"{name} waits for {target} to exit, it never does"
            else:
                assert condition == "service_started", condition
            # A service always started cannot wait for one only a profile starts.
            if "profiles" not in service:
                assert "profiles" not in services()[target], f"{name} -> {target}"


def test_host_ports_do_not_collide() -> None:
    ports = Counter(
        published.host_port
        for service in services().values()
        for published in published_ports(service)
    )
    assert ports, ports
    assert all(count == 1 for count in ports.values()), ports


def test_named_volumes_are_declared_and_no_broker_shares_one() -> None:
    declared = set(compose()["volumes"])
    used = [volume for service in services().values() for volume in named_volumes(service)]
    assert set(used) <= declared, set(used) - declared
    assert set(used) == declared, f"declared but unused: {declared - set(used)}"
    broker_volumes = [volume for name in BROKERS for volume in named_volumes(services()[name])]
    assert len(broker_volumes) == len(set(broker_volumes)) == len(BROKERS)
    for name in BROKERS:
        targets = [entry.split(":")[1] for entry in services()[name]["volumes"]]
        assert targets == [broker_config(name).log_dir], "the volume holds log.dirs"
    assert "VOLUME /var/lib/riverbed/data" in [f"VOLUME {v}" for v in instructions(None, "VOLUME")]


def test_every_service_but_the_one_shots_has_a_healthcheck_and_a_restart_policy() -> None:
    one_shots = {name for name in services() if is_one_shot(name)}
    assert one_shots == {"minio-init", "spark"}
    for name, service in services().items():
        if name not in one_shots:
            assert has_healthcheck(name), f"{name} has no healthcheck"
            assert service.get("restart") in ("unless-stopped", "always", "on-failure"), name
        test = service.get("healthcheck", {}).get("test")
        if test is not None:
            assert test[0] in ("CMD", "CMD-SHELL"), f"{name}: healthcheck test form {test[0]}"


def test_dockerfile_entrypoint_is_the_broker_subcommand() -> None:
    entrypoint = broker_entrypoint()
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint[0] in scripts, "the console script the wheel installs"
    assert scripts[entrypoint[0]] == "riverbed.cli.main:main"
    args = cli._parser().parse_args(entrypoint[1:])
    assert args.command is cli._run_broker


def test_spark_image_runs_the_key_counts_job() -> None:
    (rest,) = instructions("spark", "ENTRYPOINT")
    entrypoint = json.loads(rest)
    assert entrypoint == services()["spark"]["entrypoint"][: len(entrypoint)]
    module = entrypoint[entrypoint.index("-m") + 1]
    assert (REPO / "spark" / Path(*module.split("."))).with_suffix(".py").is_file()
    assert any("openjdk-17-jre-headless" in run for run in instructions("spark", "RUN"))


def test_exposed_ports_are_the_default_listener_and_metrics() -> None:
    default_listener = image_env()["RIVERBED_LISTENERS"]
    assert exposed_ports() == {listener_port(default_listener), METRICS_PORT}
    # The compose brokers override the listener (one port inside and outside, see above) and
    # keep the metrics port the image exposes, which Prometheus scrapes.
    for name in BROKERS:
        assert listener_port(broker_config(name).listeners[0]) not in exposed_ports()


def test_images_run_as_a_non_root_user() -> None:
    for target in (None, "spark"):
        users = instructions(target, "USER")
        assert users, f"stage {target or 'final'} runs as root"
        assert users[-1].split(":")[0] not in ("root", "0")
        assert any(
            "useradd" in run and users[-1] in run.split() for run in instructions(target, "RUN")
        )


def test_dockerfile_builds_a_wheel_and_installs_only_that() -> None:
    args, stages = dockerfile()
    assert args["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"
    assert all(stage.base in ("${PYTHON_IMAGE}", "runtime") for stage in stages)
    (build,) = [run for run in instructions("builder", "RUN") if "pip wheel" in run]
    assert build.endswith(" .")
    assert any("gcc" in run for run in instructions("builder", "RUN"))
    for target in (None, "spark"):
        installs = [run for run in instructions(target, "RUN") if "pip install" in run]
        assert len(installs) == 1
        assert "--no-index" in installs[0]
        assert "from=builder" in installs[0]
        assert not any("gcc" in run for run in instructions(target, "RUN"))
    assert "builder" not in [stage.name for stage in stage_chain()]


def dockerignore_excludes(path: str) -> bool:
    """Docker's rule: the last pattern matching the path, or a folder above it, decides."""
    excluded = False
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        regex = re.escape(pattern.lstrip("!").strip("/"))
        regex = regex.replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        parts = path.split("/")
        if any(re.fullmatch(regex, "/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            excluded = not negated
    return excluded


def test_dockerignore_sends_the_sources_the_build_copies_and_nothing_else() -> None:
    copied = [
        source
        for rest in instructions("builder", "COPY")
        for source in rest.split()[:-1]
        if not source.startswith("--")
    ]
    assert copied
    for source in copied:
        files = [str(p.relative_to(REPO)) for p in (REPO / source).rglob("*.py")] or [source]
        assert not any(dockerignore_excludes(f) for f in files), source
    for path in (
        ".git/HEAD",
        ".venv/bin/python",
        ".stamps/installed",
        "build/lib/x.py",
        "tests/conftest.py",
        "bench/results/x.json",
        ".riverbed/broker-1.log",
        "platform/__pycache__/cli.cpython-311.pyc",
        "platform/protocol/records_fast.c",
        "platform/tiering/records_columns.cpython-311-x86_64-linux-gnu.so",
    ):
        assert dockerignore_excludes(path), path
    assert not dockerignore_excludes("platform/protocol/records_fast.pyx")


def test_prometheus_scrapes_the_metrics_port_of_every_broker() -> None:
    prometheus = services()["prometheus"]
    mounts = {entry.split(":")[1]: entry.split(":")[0] for entry in prometheus["volumes"]}
    config = yaml.safe_load((REPO / mounts["/etc/prometheus/prometheus.yml"]).read_text())
    targets = {
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    assert targets == {f"{name}:{METRICS_PORT}" for name in BROKERS}
    assert METRICS_PORT in exposed_ports()
    # ... and every broker serves its metrics there.
    assert {broker_config(name).metrics_port for name in BROKERS} == {METRICS_PORT}


def run_healthcheck(listeners: str) -> subprocess.CompletedProcess[str]:
    # The image's `python` is the interpreter with Riverbed; here, this test run's.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["/bin/sh", "-c", healthcheck_command()],
        env={"PATH": path, "RIVERBED_LISTENERS": listeners},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_healthcheck_passes_on_a_serving_broker_and_fails_without_one(
    broker: BrokerProcess,
) -> None:
    # 0.0.0.0 (what the image and compose bind) is probed on 127.0.0.1.
    for listeners in (f"PLAINTEXT://{broker.bootstrap}", f"PLAINTEXT://0.0.0.0:{broker.port}"):
        result = run_healthcheck(listeners)
        assert result.returncode == 0, result.stderr
    broker.kill()
    result = run_healthcheck(f"PLAINTEXT://0.0.0.0:{broker.port}")
    assert result.returncode != 0
    assert "ConnectionRefusedError" in result.stderr
