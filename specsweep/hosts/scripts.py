"""The shell scripts a host runs where a shell cannot be avoided, and the environment they read.

Each is a constant; values reach it only as positional arguments (``sh -c SCRIPT sh ARG...``) or on
standard input (the environment, ``env_script``), so no value is ever parsed by a shell.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

from specsweep.errors import ServerStartError
from specsweep.profiles import is_env_name

# The environment arrives on stdin as `export NAME='value'` lines (names checked, values quoted with
# shlex.quote) and an end line (a start whose input was cut short by a dropped link starts
# nothing, rather than a server without its marker), so that no value, secrets included, is ever
# on a command line that ps shows every user. The log is a new file (created exclusively, 0600: never
# an existing file, never through a link) in ~/.specsweep/logs, whose folders are created 0700 where
# missing and refused when one is a symbolic link, another user's, or writable by others. Then it
# enters cwd and starts "$@" in a new session with the log as its output. setsid does not fork
# here (the background child is not a group leader), so $! is the server's pid, its process
# group id and its session id. It prints the pid and the log's path, and the CUDA_VISIBLE_DEVICES
# the server was given (by the profile or the login's environment), which the GPU check after a
# kill reads. A start given a private temporary folder (~/.specsweep/tmp/NAME, and the names of the
# variables to point at it) creates it the same way (0700, of the login, no link in the way) once
# nothing else can fail, exports each variable as its path and prints it; where a Unix socket's path
# in it (a UUID name: 37 more bytes) would pass the 107 bytes allowed, it makes none.
START_SCRIPT = r"""umask 077
log=$1; cwd=$2; tmp=$3; tmpvars=$4; shift 4
environment=$(cat)
case $environment in
  *"$ENV_END") ;;
  *) echo "the environment did not arrive whole: not starting" >&2; exit 95;;
esac
eval "$environment" || exit 95
case $log in
  "~/.specsweep/logs/"*) log=$HOME/${log#"~/"};;
  *) echo "$log is not in ~/.specsweep/logs" >&2; exit 96;;
esac
case ${log#"$HOME/.specsweep/logs/"} in */* | .* | "") echo "$log is not a plain name in ~/.specsweep/logs" >&2; exit 96;; esac
if [ -n "$tmp" ]; then
  case $tmp in
    "~/.specsweep/tmp/"*) tmp=$HOME/${tmp#"~/"};;
    *) echo "$tmp is not in ~/.specsweep/tmp" >&2; exit 96;;
  esac
  case ${tmp#"$HOME/.specsweep/tmp/"} in */* | .* | "") echo "$tmp is not a plain name in ~/.specsweep/tmp" >&2; exit 96;; esac
fi
private_folder() {
  if [ ! -e "$1" ] && [ ! -L "$1" ]; then mkdir -m 700 -- "$1" || exit 97; fi
  if [ -L "$1" ] || [ ! -d "$1" ]; then echo "$1 is a symbolic link or not a directory" >&2; exit 96; fi
  if [ ! -O "$1" ]; then echo "$1 belongs to another user" >&2; exit 96; fi
  case $(stat -c %a -- "$1") in
    *[2367]? | *[2367]) echo "$1 is writable by other users" >&2; exit 96;;
  esac
}
private_folder "$HOME/.specsweep"
private_folder "$HOME/.specsweep/logs"
( set -C; : > "$log" ) 2>/dev/null || { echo "$log exists already (or is a link): a log is always a new file" >&2; exit 96; }
if [ -n "$cwd" ]; then cd -- "$cwd" || exit 98; fi
if [ -n "$tmp" ] && [ "$(printf %s "$tmp" | LC_ALL=C wc -c)" -le 70 ]; then
  private_folder "$HOME/.specsweep/tmp"
  private_folder "$tmp"
  for name in $tmpvars; do export "$name=$tmp"; done
else
  tmp=
