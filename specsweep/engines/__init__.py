"""The engines specsweep knows, by name: the only place besides each engine's own module that names them.

Adding an engine is one new module (``specsweep.engines.<name>``, an ``Engine`` of ``base``) and one
line here (or ``register(ENGINE)`` from elsewhere: a plugin, a test). Everything else asks this registry
when it runs, so an engine registered later is known everywhere from then on: a profile's ``engine``
names its entry; ``custom`` profiles (any other server) are read with every engine's rules; the flows'
and the command line's engine settings (``EngineSettingsParam``) are the form of the engine they name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import CoreSchema, core_schema

from specsweep.engines.base import (
    OWN_CONTROLLER,
    Engine,
    EngineSettings,
    LaunchFinding,
    MetricNames,
    PerBatchSetting,
    ServerInfo,
    SpeculationSettings,
    split_command,
    with_setting,
)
from specsweep.engines.llamacpp import ENGINE as LLAMACPP
from specsweep.engines.sglang import ENGINE as SGLANG
from specsweep.engines.vllm import ENGINE as VLLM
from specsweep.errors import ConfigError
from specsweep.profiles import ProfileParams, ServerProfile
from specsweep.records import RequestRecord

if TYPE_CHECKING:
    from specsweep.analysis.decision import DecisionConfig

ENGINES: dict[str, Engine] = {}
CUSTOM = "custom"


def register(engine: Engine) -> Engine:
    """Add ``engine`` to the registry (from then on every flow, command and rule knows it); it is returned."""
    field = engine.settings.model_fields.get("engine")
    if field is None or field.default != engine.name:
        raise ConfigError(f"{engine.settings.__name__}.engine must default to the engine's name {engine.name!r} "
                          f"(engine: Literal[{engine.name!r}] = Field({engine.name!r}, ...)): it is the key the "
                          "engines' settings are told apart by")
    if engine.name == CUSTOM or ENGINES.get(engine.name, engine) is not engine:
        raise ConfigError(f"an engine named {engine.name!r} is known already: give the new engine another name")
    ENGINES[engine.name] = engine
    return engine


for _engine in (SGLANG, VLLM, LLAMACPP):
    register(_engine)

#: The engine of the main job: llama.cpp on this machine's CPU with generated models, so its settings need no field.
LOCAL: Engine = LLAMACPP


def local_settings() -> EngineSettings:
    """The main job's engine settings: the local llama.cpp's defaults."""
    return LOCAL.settings.model_validate({})


def get(name: str, what: str = "engine") -> Engine:
    """The engine of this name; a ConfigError naming the field otherwise."""
    if name not in ENGINES:
        raise ConfigError(f"{what} {name!r} is not an engine specsweep knows: choose one of {', '.join(ENGINES)}")
    return ENGINES[name]


def check_name(name: str, what: str = "engine") -> None:
    if name != CUSTOM:
        get(name, f"{what} (or {CUSTOM})")


def of_settings(settings: EngineSettings) -> Engine:
    """The engine whose form ``settings`` is."""
    for engine in ENGINES.values():
        if isinstance(settings, engine.settings):
            return engine
    raise ConfigError(f"{type(settings).__name__} is not the settings of an engine specsweep knows")


def settings_from(value: Any) -> EngineSettings:
    """An engine's settings from a flow parameter or a JSON object: the form of the engine its ``engine``
    names, looked up now (an engine registered after this module was imported is one). ValueError (with
    pydantic's errors, which name the field) otherwise."""
    names = ", ".join(ENGINES)
    if isinstance(value, EngineSettings):
        if not any(isinstance(value, e.settings) for e in ENGINES.values()):
            raise ValueError(f"{type(value).__name__} is not the settings of an engine specsweep knows ({names})")
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"give the engine's settings as an object naming its engine, e.g. {{\"engine\": "
                         f"\"{LOCAL.name}\"}} (engines: {names})")
    name = value.get("engine")
    if name is None:
        raise ValueError(f"engine is missing: name the engine these settings are for, one of {names}")
    if name not in ENGINES:
        raise ValueError(f"engine {name!r} is not an engine specsweep knows: choose one of {names}")
    return ENGINES[name].settings.model_validate(dict(value))


