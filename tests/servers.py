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

    def env(self, monkeypatch: pytest.MonkeyPatch, key: str = "testing", secret: str = "testing") -> None:
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
