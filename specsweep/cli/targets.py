"""The local targets' commands: ``specsweep make-models`` writes the tiny llama.cpp models and measures how
often the target accepts the draft's tokens, on a real llama.cpp server (through the server API);
``specsweep sim`` runs the SGLang simulator."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from specsweep.cli.app import app
from specsweep.errors import NoAnswer, ServerStartError
from specsweep.hosts.tunnel import free_local_port
from specsweep.server.api import ServerAPI
from specsweep.targets.llamacpp.models import ModelFiles, ModelSpec, make_models
from specsweep.targets.sim.server import main as sim_main

PROMPTS = [
    "the water was cold and the river",
    "a quick test of the server",
    "my mother said that the music",
    "one day the king found a horse",
]
LAUNCHER = "specsweep.targets.llamacpp.launcher"


async def _measure(url: str, proc: subprocess.Popen[bytes], max_tokens: int) -> tuple[float, int]:
    async with ServerAPI(url, timeout_s=120) as api:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise ServerStartError("the llama.cpp launcher exited while loading the models")
            try:
                if await api.status("/health", timeout_s=2) == 200:
                    break
            except NoAnswer:
                pass
            if time.monotonic() > deadline:
                raise ServerStartError("the llama.cpp launcher did not become healthy within 60 s")
            await asyncio.sleep(0.1)
        drafted = accepted = 0
        for prompt in PROMPTS:
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
            answer = await api.post_json("/v1/completions", body)
            timings = (answer or {}).get("timings") or {}
            drafted += int(timings.get("draft_n") or 0)
            accepted += int(timings.get("draft_n_accepted") or 0)
    return (accepted / drafted if drafted else 0.0), drafted


def measure_acceptance(files: ModelFiles, *, draft_max: int = 4, max_tokens: int = 96) -> tuple[float, int]:
    """Serve the pair with draft speculation; return (accepted / drafted, drafted) over a few greedy requests."""
    port = free_local_port()
    argv = [sys.executable, "-m", LAUNCHER, "-m", str(files.target), "-md", str(files.draft), "--spec-type",
            "draft-simple", "--spec-draft-n-max", str(draft_max), "--port", str(port), "-np", "1", "-c", "2048", "-t", "2"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return asyncio.run(_measure(f"http://127.0.0.1:{port}", proc, max_tokens))
    finally:
        proc.terminate()
        proc.wait(10)


@app.command("make-models")
def make_models_command(
    out: Annotated[Optional[Path], typer.Option(
        help="Directory for target.gguf and draft.gguf; default the folder the local target reads them from "
        "(in the user's cache).")] = None,
    seed: Annotated[int, typer.Option(help="Random seed: the same seed writes the same files.")] = 1234,
    force: Annotated[bool, typer.Option("--force", help="Rewrite even if models with the same spec exist.")] = False,
    measure: Annotated[bool, typer.Option(
        "--measure/--no-measure", help="Serve the pair and measure the draft acceptance rate (~15 s).")] = True,
) -> None:
    """Write the tiny llama.cpp target and draft models used by the local target."""
    t0 = time.perf_counter()
    from specsweep.engines.llamacpp import default_models_dir

    spec = ModelSpec(seed=seed)
    files = make_models(out or default_models_dir() / f"llama-{spec.digest()}", spec, force=force)
    typer.echo(f"target {files.target} ({files.target_params / 1e6:.1f}M parameters, "
               f"{files.target.stat().st_size / 1e6:.1f} MB)")
    typer.echo(f"draft  {files.draft} ({files.draft_params / 1e6:.1f}M parameters, "
               f"{files.draft.stat().st_size / 1e6:.1f} MB; the target's first {files.spec.draft_layers} block(s))")
    typer.echo(f"vocabulary {files.vocab_size} tokens; written or reused in {time.perf_counter() - t0:.1f} s")
    if measure:
        rate, tokens = measure_acceptance(files)
        typer.echo(f"draft acceptance measured: {rate:.0%} of {tokens} drafted tokens (draft-simple, draft max 4)")
    else:
        typer.echo("draft acceptance expected: about 80 % (draft-simple, draft max 4); --measure measures it")


@app.command("sim", context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []})
def sim_command(ctx: typer.Context) -> None:
    """Run the SGLang-compatible simulator (SGLang's launch flags plus --sim-profile, --startup-s, --seed,
    --fault-*). Pass --help after 'sim' for its own options."""
    sim_main(list(ctx.args))
