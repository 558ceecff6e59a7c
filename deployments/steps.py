"""The deployments' pull step: run each flow in the checkout the worker's Python imports specsweep from.

A worker is started from its own checkout of this repository, with that checkout's
virtualenv (``bash scripts/bootstrap.sh`` installs it in editable mode). Before a flow run,
this step enters that checkout, so that relative paths in profiles (``.venv/bin/python``,
``data/results``) resolve there, on whatever machine and path the checkout lives, and no
deployment records the deploying machine's working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]


def enter_checkout() -> dict[str, str]:
    """``pull: [{deployments.steps.enter_checkout: {}}]`` in prefect.yaml."""
    os.chdir(CHECKOUT)
    return {"directory": str(CHECKOUT)}
