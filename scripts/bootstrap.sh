#!/usr/bin/env bash
# Install what specsweep needs on a fresh Debian machine: system tools, a virtualenv, the package.
# Sourced by scripts/main.sh and scripts/test.sh; safe to run again (it skips what is there).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ssh-keygen >/dev/null || missing+=(openssh-client)
command -v ss >/dev/null && command -v ip >/dev/null || missing+=(iproute2)
command -v ps >/dev/null || missing+=(procps)
command -v setsid >/dev/null || missing+=(util-linux)
command -v runuser >/dev/null || missing+=(util-linux)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]} (Debian packages)" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $PY" >&2
  "$PY" -m venv .venv
fi
stamp=.venv/.specsweep-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: installing specsweep and its dependencies into .venv (a minute or two the first time)" >&2
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -m pip install -q -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import specsweep, prefect, xllamacpp" 
  touch "$stamp"
fi
