#!/usr/bin/env bash
# Static checks: the linter (ruff) and the type checker (mypy), as configured in pyproject.toml.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh test
.venv/bin/ruff check
# mypy's cache is kept per machine, as the virtualenvs' packages are: it holds each module's hash, so a new
# checkout checks again only what differs (a fresh clone: 44 s without it, 2 s with it; an error is still found).
.venv/bin/mypy --cache-dir "$HOME/.cache/specsweep/mypy"
