#!/usr/bin/env bash
# Install what a command needs on a fresh Debian machine, and no more; safe to run again (it skips what is there).
#   source scripts/bootstrap.sh        the main job, the UI, a worker: specsweep and its dependencies in .venv
#   source scripts/bootstrap.sh test   the tests too: their Python packages, OpenSSH server, PostgreSQL
# The virtualenv is made by uv (itself in ~/.cache/specsweep/uv), whose cache makes a new checkout's
# .venv a matter of seconds once the packages have been downloaded once on the machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mode=${1:-main}
case $mode in main | test) ;; *) echo "bootstrap: mode must be main or test (got $mode)" >&2; return 2 2>/dev/null || exit 2;; esac

missing=()
command -v ss >/dev/null && command -v ip >/dev/null || missing+=(iproute2)
command -v ps >/dev/null || missing+=(procps)
command -v setsid >/dev/null || missing+=(util-linux)
if [ "$mode" = test ]; then
  [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  command -v ssh-keygen >/dev/null && command -v ssh-agent >/dev/null || missing+=(openssh-client)
  command -v runuser >/dev/null || missing+=(util-linux)
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]} (Debian packages)" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
UV_HOME=${SPECSWEEP_UV_HOME:-$HOME/.cache/specsweep/uv}
if [ ! -x "$UV_HOME/bin/uv" ]; then
  echo "bootstrap: installing uv into $UV_HOME (once per machine)" >&2
  "$PY" -m venv "$UV_HOME"
  "$UV_HOME/bin/python" -m pip install -q "uv>=0.5,<1" 2>&1 | grep -v "^WARNING: Location" >&2 || true
fi
stamp=.venv/.specsweep-installed
need=0
{ [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ]; } || need=1
[ "$mode" = test ] && [ "$(cat "$stamp" 2>/dev/null)" != test ] && need=1
if [ $need -eq 1 ]; then
  extras=$([ "$mode" = test ] && echo ".[test]" || echo ".")
  echo "bootstrap: installing specsweep ($mode) into .venv" >&2
  [ -x .venv/bin/python ] || "$UV_HOME/bin/uv" venv -q --python "$PY" .venv
  # Compiled to bytecode as it installs, as pip does (uv does not by default): where PYTHONDONTWRITEBYTECODE is
  # set, nothing would ever be compiled and every process (each flow run, server, worker) would compile
  # Prefect, pandas and the rest from source again: about 4 CPU seconds per process here.
  VIRTUAL_ENV="$PWD/.venv" UV_COMPILE_BYTECODE=1 "$UV_HOME/bin/uv" pip install -q -e "$extras"
  .venv/bin/python -c "import specsweep, prefect, xllamacpp"
  echo "$mode" > "$stamp"
  touch .venv/.specsweep-compiled
fi
# A virtualenv installed before set-up compiled (once), and the project's own modules (an editable install is not
# compiled; only what changed is compiled again). A file that does not compile says so when it is imported.
[ -f .venv/.specsweep-compiled ] || { .venv/bin/python -m compileall -q -j 0 .venv/lib >/dev/null || true; touch .venv/.specsweep-compiled; }
.venv/bin/python -m compileall -q -j 0 specsweep flows tasks $([ "$mode" = test ] && echo tests) >/dev/null || true
