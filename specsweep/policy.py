"""What this worker may run: the hosts it may reach, and the commands, working directories, environment
names and results roots it may use there. Decided where the worker runs, never by a flow's parameters or
by a block (anyone who can reach a Prefect OSS server can start runs and read blocks).

The policy is a TOML file named by ``SPECSWEEP_POLICY``, else ``~/.config/specsweep/policy.toml``:

    hosts = ["local", "gpu-*.lab.example"]            # "local" and SSH host names (jump hosts too), fnmatch
    commands = ["/opt/serving/bin/python -m my_engine.server"]   # what a launch command must start with
                                                       # (word by word; a word may be a shell-style pattern)
    cwd = ["/srv/models"]                              # working directories (and below) a profile may enter
    env = ["CUDA_VISIBLE_DEVICES", "NCCL_*"]           # environment names a profile may set (fnmatch)
    results = ["/srv/bench-results", "s3://bench/"]    # results roots (and below)
    forbidden_args = ["--trust-remote-code"]           # arguments no command may carry

Without a file the local default holds: this machine only; the servers of the bundled presets (each
engine's ``launch_modules``: specsweep's own under this interpreter, an engine's under ``python``); the
engines' own environment names (``env_names``) and the usual GPU and tokenizer ones; results under
``data/results``. A run the policy refuses fails before anything is sent, naming the rule and the file.
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specsweep import engines
from specsweep.errors import ConfigError
from specsweep.redact import public_url

POLICY_ENV = "SPECSWEEP_POLICY"
DEFAULT_FILE = Path("~/.config/specsweep/policy.toml")
REPO_ROOT = Path(__file__).resolve().parents[1]

#: Environment names no policy can allow: each makes a process run other code than its command.
NEVER_ENV = ("LD_*", "PYTHON*", "BASH_ENV", "ENV", "PATH", "GCONV_PATH", "OPENSSL_CONF", "PERL5*", "RUBY*",
             "NODE_OPTIONS", "SHELLOPTS", "PS4", "IFS", "HOME", "PROMPT_COMMAND", "GIT_*", "SSH_*")


#: ... except these, which change how Python runs, not what it runs.
HARMLESS_PYTHON_ENV = ("PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONFAULTHANDLER",
                       "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "PYTHONDEVMODE")


def _default_commands() -> list[str]:
    """The engines' presets: specsweep's own modules under this interpreter (or the checkout's .venv, relative
    to the worker's directory, which no profile may leave without a ``cwd`` rule), an engine's under python."""
    out = []
    for engine in engines.ENGINES.values():
        for module in engine.launch_modules:
            pythons = [sys.executable, ".venv/bin/python"] if module.startswith("specsweep.") else ["python", "python3"]
            out += [f"{python} -m {module}" for python in pythons]
    return out


def _never(name: str) -> bool:
    return name not in HARMLESS_PYTHON_ENV and any(fnmatch.fnmatchcase(name, p) for p in NEVER_ENV)


class Policy(BaseModel):
    """The worker's rules (see the module's text)."""

    model_config = ConfigDict(extra="forbid")

    hosts: list[str] = Field(default_factory=lambda: ["local"])
    commands: list[str] = Field(default_factory=_default_commands)
    cwd: list[str] = Field(default_factory=list)
    env: list[str] = Field(default_factory=lambda: [
        "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HOME", "HF_HUB_OFFLINE",
        "NCCL_*", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM",
        *(name for engine in engines.ENGINES.values() for name in engine.env_names)])
    results: list[str] = Field(default_factory=lambda: [str(REPO_ROOT / "data" / "results")])
    forbidden_args: list[str] = Field(default_factory=lambda: ["--trust-remote-code"])
    source: str = Field("the built-in local default", description="Where the policy was read from.")

    # -- the checks ------------------------------------------------------------------------------

    def _refuse(self, what: str, why: str, rule: str) -> ConfigError:
        return ConfigError(f"{what}: {why}. The worker's policy ({self.source}) decides this ({rule}); change it "
                           f"there (set {POLICY_ENV} to a policy file on the worker), not in the run's parameters")

    def check_host(self, hostname: str, what: str = "host") -> None:
        """``hostname``: "local" or an SSH host's name."""
        if not any(fnmatch.fnmatchcase(hostname, pattern) for pattern in self.hosts):
            raise self._refuse(what, f"{hostname!r} is not a host this worker may reach", f"hosts: {self.hosts}")

    def check_launch(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, what: str,
                     argv_field: str | None = None) -> None:
        """A server's launch command (the field ``argv_field``, else ``what``.argv), its environment names and
        its working directory."""
        allowed = [shlex.split(c) for c in self.commands]
        if not any(a and len(argv) >= len(a) and all(fnmatch.fnmatchcase(w, p) for w, p in zip(argv, a, strict=False))
                   for a in allowed):
            raise self._refuse(argv_field or f"{what}.argv", f"{shlex.join(argv[:4])}... is not among the commands "
                               "this worker may launch", f"commands: {self.commands}")
        for arg in argv:
            if arg.split("=", 1)[0] in self.forbidden_args:
                raise self._refuse(argv_field or f"{what}.argv", f"{arg} is an argument this worker never passes",
                                   f"forbidden_args: {self.forbidden_args}")
        for name in env:
            if _never(name):
                raise self._refuse(f"{what}.env", f"{name} would make the server run other code than its command",
                                   "never allowed")
            if not any(fnmatch.fnmatchcase(name, p) for p in self.env):
                raise self._refuse(f"{what}.env", f"{name} is not an environment name this worker passes on",
                                   f"env: {self.env}")
        if cwd is not None and not _inside(cwd, self.cwd):
            raise self._refuse(f"{what}.cwd", f"{cwd!r} is not a working directory this worker may enter",
                               f"cwd: {self.cwd}")

    def check_results(self, root: str, what: str = "benchmark.results") -> None:
        """A results root: a path or URL inside one the policy names (no '..' to climb out; a URL with no
        credentials and no query, where options such as another endpoint would ride)."""
        shown = public_url(root)
        if ".." in PurePosixPath(root.split("://", 1)[-1]).parts:
            raise ConfigError(f"{what}: {shown!r} climbs out of its folder ('..'): give the root itself")
        if "://" in root and (urlsplit(root).query or urlsplit(root).fragment or "@" in urlsplit(root).netloc):
            raise ConfigError(f"{what}: {shown!r} carries credentials or options in its URL: give the bare URL, and "
                              "the store's endpoint and keys in a specsweep-results block (its Secret fields)")
        if not _inside(root, self.results):
            raise self._refuse(what, f"{shown!r} is not a results root this worker may write", f"results: "
                               f"{self.results}")


