"""moto's standalone S3 server as a child process on 127.0.0.1: the real S3 HTTP endpoint of the
tiering tests.

Run as a script (`python moto_server.py PORT`) this file is that server: moto's own WSGI app
under werkzeug's threaded server, as moto's `moto_server` command runs it, with two additions:
- requests that write are serialized. moto checks a conditional write's If-None-Match and then
  stores the object as two steps with no lock between them (moto/s3/responses.py, put_object),
  so two concurrent creators of one key could both win; S3 decides atomically, and the tests
  check our code against S3's behaviour, not moto's race.
- the body bytes of object GETs are counted (`bytes_served()`), so a test can see how much a
  reader in another process (a Spark executor) read.

`MotoServer` starts it and waits until it answers; `stop()` then `start()` again is an outage
(same port, so clients reconnect to the same endpoint); `pause()` / `resume()` (SIGSTOP /
SIGCONT) a hung store: connections are accepted by the kernel and never answered. moto keeps
everything in memory, so a restarted server has the same buckets again (re-created) but empty.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any, Final

import boto3
from botocore.config import Config

from tests.support.ports import free_port

HOST: Final = "127.0.0.1"
REPO_ROOT: Final = Path(__file__).resolve().parents[2]
REGION: Final = "us-east-1"
# moto accepts any credentials; these only have to be present and consistent.
ACCESS_KEY_ID: Final = "riverbed-test"
SECRET_ACCESS_KEY: Final = "riverbed-test-secret"
# moto holds each object in a SpooledTemporaryFile that spills to a file on disk past this
# size (its default: ~5 MB), and reads the file back for the MD5 of its ETag. On the tiering
# benchmark's 7 MB objects that was ~30% of the server's CPU, which shares the machine's cores
# with the broker under test; S3 spends its own machines' CPU. Objects up to this stay in memory.
KEY_BUFFER_BYTES: Final = 64 * 1024 * 1024
READY_TIMEOUT_S: Final = 30.0
STOP_TIMEOUT_S: Final = 10.0
PROBE_INTERVAL_S: Final = 0.05
PROBE_TIMEOUT_S: Final = 0.5
LOG_TAIL_LINES: Final = 30
WRITE_METHODS: Final = frozenset({"PUT", "POST", "DELETE"})
BYTES_SERVED_PATH: Final = "/__riverbed/bytes-served"


class MotoServerError(RuntimeError):
    """The server exited, or did not answer in time."""


class MotoServer:
    def __init__(self, log_path: Path, environment: Mapping[str, str] | None = None) -> None:
        """`environment`: extra variables for the server process, e.g. moto's
        S3_UPLOAD_PART_MIN_SIZE (they override KEY_BUFFER_BYTES's)."""
        self.port = free_port()
        self.log_path = log_path
        self._environment = {
            "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(KEY_BUFFER_BYTES),
            **(environment or {}),
        }
        self._buckets: list[str] = []
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._boto: Any = None  # a boto3 S3 client (untyped), for setup and inspection

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("the moto server was never started")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def settings(self, **overrides: str) -> dict[str, str]:
        """`remote.storage.s3.*` settings that reach this server (for open_store or a broker's
        --set), with `overrides` (keys after the prefix, `_` for `.`)."""
        settings = {
            "endpoint": self.endpoint_url,
            "region": REGION,
            "access.key.id": ACCESS_KEY_ID,
            "secret.access.key": SECRET_ACCESS_KEY,
            "path.style.access": "true",
            **{name.replace("_", "."): value for name, value in overrides.items()},
        }
        return {f"remote.storage.s3.{name}": value for name, value in settings.items()}

    def start(self) -> None:
        """Start (again, on the same port) and create the buckets made so far."""
        if self.running:
            raise RuntimeError(f"moto server on {self.endpoint_url} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            # As a module from the repository's root: it imports its siblings in tests.support.
            [sys.executable, "-m", __name__, str(self.port)],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**_inherited_environment(), **self._environment},
        )
        self._wait_ready()
        self._boto = None  # its pooled connections went with the old process
        for bucket in self._buckets:
            self._client().create_bucket(Bucket=bucket)

    def stop(self) -> None:
        """SIGKILL (an outage, also of a paused server) and reap it. Idempotent."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(STOP_TIMEOUT_S)
        if self._log is not None:
            self._log.close()
            self._log = None

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def create_bucket(self, name: str) -> str:
        self._client().create_bucket(Bucket=name)
        self._buckets.append(name)
        return name

    def multipart_uploads(self, bucket: str) -> list[str]:
        """Keys with a multipart upload started and neither completed nor aborted."""
        listing = self._client().list_multipart_uploads(Bucket=bucket)
        return [upload["Key"] for upload in listing.get("Uploads", [])]

    def start_multipart_upload(self, bucket: str, key: str) -> str:
        """A multipart upload with one part, left unfinished (as by a writer that died)."""
        client = self._client()
        upload_id: str = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"x")
        return upload_id

    def get_object(self, bucket: str, key: str) -> bytes:
        body: bytes = self._client().get_object(Bucket=bucket, Key=key)["Body"].read()
        return body

    def put_object(self, bucket: str, key: str, body: bytes) -> None:
        self._client().put_object(Bucket=bucket, Key=key, Body=body)

    def etag(self, bucket: str, key: str) -> str:
        etag: str = self._client().head_object(Bucket=bucket, Key=key)["ETag"]
        return etag

    def keys(self, bucket: str) -> list[str]:
        pages = self._client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return [entry["Key"] for page in pages for entry in page.get("Contents", [])]

    def bytes_served(self) -> int:
        """Body bytes of every object GET answered so far (ranged or whole, by any client)."""
        url = f"{self.endpoint_url}{BYTES_SERVED_PATH}"
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as answer:
            return int(answer.read())

    def _client(self) -> Any:
        if self._boto is None:
            self._boto = boto3.client(
                "s3",
                endpoint_url=self.endpoint_url,
                region_name=REGION,
                aws_access_key_id=ACCESS_KEY_ID,
                aws_secret_access_key=SECRET_ACCESS_KEY,
                config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
            )
        return self._boto

    def _signal(self, number: signal.Signals) -> None:
        if self._process is None or self._process.poll() is not None:
            raise RuntimeError(f"moto server on {self.endpoint_url} is not running")
        self._process.send_signal(number)

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            exit_code = self._process.poll()
            if exit_code is not None:
                raise MotoServerError(
                    f"moto server exited with code {exit_code} before listening on "
                    f"{self.endpoint_url}\n{self._log_tail()}"
                )
            try:
                with socket.create_connection((HOST, self.port), timeout=PROBE_TIMEOUT_S):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise MotoServerError(
                    f"moto server did not listen on {self.endpoint_url} within "
                    f"{READY_TIMEOUT_S:.0f} s\n{self._log_tail()}"
                )
            time.sleep(PROBE_INTERVAL_S)

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError as error:
            return f"(no log: {error})"
        return "\n".join(lines[-LOG_TAIL_LINES:])


def _inherited_environment() -> dict[str, str]:
    # The test run's AWS settings must not leak into the server (it needs none).
    return {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def serialize_writes(app: WsgiApp) -> WsgiApp:
    lock = threading.Lock()

    def serialized(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] not in WRITE_METHODS:
            return app(environ, start_response)
        # The body is read before the lock is taken: a client frozen halfway through sending one
        # (a SIGSTOPped broker) must hold up only its own request, not every other writer's.
        _buffer_body(environ)
        with lock:
            # moto builds the whole response (and stores the object) inside this call.
            return app(environ, start_response)

    return serialized


def _buffer_body(environ: dict[str, Any]) -> None:
    stream = environ["wsgi.input"]
    if environ.get("wsgi.input_terminated"):  # chunked: werkzeug ends the stream at the end
        body = stream.read()
    else:
        body = stream.read(int(environ.get("CONTENT_LENGTH") or 0))
    environ["wsgi.input"] = io.BytesIO(body)


def count_object_reads(app: WsgiApp) -> WsgiApp:
    """Sum the body bytes of object GETs; answer BYTES_SERVED_PATH with the sum. What tests of
    readers in other processes (Spark's executors) look at to see how much they read."""
    served = 0
    lock = threading.Lock()

    def counted(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        nonlocal served
        if environ["PATH_INFO"] == BYTES_SERVED_PATH:
            start_response("200 OK", [("Content-Type", "text/plain")])
            with lock:
                return [str(served).encode()]
        body = list(app(environ, start_response))
        # An object GET has a key after the bucket: /bucket/key (path-style addressing).
        if environ["REQUEST_METHOD"] == "GET" and environ["PATH_INFO"].count("/") >= 2:
            with lock:
                served += sum(len(chunk) for chunk in body)
        return body

    return counted


def serve(port: int) -> None:
    # Imported only by the server process: the test process needs none of moto's web stack.
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    app = count_object_reads(serialize_writes(DomainDispatcherApplication(create_backend_app)))
    server = make_server(HOST, port, app, threaded=True, request_handler=MotoRequestHandler)
    server.serve_forever()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