fi
setsid "$@" </dev/null >>"$log" 2>&1 &
echo "$! $log"
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then printf 'CUDA_VISIBLE_DEVICES=%s\n' "$CUDA_VISIBLE_DEVICES"; fi
if [ -n "$tmp" ]; then printf 'PRIVATE_TMP=%s\n' "$tmp"; fi
"""

ENV_END = ": end of the environment"
START_SCRIPT = START_SCRIPT.replace("$ENV_END", ENV_END)

#: How long the start command may take to answer (it returns as soon as the server is forked).
START_COMMAND_TIMEOUT_S = 60.0


def check_env_names(names: Iterable[str]) -> None:
    for name in names:
        if not is_env_name(name):
            raise ServerStartError(f"environment variable name {name!r} is not valid: use letters, digits and _")


def env_script(env: Mapping[str, str]) -> bytes:
    """The environment as the start script reads it from stdin: one quoted export per variable."""
    check_env_names(env)
    lines = [f"export {name}={shlex.quote(value)}\n" for name, value in env.items()]
    return ("".join(lines) + ENV_END + "\n").encode()


READ_FROM_SCRIPT = r"""tail -c +"$1" -- "$2" 2>/dev/null | head -c "$3" """

ENVIRON_SCRIPT = r"""grep -lsazx -e "$1" /proc/[0-9]*/environ; exit 0"""

ENVIRON_VALUE_SCRIPT = r"""tr '\0' '\n' < "/proc/$1/environ" 2>/dev/null | sed -n "s/^$2=/=/p" | head -n 1"""

SS_PID = re.compile(r"pid=(\d+)")

#: Writes stdin to ~/.specsweep/files/NAME, readable by the login user alone, whole or not at all.
WRITE_PRIVATE_SCRIPT = r"""umask 077; d="$HOME/.specsweep/files"; mkdir -p -- "$d" && [ ! -L "$d" ] && \
chmod 700 -- "$d" && cat > "$d/.$1.tmp" && mv -f -- "$d/.$1.tmp" "$d/$1" && printf '%s' "$d/$1" """
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")

#: Removes the login's private temporary folders ~/.specsweep/tmp/<port>-<token> whose start no live process
#: carries any more (SPECSWEEP_START=<token>... in its environment) and prints each one removed; a folder of another
#: start ($1 is the kill's own token) younger than 2 minutes stays too (its start may not have exec'd yet). Fails
#: closed: where the processes' environments cannot be read, nothing is removed. (A process that rewrites its own
#: environment, as a retitled engine worker does, shows no token: its start's folder is protected by the others.)
REMOVE_STALE_TMP_SCRIPT = r"""d="$HOME/.specsweep/tmp"; [ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] || exit 0
printf 'SPECSWEEP_START=0\0' | grep -qaz '^SPECSWEEP_START=0' || {
  echo "grep here cannot read process environments (-a, -z): nothing removed" >&2; exit 0; }
live=$({ grep -hsaoz '^SPECSWEEP_START=[0-9a-f]*' /proc/[0-9]*/environ; echo "rc=$?"; } | tr '\0' ' ')
case $live in *rc=[012]) ;; *) echo "the processes' environments could not be read: nothing removed" >&2; exit 0;; esac
live=" $live"
for t in "$d"/*; do
  [ -d "$t" ] && [ ! -L "$t" ] && [ -O "$t" ] || continue
  name=${t#"$d/"}; port=${name%%-*}; tok=${name#*-}
  case $port in "" | *[!0-9]*) continue;; esac
  case $tok in "" | *[!0-9a-f]*) continue;; esac
  [ ${#tok} -eq 12 ] || continue
  case $live in *" SPECSWEEP_START=$tok"*) continue;; esac
  if [ "$tok" != "$1" ] && [ -z "$(find "$t" -maxdepth 0 -mmin +2)" ]; then continue; fi
  chmod -R u+w -- "$t" 2>/dev/null
  if rm -rf -- "$t" 2>/dev/null && [ ! -e "$t" ]; then printf '%s\n' "$t"; else echo "could not remove $t" >&2; fi
done
exit 0"""