def _inside(path: str, roots: Sequence[str]) -> bool:
    """``path`` is one of ``roots`` or below one (paths made absolute and resolved; URLs compared as text)."""
    def norm(p: str) -> str:
        if "://" in p and not p.startswith("file://"):
            return p.rstrip("/")
        local = p.removeprefix("file://")
        return os.path.realpath(os.path.expanduser(local))

    target = norm(path)
    return any(target == r or target.startswith(r + "/") for r in (norm(x) for x in roots))


def load(path: str | None = None) -> Policy:
    """The worker's policy: the file ``path``, ``$SPECSWEEP_POLICY``, ``~/.config/specsweep/policy.toml``, or the
    built-in local default when none exists."""
    named = path or os.environ.get(POLICY_ENV)
    file = Path(named).expanduser() if named else DEFAULT_FILE.expanduser()
    if not file.exists():
        if named:
            raise ConfigError(f"the worker's policy file {file} ({POLICY_ENV}) does not exist: create it or unset "
                              f"{POLICY_ENV}")
        return Policy()
    try:
        data = tomllib.loads(file.read_text())
        return Policy.model_validate({**data, "source": str(file)})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"the worker's policy file {file} cannot be read: {exc}") from None
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"the worker's policy file {file} is not valid: {fields}") from None
