#!/usr/bin/env bash
# The static checks, then the whole test suite (installs what it needs first).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
bash scripts/check.sh
export PREFECT_HOME="${PREFECT_HOME:-$(mktemp -d)}"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
