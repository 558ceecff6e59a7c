#!/usr/bin/env bash
# Static checks: the linter (ruff) and the type checker (mypy), as configured in pyproject.toml.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh test
.venv/bin/ruff check
.venv/bin/mypy
