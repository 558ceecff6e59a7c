"""What this worker may run: the hosts it may reach, and the commands, arguments, working directories,
environment names and results roots it may use there. Decided where the worker runs, never by a flow's
parameters, a block or a run's environment (anyone who can reach a Prefect OSS server can start runs, set their
job variables and edit blocks).

Where the policy is read (the first that exists; nothing a run sends can choose among them):

1. ``/etc/specsweep/policy.toml``, the machine's. When it exists it is the policy, and ``SPECSWEEP_POLICY``
   naming another file is an error (a run's ``env`` job variable could set it).
2. The file ``SPECSWEEP_POLICY`` names, in the worker's environment (for a worker without root). Named but
   missing or empty is an error, never the built-in default.
3. ``~/.config/specsweep/policy.toml`` of the worker's user (its home from the password database, not ``$HOME``).
4. The built-in local default (below).

A file the administrator wrote must hold rules: an empty one is an error.

    hosts = ["local", "gpu-*.lab.example"]            # "local" and SSH host names (jump hosts too), fnmatch
    commands = ["/opt/serving/bin/python -m my_engine.server"]   # what a launch command must start with
                                                       # (word by word; a word may be a shell-style pattern)
    args = {custom = ["--verbose", "--workers="]}      # flags beyond the presets', per engine name ("custom":
                                                       # any other command; "=": takes a value, else a switch)
    arg_files = ["/srv/templates"]                     # folders a file-valued flag may name (chat templates ...)
    cwd = ["/srv/models"]                              # working directories (and below) a profile may enter
    env = ["CUDA_VISIBLE_DEVICES", "NCCL_*"]           # environment names a profile may set (fnmatch)
    results = ["/srv/bench-results", "s3://bench/"]    # results roots (and below)
    endpoints = ["http://minio.lab.example:9000"]      # results blocks' endpoint_url (fnmatch); default none
    targets = ["127.0.0.1", "::1", "localhost"]        # where tunnels and requests go on a host (the default)
    read = ["/srv/prompts", "/srv/models"]             # prompt files and tokenizers (and below)
    read_max_bytes = 536870912                         # the largest file read for a run
    ssh_files = []                                     # key_path / known_hosts files a run may name (default none)
    accept_unknown_host_keys = false                   # may a run (or a block) trust a host key not seen before
    deployments = ["compare-speculation/*"]            # what deployments/serve.py serves (default: all of them)
    forbidden_args = ["--trust-remote-code"]           # arguments no command may carry, in any spelling

A launch command's arguments (after the words of its ``commands`` rule) are read as its engine's parser reads
them (the engine is the one whose launch module or program the command starts): the flags its presets and
settings form produce pass with checked values (``Engine.flags``); any other flag only where ``args`` names it
for that engine, in its exact spelling (underscores read as dashes; a shortened flag, which argparse would
expand, is not the flag named); a file-valued flag's value only inside ``arg_files``; a forbidden flag in no
spelling its parser takes (``--trust_remote_code``, ``--trust-remote-cod``). An environment name that names a
file, a folder or code (``*PATH*``, ``*FILE*``, ``*CONFIG*``, ``*PLUGIN*``, ...) passes only where ``env``
names it exactly, not through a pattern.

Without a file the local default holds: this machine only; the servers of the bundled presets (each
engine's ``launch_modules``: specsweep's own under this interpreter, an engine's under ``python``) with their
own flags; the engines' own environment names (``env_names``) and the usual GPU and tokenizer ones; results
under ``data/results``. A run the policy refuses fails before anything is sent, naming the field, the rule
and the file (never the whole policy).
"""

from __future__ import annotations

import fnmatch
import os
import pwd
import shlex
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specsweep import engines
from specsweep.engines import flags as engine_flags
from specsweep.errors import ConfigError
from specsweep.redact import public_url

POLICY_ENV = "SPECSWEEP_POLICY"
#: The machine's policy: when it exists, nothing else is read.
SYSTEM_FILE = Path("/etc/specsweep/policy.toml")
#: The worker user's own, under its home as the password database says.
USER_FILE = Path(".config/specsweep/policy.toml")
REPO_ROOT = Path(__file__).resolve().parents[1]
#: The name ``args`` takes for a command of no engine specsweep knows.
CUSTOM = "custom"

