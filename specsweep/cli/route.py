"""``specsweep route``: the load-aware router (``specsweep.route``) that deploys a threshold on an engine without a
per-batch speculation switch."""

from __future__ import annotations

import typer

from specsweep import route
from specsweep.cli.app import app


@app.command("route", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                        "help_option_names": []})
def route_command(ctx: typer.Context) -> None:
    """Route each request by the requests in flight: to the speculative server below --off-from, to the baseline
    server from it (--port, --speculative URL, --baseline URL, --off-from N). Pass --help after 'route'."""
    route.main(list(ctx.args))
