"""Start the real simulator process (``python -m specsweep.engines.sglang.sim``) for a test."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from tests.helpers.sshd import free_port


@contextmanager
def running_sim(*args: str, ready: bool = True, startup_s: float = 0.2) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "specsweep.engines.sglang.sim", "--port", str(port), "--startup-s", str(startup_s), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        if ready:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None:
                    raise RuntimeError(f"simulator exited: {proc.stdout.read().decode() if proc.stdout else ''}")
                time.sleep(0.05)
            else:
                raise RuntimeError("simulator did not become healthy")
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
