#!/usr/bin/env bash
# The main job on this machine: compare-engine against the local llama.cpp target
# (baseline vs draft speculation, tiny generated models). Installs what it needs first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh main  # its own mode: the main job's arguments are not bootstrap's
exec .venv/bin/specsweep compare-local "$@"
