"""The ``specsweep`` command's application object; each module of this package adds its commands."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Does speculative decoding pay on my servers, and at what load should it be off?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help (click's): two columns that wrap to the terminal, readable in 80 columns.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
