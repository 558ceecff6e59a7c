"""The real vLLM's fixtures: its virtualenv (scripts/vllm_cpu.sh, cached between runs; the test command
installs it and passes its python as SPECSWEEP_VLLM_PYTHON) and the tiny models it serves."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from specsweep.engines.llamacpp import default_models_dir
from specsweep.targets.vllm.models import HFModels, HFModelSpec, make_models

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def vllm_python() -> str:
    python = os.environ.get("SPECSWEEP_VLLM_PYTHON")
    if not python:  # run outside scripts/test.sh: install (or find) the cached virtualenv
        done = subprocess.run(["bash", str(REPO / "scripts" / "vllm_cpu.sh")], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        python = done.stdout.strip().splitlines()[-1]
    assert Path(python).is_file(), python
    return python


@pytest.fixture(scope="session")
def hf_models(vllm_python: str) -> HFModels:
    spec = HFModelSpec()
    return make_models(default_models_dir() / f"vllm-{spec.digest()}", vllm_python, spec)