class _ByEngine:
    """How pydantic (and so Prefect) reads an ``EngineSettingsParam``: validated by ``settings_from`` when a
    value arrives; described, in a flow's parameter schema, as the registered engines' forms keyed on
    ``engine`` (the UI's form per engine)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        forms = {name: handler.generate_schema(e.settings) for name, e in ENGINES.items()}
        return core_schema.no_info_plain_validator_function(
            settings_from, json_schema_input_schema=core_schema.tagged_union_schema(forms, discriminator="engine"),
            serialization=core_schema.plain_serializer_function_ser_schema(_dump, info_arg=True))


def _dump(settings: EngineSettings, info: core_schema.SerializationInfo) -> dict[str, Any]:
    return settings.model_dump(mode=info.mode)


#: A flow parameter (or any pydantic field) holding one engine's settings, keyed on ``engine``.
EngineSettingsParam = Annotated[EngineSettings, _ByEngine()]


def check_verifiable(name: str, what: str = "decision.verify") -> None:
    """Refuse the verify stage for an engine that can run a per-batch setting neither itself nor behind
    ``specsweep route``, saying why."""
    if name in ENGINES and (why := ENGINES[name].no_per_batch_switch) and not ENGINES[name].routed:
        raise ConfigError(f"{what}: {why} Leave verify off for {ENGINES[name].label}.")


def tier_reader(name: str) -> tuple[str, Callable[[dict[str, Any]], int | None]] | None:
    """Where the engine shows its own controller's active tier and how to read it from the answer (None: nowhere,
    or not an engine specsweep knows)."""
    engine = ENGINES.get(name)
    return (engine.tier_at, engine.controller_tier) if engine is not None and engine.tier_at else None


def controller_setting(profile: ProfileParams, decision: DecisionConfig,
                       what: str = "decision.verify_controller") -> PerBatchSetting | None:
    """How the verify stage starts the speculative profile with its engine's own controller (the fourth arm), or
    None where that arm does not run: turned off, or (left to its default) an engine without a controller or a
    launch it cannot take. ``verify_controller: true`` where it cannot run: a ConfigError saying why."""
    if decision.verify_controller is False:
        return None
    engine = ENGINES.get(profile.engine)
    setting = engine.controller_setting(profile.argv, decision.controller_config) \
        if engine is not None and engine.controller else None
    if setting is None or not setting.flags:
        if decision.verify_controller:
            why = (" ".join(setting.notes) if setting is not None else
                   f"{engine.label if engine else profile.engine} has no speculation controller of its own specsweep "
                   "knows.")
            raise ConfigError(f"{what}: {why} Leave verify_controller unset (or false) for this profile.")
        return None
    return setting


def check_controller(profile: ProfileParams, decision: DecisionConfig) -> list[LaunchFinding]:
    """Before anything runs: the verify stage's fourth arm as it will start (``controller_setting``), checked by its
    engine's launch rules (a ConfigError naming every refused rule, e.g. a per-batch table under data
    parallelism); the warnings returned. Nothing where the arm does not run."""
    setting = controller_setting(profile, decision)
    if setting is None:
        return []
    started = with_setting(profile, setting, setting.file_name, OWN_CONTROLLER)  # the file's name stands for its path
    return check_launch(started, "decision.controller_config")


def check_launch(profile: ProfileParams, what: str = "profile") -> list[LaunchFinding]:
    """Check a profile's launch command by its engine's rules before any host is touched: a ConfigError naming
    every refused rule; the warnings returned (for the run's log and report)."""
    if profile.engine not in ENGINES:
        return []
    findings = ENGINES[profile.engine].check_launch(profile.argv)
    refused = [f for f in findings if f.refused]
    if refused:
        raise ConfigError(f"{what} ({profile.name}) is refused: " + "; ".join(str(f) for f in refused))
    return findings


def _known_or_all(name: str) -> list[Engine]:
    return [ENGINES[name]] if name in ENGINES else list(ENGINES.values())


# -- presets ---------------------------------------------------------------------------------------


def preset_names() -> list[str]:
    return [name for engine in ENGINES.values() for name in engine.presets()]


def preset(name: str, *, model_path: str | None = None, draft_model_path: str | None = None,
           python: str | None = None) -> ServerProfile:
    """A ready-made profile by its CLI name. ``python``: the interpreter that runs the engine on the host."""
    for engine in ENGINES.values():
        make = engine.presets().get(name)
        if make is not None:
            profile: ServerProfile = make(model_path, draft_model_path, python)
            return profile
    raise ConfigError(f"unknown preset {name!r}: choose one of {', '.join(preset_names())}")


# -- what requests ask for and answers carry -------------------------------------------------------


def request_fields(name: str) -> dict[str, Any]:
    """What every streamed request to this engine adds to its body."""
    return dict(ENGINES[name].request_fields) if name in ENGINES else {}


def cache_resets(name: str) -> list[str]:
    """The endpoints that empty this engine's prefix cache (every engine's for a server of unknown kind)."""
    return [e.cache_reset for e in _known_or_all(name) if e.cache_reset]


class EventReader:
    """Takes the speculation figures of streamed events into a request's record: the engine's own
    fields, or every engine's for a server of unknown kind."""

    __slots__ = ("readers",)

    def __init__(self, name: str) -> None:
        self.readers = [e.read_event for e in _known_or_all(name) if type(e).read_event is not Engine.read_event]

    def __call__(self, event: dict[str, Any], rec: RequestRecord) -> None:
        for read in self.readers:
            read(event, rec)


def tokenize_bodies() -> list[Callable[[str], dict[str, Any] | None]]:
    """The bodies of ``POST /tokenize`` the engines take, one maker each (a server of unknown kind is asked
    in each form until one answers sensibly)."""
    return [e.tokenize_body for e in ENGINES.values() if e.tokenize_body("") is not None]


def metric_names() -> list[MetricNames]:
    return [e.metrics for e in ENGINES.values()]


# -- launch commands, versions, recommendations ---------------------------------------------------


def speculation_of(command: str | None, engine: str = CUSTOM) -> SpeculationSettings | None:
    """What a launch command (secrets masked, as a run records it) speculates, read by its engine's rules."""
    if not command:
        return None
    argv = split_command(command)
    for e in _known_or_all(engine):
        if (spec := e.speculation(argv)) is not None:
            return spec
    return None


async def probe(api: ServerInfo, engine: str = CUSTOM) -> dict[str, Any]:
    """The engine and its version as the server says them (every engine's way, for an unknown kind)."""
    for e in _known_or_all(engine):
        if found := await e.probe(api):
            return found
    return {}


def per_batch_setting(spec: SpeculationSettings, starts: Sequence[tuple[int, int]],
                      k_max: int) -> PerBatchSetting | None:
    """The recommendation in the form the measured engine loads (None: it has none)."""
    return ENGINES[spec.engine].per_batch_setting(spec, starts, k_max) if spec.engine in ENGINES else None


__all__ = ["CUSTOM", "ENGINES", "LOCAL", "Engine", "EngineSettings", "EngineSettingsParam", "EventReader",
           "LaunchFinding", "PerBatchSetting", "SpeculationSettings", "check_launch", "check_name", "get",
           "local_settings", "metric_names", "of_settings", "per_batch_setting", "preset", "preset_names", "probe",
           "register", "request_fields", "settings_from", "speculation_of"]
