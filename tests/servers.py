"""Real loopback test servers, shared by every test folder.

    from servers import MotoServer, GcsEmulator, free_port

* :class:`MotoServer` runs ``moto_server`` (S3 + IAM) on a free loopback port.
* :class:`GcsEmulator` runs gcp-storage-emulator through this very file
  (``python servers.py gcs-emulator PORT``), which first patches the
  emulator's label handling in-process (it replaces the label map on PATCH
  instead of merging, keeps ``None`` for removed labels, and drops labels
  given at bucket creation).  The workaround lives here, never in lnk.

Both are started as subprocesses, polled until they answer (bounded
deadline, no fixed sleeps) and stopped by their own PID.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

READY_DEADLINE = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _poll(url: str, method: str, proc: subprocess.Popen[bytes], name: str) -> None:
    deadline = time.monotonic() + READY_DEADLINE
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before it was ready")
        try:
            req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
            with urllib.request.urlopen(req, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError as e:
            last = e
        time.sleep(0.05)  # poll interval, not a wait for a result
    raise RuntimeError(f"{name} did not answer at {url} within {READY_DEADLINE}s: {last}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class MotoServer:
    """``moto_server`` on 127.0.0.1 with S3 and IAM; path-style addressing."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            ["moto_server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _poll(f"{self.endpoint}/moto-api/reset", "POST", self.proc, "moto_server")
        except BaseException:
            _stop(self.proc)
            raise

    def env(
        self, monkeypatch: pytest.MonkeyPatch, key: str = "testing", secret: str = "testing"
    ) -> None:
        monkeypatch.setenv("AWS_ENDPOINT_URL", self.endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            monkeypatch.delenv(name, raising=False)

    def client(self, service: str = "s3", key: str = "testing", secret: str = "testing") -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}),
        )

    def set_auth(self, enforce: bool) -> None:
        req = urllib.request.Request(
            f"{self.endpoint}/moto-api/reset-auth",
            data=b"0" if enforce else b"inf",
            method="POST",
            headers={"Content-Type": "application/json"},  # else the body is eaten as a form
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200

    def stop(self) -> None:
        _stop(self.proc)


class GcsEmulator:
    """gcp-storage-emulator (patched labels) on 127.0.0.1, in memory."""

    def __init__(self) -> None:
        self.port = free_port()
        self.host = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "gcs-emulator", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _poll(f"{self.host}/storage/v1/b", "GET", self.proc, "gcp-storage-emulator")
        except BaseException:
            _stop(self.proc)
            raise

    def env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", self.host)
        monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "test")

    def client(self) -> Any:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        old = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = self.host
        try:
            return storage.Client(project="test", credentials=AnonymousCredentials())
        finally:
            if old is None:
                del os.environ["STORAGE_EMULATOR_HOST"]
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = old

    def stop(self) -> None:
        _stop(self.proc)


class RadosGateway:
    """Ceph radosgw on a one-node cluster (one mon, one memstore OSD, cephx
    off), all under ``workdir`` and on free loopback ports.  About 12 s to
    start: use it session-scoped.  Needs the Debian packages radosgw,
    ceph-mon and ceph-osd."""

    ACCESS_KEY = "LNKRGWADMINKEY000000"
    SECRET_KEY = "lnk-rgw-admin-secret"

    def __init__(self, workdir: str) -> None:
        import uuid

        self.dir = workdir
        self.mon_port = free_port()
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.conf = os.path.join(workdir, "ceph.conf")
        fsid = str(uuid.uuid4())
        for sub in ("run", "log", "mon/ceph-a", "osd/ceph-0"):
            os.makedirs(os.path.join(workdir, sub), exist_ok=True)
        d = workdir
        with open(self.conf, "w") as f:
            f.write(f"""[global]
fsid = {fsid}
mon_host = v1:127.0.0.1:{self.mon_port}
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
mon_warn_on_pool_no_redundancy = false
run_dir = {d}/run
admin_socket = {d}/run/$cluster-$name.asok
pid_file = {d}/run/$name.pid
log_file = {d}/log/$name.log
[mon]
mon_data = {d}/mon/$cluster-$id
[osd]
osd_data = {d}/osd/$cluster-$id
osd_objectstore = memstore
[client.rgw]
rgw_frontends = beast endpoint=127.0.0.1:{self.port}
""")
        c = ["-c", self.conf]
        try:
            monmap = os.path.join(d, "monmap")
            _run(
                [
                    "monmaptool",
                    "--create",
                    "--add",
                    "a",
                    f"v1:127.0.0.1:{self.mon_port}",
                    "--fsid",
                    fsid,
                    monmap,
                ]
            )
            _run(["ceph-mon", *c, "--mkfs", "-i", "a", "--monmap", monmap])
            _run(["ceph-mon", *c, "-i", "a"])
            osd_uuid = str(uuid.uuid4())
            # a mon that has just started may refuse commands for a moment ('EPERM:
            # problem getting command descriptions'); creating an OSD by its uuid is
            # idempotent, so retry within a bounded deadline
            deadline = time.monotonic() + 30
            while True:
                try:
                    _run(["ceph", *c, "osd", "create", osd_uuid])
                    break
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            _run(["ceph-osd", *c, "-i", "0", "--mkfs", "--osd-uuid", osd_uuid])
            # the mon may not have committed the new OSD's uuid yet ('wrong fsid'):
            # retry within a bounded deadline
            deadline = time.monotonic() + 30
            while True:
                try:
                    _run(["ceph-osd", *c, "-i", "0"])
                    break
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            _run(["radosgw", *c, "-n", "client.rgw"])
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(self.endpoint, timeout=2):
                        break
                except urllib.error.HTTPError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("radosgw did not answer within 60 s") from None
                    time.sleep(0.1)
            _run(
                [
                    "radosgw-admin",
                    *c,
                    "user",
                    "create",
                    "--uid=admin",
                    "--display-name=admin",
                    f"--access-key={self.ACCESS_KEY}",
                    f"--secret-key={self.SECRET_KEY}",
                ]
            )
            _run(
                [
                    "radosgw-admin",
                    *c,
                    "caps",
                    "add",
                    "--uid=admin",
                    "--caps=users=*;buckets=*;user-policy=*",
                ]
            )
        except BaseException:
            self.stop()
            raise

    def env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("AWS_ENDPOINT_URL", self.endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", self.ACCESS_KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", self.SECRET_KEY)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            monkeypatch.delenv(name, raising=False)

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.ACCESS_KEY,
            aws_secret_access_key=self.SECRET_KEY,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}),
        )

    def stop(self) -> None:
        """Stop rgw, then the OSD, then the mon, each by its PID file."""
        for name in ("client.rgw", "osd.0", "mon.a"):
            pidfile = os.path.join(self.dir, "run", f"{name}.pid")
            try:
                with open(pidfile) as f:
                    pid = int(f.read().strip())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)


