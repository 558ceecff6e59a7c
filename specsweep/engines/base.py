"""What an engine module provides: the one contract every serving engine specsweep knows fills in.

An engine is one module (``specsweep.engines.<name>``) holding everything specific to it:

    settings form        a pydantic model flows show as a form; ``profile("baseline" | "speculative")``
    presets              ready-made server profiles by CLI name (launch command, health rule, cleanup)
    grid                 the speculation fields a grid may vary, and which one is K
    metric names         its Prometheus names for the running batch, queue, KV cache and counters
    request fields       what its streamed requests ask for (per-request speculation figures)
    response fields      where a streamed answer carries speculation figures
    launch command       what a launch command says it speculates (``SpeculationSettings``)
    version probe        the engine and its version, asked of a running server
    recommendation form  the per-batch speculation setting it loads, if it has one

``specsweep.engines`` (the registry) is the only other place that names engines.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from specsweep.engines.flags import FlagTable
from specsweep.errors import ConfigError
from specsweep.profiles import ProfileParams, ServerProfile
from specsweep.records import RequestRecord


class ServerInfo(Protocol):
    """What a version probe may ask of a running server (``specsweep.server.api.ServerAPI`` is one)."""

    async def get_json(self, path: str) -> dict[str, Any] | None: ...

Kind = Literal["baseline", "speculative"]

#: The largest batch a per-batch setting covers (its last range runs to it).
MAX_BATCH = 4096


class SpeculationSettings(BaseModel):
    """What a speculative configuration drafts, read from its launch command."""

    engine: str = Field(description="The engine whose flags said so.")
    method: str = Field(description="As vLLM names it: eagle3, eagle, mtp, draft_model, ngram, ...")
    model: str | None = Field(None, description="The draft model, where there is one.")
    num_speculative_tokens: int = Field(ge=1, description="Tokens drafted per step (K; SGLang's steps).")
    eagle_topk: int | None = Field(None, description="Candidates per draft step, where the engine has them.")
    lossy_verifier: str | None = Field(None, description="A verifier that does not keep the target's outputs (its "
                                       "name, e.g. vLLM's rejection_sample_method fly): its figures are labelled so.")


@dataclass(frozen=True)
class LaunchFinding:
    """A launch command that would measure something other than it claims: the rule it breaks (a short name),
    whether it is refused (else warned about) and why, with the fix."""

    rule: str
    refused: bool
    message: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.message}"


class EngineSettings(BaseModel):
    """An engine's form: the fields flows show, and the two server profiles they make. Each form names its
    engine in ``engine`` (``Literal["<name>"]``, defaulting to it): the key flows and the command line tell
    the engines' forms apart by (``specsweep.engines.EngineSettingsParam``)."""

    model_config = ConfigDict(extra="forbid")

    engine: str = Field(description="The engine these settings are for.")

    def profile(self, kind: Kind) -> ServerProfile:
        raise NotImplementedError


class PerBatchSetting(BaseModel):
    """A recommendation in the form an engine loads: a file, the flags that load it, and notes."""

    engine: str
    file_name: str | None = Field(None, description="The file the engine loads (None: the engine has no switch).")
    content: Any = Field(None, description="The file's JSON content.")
    flags: str | None = Field(None, description="The launch flags that load it.")
    route_off_from: int | None = Field(
        None, ge=1, description="For an engine without a per-batch switch: the requests in flight from which "
        "`specsweep route`, in front of a speculative and a baseline server, sends requests to the baseline.")
    notes: tuple[str, ...] = ()
    status: str | None = Field(None, description="The answer it carries: decided, or best available.")
    worst_case_loss: float | None = Field(None, description="The answer's bound: the throughput it may give up at "
                                          "some level against the better fixed policy (None: unbounded).")


@dataclass(frozen=True)
class MetricNames:
    """An engine's Prometheus names for specsweep's vocabulary (``specsweep.server.engine_metrics``).
    Where it serves one quantity under several names (old and new), the first listed wins."""

    gauges: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # running, waiting, kv_cache
    counters: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    per_position: tuple[str, ...] = ()  # accepted tokens per draft position (label "position")


