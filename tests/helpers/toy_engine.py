"""A fourth engine, in the tests alone: what adding an engine takes, one module and ``engines.register``.

Its servers are the repo's SGLang simulator (``python -m specsweep.targets.sim``) under another name,
so that nothing of SGLang's own entry in the registry (its request fields, its version probe, its
per-batch file) is what makes a comparison of it work.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from pydantic import Field

from specsweep import engines
from specsweep.engines.base import Engine, EngineSettings, Kind
from specsweep.profiles import ServerProfile

NAME = "toy"


class ToySettings(EngineSettings):
    """The toy engine's form: where its simulated servers listen."""

    engine: Literal["toy"] = Field(NAME, description="The engine these settings are for.")
    port: int = Field(ge=1, le=65535, description="Server port (the speculative one, side by side, the next).")
    num_steps: int = Field(3, ge=1, le=8, description="Tokens the speculative server drafts per step.")

    def profile(self, kind: Kind) -> ServerProfile:
        argv = [sys.executable, "-m", "specsweep.targets.sim", "--sim-profile", "tiny-fast", "--startup-s", "0.3",
                "--model-path", "/models/toy", "--host", "{host}", "--port", "{port}", "--tp", "8"]
        if kind == "speculative":
            argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/toy-draft",
                     "--speculative-num-steps", str(self.num_steps), "--speculative-eagle-topk", "1"]
        return ServerProfile(name=f"toy-{kind}", engine=NAME, argv=argv, port=self.port, health_path="/health",
                             startup_timeout_s=30.0, cleanup_patterns=[r"-m specsweep\.targets\.sim\b"])


class Toy(Engine):
    name = NAME
    label = "Toy"
    settings = ToySettings
    grid_fields = {"num_steps": "steps"}
    k_field = "num_steps"
    default_grid = {"num_steps": [1, 3]}


@contextmanager
def toy_engine() -> Iterator[Engine]:
    """The toy engine registered for the block's length."""
    engine = engines.register(Toy())
    try:
        yield engine
    finally:
        del engines.ENGINES[NAME]
