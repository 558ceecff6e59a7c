"""Start the real simulator process (``python -m specsweep.targets.sim``) for a test."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from specsweep.engines.sglang import baseline as sglang_baseline
from specsweep.engines.sglang import eagle3 as sglang_eagle3
from specsweep.profiles import ServerProfile
from tests.helpers.processes import stop_process
from tests.helpers.sshd import free_port


@contextmanager
def running_sim(*args: str, ready: bool = True, startup_s: float = 0.2,
                listening: bool = False) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The simulator on a free port, yielded once /health says 200 (``ready``), or once it answers /health at all
    (``listening``: its imports alone took over a second once on a slow day), or at once."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "specsweep.targets.sim", "--port", str(port), "--startup-s", str(startup_s), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        if ready or listening:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200 or listening:
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
        stop_process(proc, 5)


#: A run stopped from outside (cancelled, killed) measures until then: at the published model's pace (93 tok/s
#: for one stream) rather than tiny-fast's 360, its client and server do a quarter of the work meanwhile.
SLOW_PROFILE = "kimi-k2.5-int4-8x-rtx-pro-6000"


def sim_profiles(port: int, *extra: str, sim_profile: str = "tiny-fast") -> tuple[ServerProfile, ServerProfile]:
    """The SGLang baseline and EAGLE-3 presets on the simulator (its fast profile), side by side from ``port``."""
    common = dict(port=port, host="127.0.0.1", simulate=True, sim_profile=sim_profile, sim_startup_s=0.3, tp=8)
    base = sglang_baseline("/models/kimi", extra_args=list(extra), **common)  # type: ignore[arg-type]
    spec = sglang_eagle3("/models/kimi", "/models/eagle3", extra_args=list(extra), **common)  # type: ignore[arg-type]
    return base.model_copy(update={"startup_timeout_s": 30.0}), spec.model_copy(update={"startup_timeout_s": 30.0})