Preset = Any  # a callable (model_path, draft_model_path, python) -> ServerProfile


class Engine:
    """One serving engine. Subclasses set the class attributes and override what their engine has."""

    name: ClassVar[str]
    label: ClassVar[str]
    settings: ClassVar[type[EngineSettings]]
    #: The speculation fields a grid may vary, each with its short name in point labels.
    grid_fields: ClassVar[Mapping[str, str]]
    #: The field that is the engine's K (tokens drafted per step): what the per-batch forms carry.
    k_field: ClassVar[str]
    #: The field that names how it speculates (n-gram, a draft model, EAGLE-3, ...): a grid may span its values, and
    #: its answer then says the best method and setting per batch range. None: one method per launch only.
    method_field: ClassVar[str | None] = None
    #: The method field's values in the shared names (``SpeculationSettings.method``: draft_model, ngram, eagle3...).
    method_names: ClassVar[Mapping[str, str]] = {}
    default_grid: ClassVar[Mapping[str, list[int | float]]]
    metrics: ClassVar[MetricNames] = MetricNames()
    #: Added to every streamed OpenAI request body.
    request_fields: ClassVar[Mapping[str, Any]] = {}
    #: Its endpoint (POST) that empties the prefix cache between blocks; None where it has none (the prompts are
    #: then made unique per block).
    cache_reset: ClassVar[str | None] = None
    #: What it can take of a recommendation: None when one server can run the per-batch setting (the verify
    #: stage runs it); else why not, in a sentence.
    no_per_batch_switch: ClassVar[str | None] = None
    #: Without a per-batch switch, whether its recommendation runs as two servers behind ``specsweep route`` (the
    #: verify stage then runs that).
    routed: ClassVar[bool] = False
    #: The Python modules its presets launch (``python -m MODULE``): what a worker's default policy lets it start
    #: (specsweep's own under this interpreter or the checkout's .venv, the engine's under ``python``/``python3``).
    launch_modules: ClassVar[tuple[str, ...]] = ()
    #: Environment names (fnmatch patterns) of its own that a worker's default policy passes on.
    env_names: ClassVar[tuple[str, ...]] = ()
    #: Programs (file names) that are its server without ``python -m`` (llama.cpp's ``llama-server``).
    programs: ClassVar[tuple[str, ...]] = ()
    #: The flags its presets and settings form produce, each with the check of its value (``engines.flags``):
    #: what a worker's policy passes without naming them. Any other flag passes only where the policy names it.
    flags: ClassVar[FlagTable] = {}
    #: Flags whose value is a file its server reads or loads (templates, configs, plugins, keys): only inside the
    #: folders a worker's policy names (``arg_files``), whoever allowed the flag itself.
    file_flags: ClassVar[tuple[str, ...]] = ()
    #: Flags that make its server run code of the model's or the request's choosing: refused by a worker's
    #: default policy, in any spelling its parser takes.
    code_flags: ClassVar[tuple[str, ...]] = ("--trust-remote-code",)
    #: Its own speculation controller, named for people (None: it has none): the verify stage's fourth arm starts
    #: the speculative profile with it (``controller_setting``) beside off, on and the measured schedule.
    controller: ClassVar[str | None] = None
    #: Why its per-batch setting may cost speed even where it runs the same K as always-on (None: no known cost):
    #: the verify stage then reports the setting against always-on at the lowest level on its own.
    per_batch_cost: ClassVar[str | None] = None
    #: Where (GET, JSON) its controller's active tier is shown while it runs (``specsweep.server.controller_state``).
    tier_at: ClassVar[str | None] = None

    def presets(self) -> Mapping[str, Preset]:
        return {}

    def tokenize_body(self, text: str) -> dict[str, Any] | None:
        """The body its ``POST /tokenize`` takes for ``text``; None where it has no /tokenize."""
        return None
    def read_event(self, event: dict[str, Any], rec: RequestRecord) -> None:
        """Take the speculation figures a streamed event carries into the request's record."""

    def speculation(self, argv: Sequence[str]) -> SpeculationSettings | None:
        """What a launch command speculates; None when it does not (or is not this engine's)."""
        return None

    def check_launch(self, argv: Sequence[str]) -> list[LaunchFinding]:
        """What is wrong with a launch command before it starts (nothing: an empty list)."""
        return []

    async def probe(self, api: ServerInfo) -> dict[str, Any]:
        """The engine and its version (and the server settings that matter), from a running server."""
        return {}

    def per_batch_setting(self, spec: SpeculationSettings, starts: Sequence[tuple[int, int]],
                          k_max: int) -> PerBatchSetting | None:
        """The recommendation (K from each batch size in ``starts``; 0: off) in the form this engine
        loads; None when it has no per-batch switch."""
        return None

    def controller_setting(self, argv: Sequence[str], config: Mapping[str, Any] | None = None) -> PerBatchSetting | None:
        """How to start the speculative launch command ``argv`` with the engine's own controller (with its default
        configuration, or the user's ``config`` in the engine's own keys): flags (and a file) that replace the
        profile's own, as ``with_setting`` applies them. None where it has no controller; a setting without flags
        (its notes say why) where this launch cannot run it."""
        return None

    def controller_tier(self, info: dict[str, Any]) -> int | None:
        """Its controller's active tier (draft steps) in the answer at ``tier_at``; None where the server does not
        run its controller."""
        return None

    def __repr__(self) -> str:
        return f"<engine {self.name}>"


