#!/usr/bin/env bash
# The main job on this machine: the local llama.cpp target (installs what it needs first).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
exec .venv/bin/python -m flows.server_lifecycle "$@"
