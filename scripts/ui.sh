#!/usr/bin/env bash
# Bring up the Prefect UI on this machine with every specsweep deployment and a worker.
# Stop everything with: bash scripts/ui.sh stop
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh main  # its own mode: this script's arguments are not bootstrap's
PORT=${PREFECT_PORT:-4200}
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_API_URL="http://127.0.0.1:${PORT}/api"
mkdir -p data
if [ "${1:-}" = "stop" ]; then
  pkill -f "prefect worker start --pool specsweep" || true
  pkill -f "prefect server start --host 127.0.0.1 --port ${PORT}" || true
  sleep 3
  pkill -9 -f "prefect worker start --pool specsweep" || true  # a worker that lost its server may not exit
  exit 0
fi
if ! curl -fs "${PREFECT_API_URL}/health" >/dev/null 2>&1; then
  echo "starting the Prefect server on http://127.0.0.1:${PORT} (log: data/prefect-server.log)"
  nohup .venv/bin/prefect server start --host 127.0.0.1 --port "${PORT}" >data/prefect-server.log 2>&1 &
  for _ in $(seq 1 120); do curl -fs "${PREFECT_API_URL}/health" >/dev/null 2>&1 && break; sleep 0.5; done
fi
.venv/bin/prefect block register -m orchestration.blocks
.venv/bin/prefect work-pool create specsweep --type process --base-job-template deployments/work-pool.json 2>/dev/null || true
.venv/bin/prefect --no-prompt deploy --all --prefect-file deployments/prefect.yaml
if ! pgrep -f "prefect worker start --pool specsweep" >/dev/null; then
  echo "starting a worker for the 'specsweep' pool (log: data/prefect-worker.log)"
  nohup .venv/bin/prefect worker start --pool specsweep >data/prefect-worker.log 2>&1 &
fi
cat <<MSG

The Prefect UI is at http://127.0.0.1:${PORT}
  export PREFECT_API_URL=${PREFECT_API_URL}
  .venv/bin/prefect deployment run 'compare-engine/local' --watch
MSG