# -- helpers the engine modules share ------------------------------------------------------------


def flag(argv: Sequence[str], *names: str) -> str | None:
    """The value of a flag (``--name VALUE`` or ``--name=VALUE``) in a launch command."""
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def split_command(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def ranges(starts: Sequence[tuple[int, int]]) -> list[list[int]]:
    """[first, last, K] per range from (first batch size, K) pairs, the first at 1: each range runs to
    just below the next one's start, the last to the largest batch."""
    return [[start, starts[i + 1][0] - 1 if i + 1 < len(starts) else MAX_BATCH, k]
            for i, (start, k) in enumerate(starts)]


#: What a profile that runs a recommendation is called: the speculative profile's name and this.
AS_RECOMMENDED = "-as-recommended"
#: What a profile that runs the engine's own controller is called: the speculative profile's name and this.
OWN_CONTROLLER = "-own-controller"


def _flag_groups(args: Sequence[str]) -> list[list[str]]:
    """A command's flags with their values: [["--a", "1"], ["--switch"], ...] (positional words before the
    first flag form a group of their own)."""
    groups: list[list[str]] = []
    for arg in args:
        if arg.startswith("--") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return groups


P = TypeVar("P", bound=ProfileParams)


def with_setting(profile: P, setting: PerBatchSetting, file_path: str | None = None,
                 suffix: str = AS_RECOMMENDED) -> P:
    """The speculative ``profile`` started with the recommendation: each of the setting's flags replaces the
    profile's own (or is added), the setting's file named by ``file_path`` (where the file was written on the
    host). A setting without flags is an engine without a per-batch switch: ConfigError."""
    if not setting.flags:
        raise ConfigError(f"{setting.engine} has no per-batch speculation switch: its recommendation is a rule for a "
                          "router (one deployment per setting), and there is no single server to run it on")
    new = split_command(setting.flags)
    if setting.file_name and setting.file_name in new:
        if file_path is None:
            raise ConfigError(f"the recommendation's file {setting.file_name} must be written on the host first")
        new = [file_path if a == setting.file_name else a for a in new]
    groups = _flag_groups(profile.argv)
    for group in _flag_groups(new):
        at = next((i for i, g in enumerate(groups) if g[0] == group[0]), None)
        if at is None:
            groups.append(group)
        else:
            groups[at] = group
    return profile.model_copy(update={"name": profile.name + suffix, "argv": [a for g in groups for a in g]})


def compact_json(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"))
