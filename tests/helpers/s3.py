"""A real S3-compatible server for the tests: moto's server, run as a separate process on loopback."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from tests.helpers.processes import stop_process
from tests.helpers.sshd import free_port

ACCESS_KEY, SECRET_KEY, REGION = "specsweep-test-key", "specsweep-test-secret", "us-east-1"


@dataclass
class S3Server:
    endpoint: str
    bucket: str

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def filesystem(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(endpoint_override=self.endpoint, scheme="http", region=REGION, access_key=ACCESS_KEY,
                                 secret_key=SECRET_KEY, allow_bucket_creation=True)

    def keys(self, prefix: str) -> list[str]:
        """Every object under ``bucket/prefix``."""
        infos = self.filesystem().get_file_info(pafs.FileSelector(f"{self.bucket}/{prefix}", recursive=True,
                                                                  allow_not_found=True))
        return sorted(i.path for i in infos if i.type == pafs.FileType.File)


@contextmanager
def s3_server(workdir: Path) -> Iterator[S3Server]:
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or "moto_server"
    port = free_port()
    log = open(workdir / "moto.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start: {(workdir / 'moto.log').read_text()}") from None
                time.sleep(0.1)
        server = S3Server(f"http://127.0.0.1:{port}", "specsweep-results")
        server.filesystem().create_dir(server.bucket)
        yield server
    finally:
        stop_process(proc)
        log.close()
