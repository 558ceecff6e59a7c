"""Ending the processes a test started, one way: SIGTERM, a grace, then SIGKILL, and the exit reaped (a
process killed without a wait stays a zombie until the test process ends)."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen[bytes] | subprocess.Popen[str], grace_s: float = 10.0) -> int:
    """Stop ``proc`` (SIGTERM, up to ``grace_s``, then SIGKILL) and return its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(30)
