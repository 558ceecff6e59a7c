"""A flow that writes what its process sees (its environment's markers, its working directory) to a file: the
locked work pool's test reads whether a run's job variables reached it."""

import json
import os

from prefect import flow


@flow(name="report-env")
def report_env(out: str) -> None:
    with open(out, "w") as f:
        json.dump({"PWNED": os.environ.get("PWNED"), "SPECSWEEP_POLICY": os.environ.get("SPECSWEEP_POLICY"),
                   "cwd": os.getcwd()}, f)
