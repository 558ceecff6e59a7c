"""The command-line tools the engines' local targets bring, by ``specsweep`` subcommand name: the second
half of the registry (``specsweep.engines`` holds the engines' knowledge; these tools stand above the
server API, which that knowledge serves)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import typer

from specsweep.engines.llamacpp.tools import make_models_command
from specsweep.engines.sglang.sim.server import main as sim_main


@dataclass(frozen=True)
class Command:
    """A ``specsweep`` subcommand (a typer-annotated function, and its click settings)."""

    run: Callable[..., None]
    context_settings: dict[str, Any] = field(default_factory=dict)


def sim_command(ctx: typer.Context) -> None:
    """Run the SGLang-compatible simulator (SGLang's launch flags plus --sim-profile, --startup-s, --seed,
    --fault-*). Pass --help after 'sim' for its own options."""
    sim_main(list(ctx.args))


COMMANDS = {
    "make-models": Command(make_models_command),
    "sim": Command(sim_command, {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}),
}