def _run(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({res.returncode}): {res.stderr.decode()[-2000:]}")


def _serve_gcs_emulator(port: int) -> None:
    """Patch the emulator's label bugs, then serve until terminated."""
    import signal

    from gcp_storage_emulator.handlers import buckets

    original_patch = buckets._patch_bucket

    def patch_bucket(bucket: dict[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
        if metadata and isinstance(metadata.get("labels"), dict):
            merged = dict(bucket.get("labels") or {})
            merged.update(metadata["labels"])
            metadata = dict(metadata)
            metadata["labels"] = {k: v for k, v in merged.items() if v is not None}
        return dict(original_patch(bucket, metadata))

    buckets._patch_bucket = patch_bucket
    original_create = buckets.create_bucket
    pending: dict[str, Any] = {}

    def insert(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        pending["labels"] = (request.data or {}).get("labels")
        return original_insert(request, response, storage, *args, **kwargs)

    def create_bucket(name: str, storage: Any) -> Any:
        bucket = original_create(name, storage)
        labels = pending.pop("labels", None)
        if bucket and labels:
            bucket["labels"] = {k: v for k, v in labels.items() if v is not None}
            storage.create_bucket(name, bucket)
        return bucket

    original_insert = buckets.insert
    buckets.create_bucket = create_bucket
    buckets.insert = insert  # the routes are built from these module attributes

    from gcp_storage_emulator.server import create_server  # after the patches

    server = create_server("127.0.0.1", port, in_memory=True)
    stop = {"now": False}

    def on_term(signum: int, frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_term)
    server.start()
    try:
        while not stop["now"]:
            time.sleep(0.1)
    finally:
        server.stop()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "gcs-emulator":
        _serve_gcs_emulator(int(sys.argv[2]))
    else:
        sys.exit("usage: servers.py gcs-emulator PORT")


class ModelServer:
    """An OpenAI-compatible chat completions server over plain HTTP on loopback, logging
    every request's path and Authorization: answers ``<tag> heard <last message>``."""

    def __init__(self, tag: str = "model", host: str = "127.0.0.1") -> None:
        """``host``: the address it listens on (an SSH test host's bridge, say)."""
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.tag = tag
        self.requests: list[dict[str, Any]] = []
        self.gate: threading.Event | None = None  # set: completions wait for it (a slow model)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, code: int, doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                outer.requests.append(
                    {"path": self.path, "auth": self.headers.get("Authorization")}
                )
                self._send(200, {"data": [{"id": "m"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(
                    {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
                )
                if outer.gate is not None:
                    outer.gate.wait(120)
                if not isinstance(body.get("messages"), list):  # Hermes probes /api/show
                    self._send(404, {"error": "not a chat completion"})
                    return
                last = body["messages"][-1]["content"]
                msg = {"role": "assistant", "content": f"{outer.tag} heard {last}"}
                if body.get("stream"):  # Hermes streams: the same answer as server-sent events
                    self._stream(msg["content"])
                    return
                self._send(200, {"choices": [{"index": 0, "message": msg}]})

            def _stream(self, text: str) -> None:
                chunks = [
                    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]},
                    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                ]
                data = (
                    b"".join(
                        b"data: "
                        + json.dumps(
                            {"id": "c", "object": "chat.completion.chunk", "model": "m", **c}
                        ).encode()
                        + b"\n\n"
                        for c in chunks
                    )
                    + b"data: [DONE]\n\n"
                )
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.port = int(self.server.server_address[1])
        self.base_url = f"http://{host}:{self.port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def keys(self) -> list[str | None]:
        return [r["auth"] for r in self.requests if r["path"].endswith("/chat/completions")]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