#: Environment names no policy can allow: each makes a process run other code than its command.
NEVER_ENV = ("LD_*", "PYTHON*", "BASH_ENV", "ENV", "PATH", "GCONV_PATH", "OPENSSL_CONF", "PERL5*", "RUBY*",
             "NODE_OPTIONS", "SHELLOPTS", "PS4", "IFS", "HOME", "PROMPT_COMMAND", "GIT_*", "SSH_*")


#: ... except these, which change how Python runs, not what it runs.
HARMLESS_PYTHON_ENV = ("PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONFAULTHANDLER",
                       "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "PYTHONDEVMODE")

#: Environment names that name a file, a folder or code to load (an engine's logging config path, NCCL_NET_PLUGIN):
#: they pass only where the policy names them exactly, never through a pattern such as NCCL_*.
FILE_LIKE_ENV = ("*PATH*", "*FILE*", "*CONFIG*", "*CONF", "*PLUGIN*", "*MODULE*", "*_DIR", "*_DIRS", "*ROOT*",
                 "*HOME*", "*PRELOAD*", "*LIBRARY*", "*CLASS*", "*CLS*", "*SCRIPT*", "*TEMPLATE*", "*CERT*", "*KEY_*")


def _home() -> Path:
    """The worker user's home as the password database says (a run's environment can set $HOME)."""
    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        return Path("/nonexistent")


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


def _file_like(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in FILE_LIKE_ENV)


def engine_of(command: Sequence[str]) -> engines.Engine | None:
    """The engine whose server ``command`` (a launch command's words up to its arguments) starts: its launch
    module after ``-m``, or its program; None for any other command."""
    for engine in engines.ENGINES.values():
        if any(word in engine.launch_modules for word in command[1:]) or (
                command and PurePosixPath(command[0]).name in engine.programs):
            return engine
    return None


class Policy(BaseModel):
    """The worker's rules (see the module's text)."""

    model_config = ConfigDict(extra="forbid")

    hosts: list[str] = Field(default_factory=lambda: ["local"], description="'local' and SSH host names it may "
                             "reach, jump hosts too (fnmatch patterns).")
    commands: list[str] = Field(default_factory=_default_commands, description="What a launch command must start "
                                "with, word by word (a word may be a shell-style pattern).")
    args: dict[str, list[str]] = Field(default_factory=dict, description="Per engine name ('custom': a command of "
                                       "no engine specsweep knows), the flags beyond its presets' own that a command "
                                       "may carry, in the engine's spelling (fnmatch; 'flag=': it takes a value).")
    arg_files: list[str] = Field(default_factory=list, description="Folders a file-valued flag may name.")
    cwd: list[str] = Field(default_factory=list, description="Working directories (and below) a profile may enter.")
    env: list[str] = Field(default_factory=lambda: [
        "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HOME", "HF_HUB_OFFLINE",
        "NCCL_*", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM", "PYTHONUNBUFFERED",
        *(name for engine in engines.ENGINES.values() for name in engine.env_names)],
        description="Environment names a profile may set (fnmatch; a name of a file, folder or code: exactly).")
    results: list[str] = Field(default_factory=lambda: [str(REPO_ROOT / "data" / "results")],
                               description="Results roots (paths or URLs) a run may write, and below.")
    endpoints: list[str] = Field(default_factory=list, description="S3-compatible endpoints a results block may "
                                 "name (fnmatch on the URL).")
    targets: list[str] = Field(default_factory=lambda: ["127.0.0.1", "::1", "localhost"], description="Addresses "
                               "on a host that tunnels and requests may go to (fnmatch).")
    read: list[str] = Field(default_factory=lambda: [str(REPO_ROOT / "data"), str(_home() / ".cache" / "specsweep")],
                            description="Folders prompt files and tokenizers are read from on the worker.")
    read_max_bytes: int = Field(512 << 20, ge=0, description="The largest file read for a run.")
    ssh_files: list[str] = Field(default_factory=list, description="Folders of key and known_hosts files a run's "
                                 "host parameters may name.")
    accept_unknown_host_keys: bool = Field(False, description="Whether a run or an ssh-host block may trust a host "
                                           "key not seen before.")
    deployments: list[str] = Field(default_factory=lambda: ["*"], description="The deployments (flow/deployment, "
                                   "fnmatch) deployments/serve.py serves.")
    forbidden_args: list[str] = Field(default_factory=lambda: sorted(
        {flag for engine in engines.ENGINES.values() for flag in engine.code_flags}),
        description="Flags no command may carry, in any spelling its parser takes.")
    source: str = Field("the built-in local default", description="Where the policy was read from.")

    # -- the checks ------------------------------------------------------------------------------

    def _refuse(self, what: str, why: str, rule: str) -> ConfigError:
        # The rule's name, not its content: the run's log is read by everyone with API access.
        return ConfigError(f"{what}: {why}. The worker's policy ({self.source}) decides this (rule {rule!r}); an "
                           f"administrator changes it on the worker ({SYSTEM_FILE}, or the file {POLICY_ENV} names "
                           "there), not in the run's parameters")

    def check_host(self, hostname: str, what: str = "host") -> None:
        """``hostname``: "local" or an SSH host's name."""
        if not any(fnmatch.fnmatchcase(hostname, pattern) for pattern in self.hosts):
            raise self._refuse(what, f"{hostname!r} is not a host this worker may reach", "hosts")

    def check_launch(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, what: str,
                     argv_field: str | None = None) -> None:
        """A server's launch command (the field ``argv_field``, else ``what``.argv) and its arguments, its
        environment names and its working directory."""
        field = argv_field or f"{what}.argv"
        matched = next((a for a in (shlex.split(c) for c in self.commands)
                        if a and len(argv) >= len(a)
                        and all(fnmatch.fnmatchcase(w, p) for w, p in zip(argv, a, strict=False))), None)
        if matched is None:
            raise self._refuse(field, f"{shlex.join(argv[:4])}... is not among the commands this worker may launch",
                               "commands")
        self.check_args(argv[len(matched):], engine_of(argv[:len(matched)]), field)
        self.check_env(env, f"{what}.env")
        if cwd is not None and not _inside(cwd, self.cwd):
            raise self._refuse(f"{what}.cwd", f"{cwd!r} is not a working directory this worker may enter", "cwd")

    def check_env(self, env: Mapping[str, str], what: str) -> None:
        for name in env:
            if _never(name):
                raise self._refuse(what, f"{name} would make the server run other code than its command",
                                   "never allowed")
            if _file_like(name) and name not in self.env:
                raise self._refuse(what, f"{name} names a file, a folder or code for the server: it passes only "
                                   "where the policy names it exactly", "env")
            if not any(fnmatch.fnmatchcase(name, p) for p in self.env):
                raise self._refuse(what, f"{name} is not an environment name this worker passes on", "env")

    def check_args(self, args: Sequence[str], engine: engines.Engine | None, field: str) -> None:
        """A launch command's arguments, as ``engine``'s parser reads them (see the module's text)."""
        table = engine.flags if engine else {}
        files = engine.file_flags if engine else ()
        kind = engine.name if engine else CUSTOM
        named = self.args.get(kind, [])
        i = 0
        while i < len(args):
            word = args[i]
            if not word.startswith("-") or word == "-" or word.startswith("---"):
                if "*" in named:
                    i += 1
                    continue
                raise self._refuse(field, f"{word!r} is not the value of a flag this worker knows (a word of its "
                                   "own, which the server would read as it likes)", f"args.{kind}")
            name, eq, value = word.partition("=")
            canon = engine_flags.canonical(name)
            if forbidden := next((f for f in self.forbidden_args if engine_flags.abbreviates(canon, f)), None):
                spelled = name if name == forbidden else f"{name} (read by the server as {forbidden})"
                raise self._refuse(field, f"{spelled} is an argument this worker never passes", "forbidden_args")
            nxt = args[i + 1] if i + 1 < len(args) else None
            if canon in table:
                check = table[canon]
                if check is None:
                    if eq:
                        raise self._refuse(field, f"{name} takes no value", f"the {kind} flags")
                    i += 1
                    continue
                if not eq:
                    if nxt is None:
                        raise self._refuse(field, f"{name} needs a value", f"the {kind} flags")
                    value, i = nxt, i + 1
                i += 1
                if (why := check(value)) is not None:
                    raise self._refuse(field, f"{name} {value[:80]!r}: {why}", f"the {kind} flags")
                continue
            # "--flag=" in the policy: a flag that takes a value; "--flag": a switch (a word after it is one of
            # the command's own, which a server may read as a positional argument: refused above).
            valued = any(p == "*" or (p.endswith("=") and fnmatch.fnmatchcase(canon, p[:-1])) for p in named)
            if not valued and not any(fnmatch.fnmatchcase(canon, p) for p in named):
                presets = f"specsweep's {kind} presets" if engine else \
                    "any preset (the command starts no engine specsweep knows)"
                raise self._refuse(field, f"{name} is not a flag of {presets} and the policy does not name it (a flag "
                                   "passes in its exact spelling only)", f"args.{kind}")
            if eq and not valued:
                raise self._refuse(field, f"{name} takes no value here (the policy names it as a switch: "
                                   f"'{canon}=' would take one)", f"args.{kind}")
            if not eq and valued and nxt is not None and not nxt.startswith("-"):
                value, eq, i = nxt, "=", i + 1
            i += 1
            if any(engine_flags.abbreviates(canon, f) for f in files) and not (eq and _inside(value, self.arg_files)):
                raise self._refuse(field, f"{name} names a file the server reads ({value[:80]!r}), outside the "
                                   "folders this worker's servers may read", "arg_files")

    def check_target(self, address: str, what: str) -> None:
        """An address on (or seen from) the host that requests or a tunnel go to."""
        if not any(fnmatch.fnmatchcase(address.strip("[]"), p) for p in self.targets):
            raise self._refuse(what, f"{address!r} is not an address this worker sends requests or tunnels to",
                               "targets")

    def check_endpoint(self, url: str, what: str) -> None:
        """A results store's endpoint (an S3-compatible server): named by the policy, as its results roots are."""
        shown = public_url(url)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or "@" in parts.netloc or parts.query or parts.fragment:
            raise ConfigError(f"{what}: {shown!r} is not a bare http(s) URL of a store: give scheme, host and port")
        if not any(fnmatch.fnmatchcase(url.rstrip("/"), p.rstrip("/")) for p in self.endpoints):
            raise self._refuse(what, f"{shown!r} is not a results endpoint this worker may send its keys and results "
                               "to", "endpoints")

    def check_read(self, path: str | os.PathLike[str], what: str, *, folder: bool = False) -> None:
        """A file the worker reads for a run (prompts, a tokenizer; ``folder``: or a folder holding one): inside a
        ``read`` root once links are resolved, a regular file, at most ``read_max_bytes``."""
        text = os.fspath(path)
        if not _inside(text, self.read):
            raise self._refuse(what, f"{text!r} is not inside a folder this worker reads prompts and tokenizers from",
                               "read")
        real = Path(os.path.realpath(os.path.expanduser(text)))
        if folder and real.is_dir():
            return
        if real.exists() and not real.is_file():  # /dev/zero, a FIFO: reads without end
            raise self._refuse(what, f"{text!r} is not a regular file", "read")
        if real.is_file() and real.stat().st_size > self.read_max_bytes:
            raise self._refuse(what, f"{text!r} holds {real.stat().st_size} bytes, more than this worker reads",
                               "read_max_bytes")

    def check_ssh_trust(self, *, key_path: str | os.PathLike[str] | None, known_hosts: str | os.PathLike[str] | None,
                        accept_unknown: bool, what: str) -> None:
        """What a run (or a block anyone with API access can edit) says of an SSH login's trust: a key file and a
        known_hosts file on the worker only inside ``ssh_files``; trusting an unknown host key only where
        ``accept_unknown_host_keys`` allows it."""
        for field, path in (("key_path", key_path), ("known_hosts", known_hosts)):
            if path is not None and not _inside(os.fspath(path), self.ssh_files):
                raise self._refuse(f"{what}.{field}", f"{os.fspath(path)!r} is not a file a run may name (save the "
                                   "host as an ssh-host block with its key and known_hosts lines)", "ssh_files")
        if accept_unknown and not self.accept_unknown_host_keys:
            raise self._refuse(f"{what}.accept_unknown_host_key", "a run may not trust a host key it has not seen: "
                               "add the host's key to known_hosts", "accept_unknown_host_keys")

    def serves(self, deployment: str) -> bool:
        """A deployment ("flow-name/deployment-name") this worker serves (``deployments/serve.py``)."""
        return any(fnmatch.fnmatchcase(deployment, p) for p in self.deployments)

    def check_results(self, root: str, what: str = "benchmark.results") -> None:
        """A results root: a path or URL inside one the policy names (no '..' to climb out; a URL with no
        credentials and no query, where options such as another endpoint would ride)."""
        shown = public_url(root)
        if ".." in PurePosixPath(root.split("://", 1)[-1]).parts:
            raise ConfigError(f"{what}: {shown!r} climbs out of its folder ('..'): give the root itself")
        if root.startswith("file://") and urlsplit(root).netloc not in ("", "localhost"):
            raise ConfigError(f"{what}: {shown!r} names a host ({urlsplit(root).netloc!r}) in a file:// URL, which "
                              "is opened as another path than it reads: give file:///absolute/path or the path")
        if "://" in root and (urlsplit(root).query or urlsplit(root).fragment or "@" in urlsplit(root).netloc):
            raise ConfigError(f"{what}: {shown!r} carries credentials or options in its URL: give the bare URL, and "
                              "the store's endpoint and keys in a specsweep-results block (its Secret fields)")
        if not _inside(root, self.results):
            raise self._refuse(what, f"{shown!r} is not a results root this worker may write", "results")


def _inside(path: str, roots: Sequence[str]) -> bool:
    """``path`` is one of ``roots`` or below one (paths made absolute and resolved; URLs compared as text)."""
    def norm(p: str) -> str:
        if "://" in p and not p.startswith("file://"):
            return p.rstrip("/")
        local = urlsplit(p).path if p.startswith("file://") else p  # as Location.open reads it
        return os.path.realpath(os.path.expanduser(local))

    target = norm(path)
    return any(target == r or target.startswith(r + "/") for r in (norm(x) for x in roots))


def policy_file() -> Path | None:
    """Where this worker's policy is (see the module's text); None for the built-in default. ConfigError where
    the administrator's choice cannot be honoured."""
    named = os.environ.get(POLICY_ENV)
    if SYSTEM_FILE.exists():
        if named is not None and os.path.realpath(os.path.expanduser(named)) != os.path.realpath(SYSTEM_FILE):
            raise ConfigError(f"{POLICY_ENV} names {named!r}, but this machine's policy is {SYSTEM_FILE}, which no "
                              f"variable overrides: unset {POLICY_ENV} on the worker (and check who set it: a run's "
                              "env job variable can)")
        return SYSTEM_FILE
    if named is not None:
        if not named.strip():
            raise ConfigError(f"{POLICY_ENV} is set but empty: name the worker's policy file, or unset it")
        file = Path(named).expanduser()
        if not file.exists():
            raise ConfigError(f"the worker's policy file {file} ({POLICY_ENV}) does not exist: create it or unset "
                              f"{POLICY_ENV}")
        return file
    return _home() / USER_FILE if (_home() / USER_FILE).exists() else None


def load(path: str | None = None) -> Policy:
    """The worker's policy: the file ``path``, else the one ``policy_file`` finds, else the built-in default."""
    file = Path(path).expanduser() if path else policy_file()
    if file is None:
        return Policy()
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"the worker's policy file {file} cannot be read: {exc}") from None
    if not text.strip():
        raise ConfigError(f"the worker's policy file {file} is empty: write its rules (an empty file is not the "
                          "built-in default), or remove it")
    try:
        data = tomllib.loads(text)
        return Policy.model_validate({**data, "source": str(file)})
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the worker's policy file {file} cannot be read: {exc}") from None
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"the worker's policy file {file} is not valid: {fields}") from None
