"""Server profiles: one server configuration, validated before anything touches a host.

A profile is what ``specsweep server ... --profile FILE`` reads (JSON or TOML) and what
the flows take as a parameter: the same pydantic model either way.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from specsweep import bounded_regex
from specsweep.errors import ConfigError
from specsweep.redact import Redactor, mask_argv, mask_env, refuse_key_parameter, secrets_in_argv, secrets_in_env

#: An environment variable's name, as the start script may export it (one pattern for every check of one).
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"


def is_env_name(name: str) -> bool:
    return re.fullmatch(ENV_NAME, name) is not None


#: Set in every server's environment; inherited by all its descendants, even those that
#: leave its session, so a kill finds them all (and leftovers of earlier runs). A kill takes
#: only processes that carry it and belong to the login user: nothing else is ever touched.
MARKER_ENV = "SPECSWEEP_SERVER_PORT"
#: A token of one start, also in the server's environment: what the final kill and the cleanup
#: hooks take (the server this run started, not another run's on the same port).
START_ENV = "SPECSWEEP_START"

#: Where server logs go by default: a directory of the SSH user's own (0700).
DEFAULT_LOG_DIR = "~/.specsweep/logs"
#: Where a start's private temporary folder goes (``private_tmp_env``), removed by the kill.
DEFAULT_TMP_DIR = "~/.specsweep/tmp"

# Command lines a cleanup pattern must not all match: a pattern that does takes every process.
_UNRELATED_COMMANDS = ("x", "0", "sleep 1", "/usr/sbin/sshd -D", "-bash", "python3 train.py --epochs 3")

class ProfileParams(BaseModel):
    """One server configuration as flows take it: everything but the API key itself, which
    would show in the Prefect UI as a parameter. Flows read it from the Secret block named
    in ``api_key_secret``; ``ServerProfile`` adds the key."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        description="Short name of this configuration, used in logs, results and file names.",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        max_length=80,
    )
    engine: str = Field("custom", pattern=r"^[a-z0-9_-]+$", description="Serving engine: one specsweep knows "
                        "(``specsweep preset`` lists their presets), or custom for any other server.")
    description: str = Field("", max_length=1000, description="What this configuration is, for people (and how the "
                             "engine takes its API key, where that matters).")
    argv: list[str] = Field(
        description="Launch command as a list of arguments (never a shell string). "
        "{host}, {port} and {api_key} are replaced by the fields of the same name.",
        min_length=1,
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment variables, e.g. CUDA_VISIBLE_DEVICES or NCCL_* tuning.",
    )
    env_secrets: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables whose values are read from Prefect Secret blocks when a flow runs, "
        "e.g. {\"HF_TOKEN\": \"hf-token\"} (variable: block name): the value never becomes a parameter.",
    )
    cwd: str | None = Field(None, description="Working directory on the host; default the login directory.")
    host: str = Field("127.0.0.1", description="Address the server binds to ({host} in argv).", min_length=1)
    port: int = Field(30000, ge=1, le=65535, description="TCP port the server listens on ({port} in argv).")
    health_path: str = Field("/health", description="Path whose HTTP 200 means the server is ready.")
    readiness_probe: bool = Field(
        False, description="After /health answers 200, also require one tiny generation to succeed."
    )
    probe_path: str = Field("/v1/completions", description="Endpoint the readiness probe posts a 1-token request to.")
    startup_timeout_s: float = Field(
        600.0, gt=0, le=6 * 3600, description="How long the server may take to become ready."
    )
    health_poll_max_interval_s: float = Field(
        0.15, gt=0, le=60, description="Health polls start 50 ms apart and slow down to this interval (readiness "
        "is noticed within about half of it, on average)."
    )
    cleanup_patterns: list[str] = Field(
        default_factory=list,
        description="Regular expressions that narrow the leftover kill before a start: of the processes specsweep "
        "started for this port (they carry its marker and belong to the SSH user), only those whose command line "
        "matches one are taken (e.g. 'engine::' and 'engine\\.server'). They never add a process specsweep "
        "did not start; a pattern that matches any command line is refused. Each sees the first 4096 characters of a "
        "command line; at most 16, of 200 characters, with at most one repeat (*, +, {m,n}), of one character, class "
        "or '.' (so none can hold the worker). Empty: every such leftover.",
    )
    api_key_secret: str | None = Field(
        None, description="Name of a Prefect Secret block holding the server's API key (sent as a bearer token, "
        "and given to the server in api_key_env). Flows read it at run time, so the key never becomes a parameter."
    )
    api_key_env: str | None = Field(
        None, description="Environment variable the engine reads its API key from (each engine's presets set it): "
        "the key reaches the server through its environment, which no other user can read. "
        "{api_key} in argv also works, for an engine that only takes a flag (--api-key), but then every "
        "user of the host sees the key in ps.",
        pattern=f"^{ENV_NAME}$",
    )
    private_tmp_env: list[str] = Field(
        default_factory=list,
        description="Environment variables each start points at a temporary folder of its own "
        "(~/.specsweep/tmp/<port>-<start token> on the host, private to the login), removed once the server is "
        "killed: for an engine that leaves sockets or files there at every start and never removes them (the "
        "presets of such an engine name its variable). TMPDIR moves everything the server puts in the temporary "
        "folder, including what an engine shares between its processes there (download locks, caches).",
        max_length=8,
    )
    kill_grace_s: float = Field(10.0, ge=0, le=600, description="Time between SIGTERM and SIGKILL.")
    gpu_memory_free_mib: int = Field(
        2048, ge=0,
        description="After a kill, the killed processes must hold less than this many MiB of GPU memory together "
        "(nvidia-smi's compute apps, where it exists); what other processes hold on the same GPUs is theirs.",
    )
    gpu_memory_timeout_s: float = Field(120.0, ge=0, le=3600, description="How long GPU memory may take to be released.")

    @field_validator("argv")
    @classmethod
    def _argv(cls, argv: list[str]) -> list[str]:
        if not argv[0].strip():
            raise ValueError("argv[0] (the program) is empty")
        if "=" in argv[0]:
            raise ValueError("argv[0] must be a program, not NAME=VALUE: put environment variables in env")
        return argv

    @field_validator("env", "env_secrets")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            if not is_env_name(key):
                raise ValueError(f"environment variable name {key!r} is not valid: use letters, digits and _")
            if key in (MARKER_ENV, START_ENV):
                raise ValueError(f"{key} is set by specsweep itself")
        return env

    @field_validator("private_tmp_env")
    @classmethod
    def _private_tmp_env(cls, names: list[str], info: ValidationInfo) -> list[str]:
        cls._env(dict.fromkeys(names, ""))  # valid names, none of specsweep's own
        for name in names:
            if name in (info.data.get("env") or {}):
                raise ValueError(f"{name} is also set in env: name it in one place only")
        return names

    @field_validator("cleanup_patterns")
    @classmethod
    def _patterns(cls, patterns: list[str]) -> list[str]:
        import re

        bounded_regex.check(patterns, "cleanup pattern")
        for p in patterns:
            if not p.strip() or all(re.search(p, cmd) for cmd in _UNRELATED_COMMANDS):
                raise ValueError(f"cleanup pattern {p!r} matches any command line: give one that names the "
                                 "server's own processes, e.g. 'engine::'")
        return patterns

    @field_validator("health_path", "probe_path")
    @classmethod
    def _path(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(f"{path!r} must start with '/'")
        return path

    @model_validator(mode="before")
    @classmethod
    def _no_key_in_parameters(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("log_path"):
            raise ValueError(f"log_path is not taken: each start logs to a fresh file of its own in {DEFAULT_LOG_DIR} on "
                             "the host, private to the login (the run's log names it); leave log_path out")
        if isinstance(data, dict) and "log_path" in data:  # null, as older saved profiles have it
            data = {k: v for k, v in data.items() if k != "log_path"}
        return refuse_key_parameter(data, "a flow's profile") if cls is ProfileParams else data


class ServerProfile(ProfileParams):
    """One server configuration: how to launch it, where it listens, how to tell it is ready."""

    api_key: SecretStr | None = Field(None, description="API key of the server ({api_key} in argv); sent as a bearer token.")

    def as_parameters(self) -> dict[str, Any]:
        """The profile as a flow parameter (JSON): without the API key, which flows read from
        the Secret block named in ``api_key_secret``."""
        return self.model_dump(mode="json", exclude={"api_key"})

    # -- derived values ---------------------------------------------------------------------

    def log_file(self, token: str, attempt: int = 1) -> str:
        """Where one start logs on the host: a fresh file in the login's private log folder (``~/...``); a start
        sent again (its first answer lost) logs to its own file beside the first."""
        again = f"-{attempt}" if attempt > 1 else ""
        return f"{DEFAULT_LOG_DIR}/{self.name}-{self.port}-{token[:12]}{again}.log"

    def tmp_dir(self, token: str) -> str | None:
        """One start's private temporary folder on the host (``~/...``; ``private_tmp_env``), or None where it gets
        none: its port and its token, whichever attempt sent it. Short: a Unix socket's path has at most 107 bytes."""
        return f"{DEFAULT_TMP_DIR}/{self.port}-{token[:12]}" if self.private_tmp_env else None

    def launch_argv(self) -> list[str]:
        """argv with placeholders filled in. Plain replacement, so JSON arguments keep their braces."""
        values = {
            "{host}": self.host,
            "{port}": str(self.port),
            "{api_key}": self.api_key.get_secret_value() if self.api_key else "",
        }
        out = []
        for arg in self.argv:
            for key, value in values.items():
                arg = arg.replace(key, value)
            out.append(arg)
        return out

    def env_names(self) -> dict[str, str]:
        """Every environment name the profile sets for its server (values of secrets left out), its private
        temporary folders' too (a name there points a library at a folder as surely as one in env): the policy's
        business."""
        names = {**self.env, **dict.fromkeys(self.env_secrets, ""), **dict.fromkeys(self.private_tmp_env, "")}
        if self.api_key_env:
            names[self.api_key_env] = ""
        return names

    def launch_env(self, token: str = "") -> dict[str, str]:
        """The server's environment: the profile's, the API key where the engine reads it, the markers.
        (The start sends it on stdin: nothing of it is on a command line.)"""
        key = {self.api_key_env: self.api_key.get_secret_value()} if self.api_key_env and self.api_key else {}
        return {**self.env, **key, MARKER_ENV: str(self.port), **({START_ENV: token} if token else {})}

    @property
    def key_on_command_line(self) -> bool:
        """The API key is an argument of the server (the engine takes it only as a flag): visible in ps."""
        return self.api_key is not None and any("{api_key}" in a for a in self.argv)

    def redactor(self) -> Redactor:
        argv = self.launch_argv()
        return Redactor(
            [
                *(s for s in [self.api_key.get_secret_value() if self.api_key else None] if s),
                *secrets_in_argv(argv),
                *secrets_in_env(self.env),
                *(self.env[k] for k in self.env_secrets if self.env.get(k)),
            ]
        )

    def masked_command(self) -> str:
        redact = self.redactor()
        return redact(shlex.join(mask_argv(self.launch_argv())))

    def masked_env(self) -> dict[str, str]:
        redact = self.redactor()
        return {k: redact(v) for k, v in mask_env(self.env).items()}


def describe_validation_error(exc: ValidationError, what: str) -> str:
    """One line per bad field: where it is, what is wrong, what was given."""
    lines = [f"invalid {what}:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field: remove it or check its spelling"
        elif err["type"] == "missing":
            msg = "required field is missing: add it"
        given = err.get("input")
        shown = "" if err["type"] in ("missing", "extra_forbidden") or isinstance(given, dict) else f" (got {given!r})"
        if "api_key" in loc or "key" in loc.split(".")[-1] or "passphrase" in loc:
            shown = ""
        lines.append(f"  {loc}: {msg}{shown}")
    return "\n".join(lines)


def read_mapping(path: Path) -> dict[str, Any]:
    """A JSON or TOML file as a dict, with a clear error when it is neither."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"profile file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"profile file {path} is not UTF-8 text") from None
    try:
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
        raise ConfigError(f"profile file {path} is not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"profile file {path} must hold an object (a table of fields), not {type(data).__name__}")
    return data


def load_profile(path: Path | None = None, /, **overrides: Any) -> ServerProfile:
    """Read a profile file, apply overrides (``port=8001``), and validate the result."""
    data = read_mapping(path) if path is not None else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    return make_profile(data, what=f"server profile{f' {path}' if path else ''}")


def make_profile(data: dict[str, Any], what: str = "server profile") -> ServerProfile:
    try:
        return ServerProfile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, what)) from None
