"""Measure how often the target accepts the draft's tokens, on a real llama.cpp server."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx

from specsweep.llamacpp.models import ModelFiles

PROMPTS = [
    "the water was cold and the river",
    "a quick test of the server",
    "my mother said that the music",
    "one day the king found a horse",
]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure_acceptance(files: ModelFiles, *, draft_max: int = 4, max_tokens: int = 96) -> tuple[float, int]:
    """Serve the pair with draft speculation; return (accepted / drafted, drafted) over a few greedy requests."""
    port = _free_port()
    argv = [sys.executable, "-m", "specsweep.llamacpp.launcher", "-m", str(files.target), "-md", str(files.draft),
            "--spec-type", "draft-simple", "--spec-draft-n-max", str(draft_max), "--port", str(port),
            "-np", "1", "-c", "2048", "-t", "2"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError("the llama.cpp launcher exited while loading the models")
            time.sleep(0.1)
        drafted = accepted = 0
        for prompt in PROMPTS:
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
            timings = httpx.post(url + "/v1/completions", json=body, timeout=120).json()["timings"]
            drafted += timings.get("draft_n", 0)
            accepted += timings.get("draft_n_accepted", 0)
        return (accepted / drafted if drafted else 0.0), drafted
    finally:
        proc.terminate()
        proc.wait(10)
