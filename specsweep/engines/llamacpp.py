"""llama.cpp: everything specsweep knows of it, and a real local target that runs on this CPU.

- Launch: ``llama-server -m target.gguf --host H --port P -np SLOTS -c CTX -t THREADS --metrics``;
  draft speculation adds ``-md draft.gguf --spec-type draft-simple --spec-draft-n-max N`` (``-md``
  alone loads the draft without speculating). Where the binary is not installed, ``launcher``
  serves the same flags over the xllamacpp wheel. Without model paths, ``models`` writes tiny
  llama-architecture GGUF models once per shape, kept in the user's cache between runs and clones
  (``default_models_dir``).
- Health: the port refuses connections for a moment, then ``/health`` answers 503 "Loading model",
  then 200 ``{"status":"ok"}``. SIGTERM exits at once. Its API key is read from ``LLAMA_API_KEY``.
- Metrics: ``/metrics`` with ``--metrics`` (``llamacpp:`` names).
- Per-request speculation: the last streamed event carries ``timings`` with ``draft_n`` and
  ``draft_n_accepted``.
- Version: ``/props`` with ``build_info``.
- No per-batch speculation switch: the recommendation is a threshold for a router.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from specsweep import route
from specsweep.engines import flags as f
from specsweep.engines.base import (
    Engine,
    EngineSettings,
    Kind,
    MetricNames,
    PerBatchSetting,
    Preset,
    ServerInfo,
    SpeculationSettings,
    flag,
)
from specsweep.errors import ConfigError
from specsweep.profiles import ServerProfile, make_profile
from specsweep.records import RequestRecord
from specsweep.targets.llamacpp.models import ModelSpec, make_models

DEFAULT_PORT = 8081
LAUNCHER = "specsweep.targets.llamacpp.launcher"

#: llama.cpp's --spec-type, as vLLM names the method.
_METHOD = {"draft-simple": "draft_model", "ngram-simple": "ngram", "ngram-mod": "ngram"}
#: How llama.cpp's server drafts (--spec-type): the draft model, or n-grams of the text so far.
SPEC_TYPES = tuple(_METHOD)


def default_models_dir() -> Path:
    """Where generated models are kept: $SPECSWEEP_MODELS_DIR, else the user's cache (``~/.cache/specsweep/models``),
    so that a fresh clone, the tests and the main job reuse what an earlier run wrote instead of writing it again."""
    if folder := os.environ.get("SPECSWEEP_MODELS_DIR"):
        return Path(folder)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specsweep" / "models"


def server_command() -> list[str]:
    binary = shutil.which("llama-server")
    return [binary] if binary else [sys.executable, "-m", LAUNCHER]


def _models(model_path: str | None, draft_model_path: str | None, need_draft: bool,
            layers: int | None) -> tuple[str, str | None]:
    if model_path and (draft_model_path or not need_draft):
        return model_path, draft_model_path
    spec = ModelSpec() if layers is None else ModelSpec(n_layer=layers)
    # Each shape in its own folder (named by its spec: a server may have another shape's file open, and another
    # version of specsweep may share the cache).
    where = default_models_dir() / f"llama-{spec.digest()}"
    files = make_models(where, spec)
    return model_path or str(files.target), draft_model_path or (str(files.draft) if need_draft else None)


def _profile(name: str, argv: list[str], port: int) -> ServerProfile:
    return make_profile({
        "name": name,
        "engine": "llamacpp",
        "argv": argv,
        "host": "127.0.0.1",
        "port": port,
        "health_path": "/health",
        "startup_timeout_s": 120.0,
        "health_poll_max_interval_s": 0.15,
        "kill_grace_s": 5.0,
        "api_key_env": "LLAMA_API_KEY",
        "description": "llama.cpp's server; its API key (api_key_secret) reaches it as LLAMA_API_KEY.",
    })


def _common(model: str, parallel: int, ctx: int, threads: int, poll: int = 0) -> list[str]:
    if parallel < 1 or threads < 1 or ctx < 256:
        raise ConfigError("parallel and threads must be at least 1 and ctx at least 256")
    return [*server_command(), "-m", model, "--host", "{host}", "--port", "{port}",
            "-np", str(parallel), "-c", str(ctx), "-t", str(threads), "--poll", str(poll), "--metrics"]


def baseline(
    *, model_path: str | None = None, parallel: int = 8, ctx: int = 16384, threads: int = 2,
    port: int = DEFAULT_PORT, name: str = "llamacpp-baseline", layers: int | None = None,
) -> ServerProfile:
    """``layers``: of the generated target (the draft is its first block); default 8."""
    model, _ = _models(model_path, None, need_draft=False, layers=layers)
    return _profile(name, _common(model, parallel, ctx, threads), port)


def speculative(
    *, model_path: str | None = None, draft_model_path: str | None = None, parallel: int = 8, ctx: int = 16384,
    threads: int = 2, draft_max: int = 8, draft_min: int = 0, draft_p_min: float | None = None,
    port: int = DEFAULT_PORT, name: str = "llamacpp-speculative", layers: int | None = None,
    spec_type: str = "draft-simple",
) -> ServerProfile:
    """``spec_type``: draft-simple (the draft model), or ngram-simple / ngram-mod (drafts from the text so far: no
    draft model is loaded)."""
    if spec_type not in SPEC_TYPES:
        raise ConfigError(f"spec_type must be one of {', '.join(SPEC_TYPES)} (got {spec_type!r})")
    model, draft = _models(model_path, draft_model_path, need_draft=spec_type == "draft-simple", layers=layers)
    if draft_max < 1 or not 0 <= draft_min <= draft_max:
        raise ConfigError(f"draft_max must be at least 1 and draft_min from 0 to draft_max (got {draft_max}, {draft_min})")
    drafter = ["-md", draft] if spec_type == "draft-simple" and draft else []
    argv = [*_common(model, parallel, ctx, threads), *drafter, "--spec-type", spec_type,
            "--spec-draft-n-max", str(draft_max)]
    if draft_min:
        argv += ["--spec-draft-n-min", str(draft_min)]
    if draft_p_min is not None:
        argv += ["--spec-draft-p-min", f"{draft_p_min:g}"]
    return _profile(name, argv, port)


class LlamaCppSettings(EngineSettings):
    """The local llama.cpp target: tiny generated models (built on demand) or your own GGUF files."""

    engine: Literal["llamacpp"] = Field("llamacpp", description="The engine these settings are for.")
    model_path: str | None = Field(None, description="Target GGUF; default the generated tiny model (in the user's cache).")
    draft_model_path: str | None = Field(None, description="Draft GGUF; default the generated tiny draft.")
    parallel: int = Field(8, ge=1, le=256, description="Server slots (-np): the most requests decoded together.")
    ctx: int = Field(16384, ge=256, description="Total context (-c), shared by the slots: 2,048 tokens each at 8 slots, "
                     "room for the longest MT-Bench question (1,169 tokens with the generated models' vocabulary) and "
                     "its answer.")
    threads: int = Field(2, ge=1, le=256, description="CPU threads (-t). On this 2-core machine: with one, drafting "
                         "does not pay even alone (benchmarks/cache_fit.py --threads 1); with two it pays at 1 stream "
                         "and, in most runs, at 2, and the client and Prefect take some of the cores (the rounds' "
                         "median and its distribution-free interval ride out a round the machine shifted).")
    draft_max: int = Field(8, ge=1, le=64, description="Most tokens drafted per step (--spec-draft-n-max). "
                           "With 8 (llama-server's own default is 16) the generated models accept about 61 % "
                           "on MT-Bench (5.5 tokens a step). On this 2-core machine it pays at 1 stream (x1.15-1.32) "
                           "and, in most runs, at 2 (x1.09-1.32), and at 8 verifying 9 tokens per slot costs more "
                           "than it saves (x0.80-0.92 in eight runs over two days, x0.98 in a ninth; with draft_max "
                           "4, x0.96-0.98, inside the noise); 4 streams (x1.01-1.07) is the crossover. With "
                           "draft_max 16, 8 streams lose clearly (x0.72) but 2 and 4 gain nothing (x1.02, x1.03; "
                           "1 stream x1.15).")
    draft_min: int = Field(0, ge=0, le=64, description="Fewest tokens drafted per step (--spec-draft-n-min).")
    spec_type: Literal["draft-simple", "ngram-simple", "ngram-mod"] = Field(
        "draft-simple", description="How it drafts (--spec-type): draft-simple, the draft model; ngram-simple or "
        "ngram-mod, n-grams of the text so far (no draft model). A tune grid may span them (grid.spec_type).")
    draft_p_min: float | None = Field(None, ge=0, le=1, description="Least probability of a drafted token "
                                      "(--spec-draft-p-min); default llama.cpp's own.")
    layers: int = Field(12, ge=2, le=64, description="Blocks of the generated target model (its draft is the first "
                        "one): the deeper, the cheaper the draft is next to it, the more speculation pays.")
    port: int = Field(DEFAULT_PORT, ge=1, le=65535, description="Server port.")

    @model_validator(mode="after")
    def _draft_range(self) -> LlamaCppSettings:
        if self.draft_min > self.draft_max:
            raise ValueError(f"draft_min ({self.draft_min}) must not exceed draft_max ({self.draft_max})")
        return self

    def profile(self, kind: Kind) -> ServerProfile:
        common: dict[str, Any] = dict(model_path=self.model_path, parallel=self.parallel, ctx=self.ctx,
                                      threads=self.threads, port=self.port, layers=self.layers)
        if kind == "baseline":
            return baseline(**common)
        return speculative(draft_model_path=self.draft_model_path, draft_max=self.draft_max, draft_min=self.draft_min,
                           draft_p_min=self.draft_p_min, spec_type=self.spec_type, **common)


class LlamaCpp(Engine):
    name = "llamacpp"
    label = "llama.cpp"
    launch_modules = ("specsweep.targets.llamacpp.launcher", route.MODULE)
    programs = ("llama-server",)
    env_names = ("LLAMA_API_KEY",)
    flags = {"-m": f.model, "--host": f.address, "--port": f.port, "-np": f.integer(1, 256), "-c": f.integer(256, 1 << 24),
             "-t": f.integer(1, 256), "--poll": f.integer(0, 100), "--metrics": None, "-md": f.model,
             "--spec-type": f.choice("draft-simple", "ngram-simple", "ngram-mod", "none"),
             "--spec-draft-n-max": f.integer(1, 64), "--spec-draft-n-min": f.integer(0, 64),
             "--spec-draft-p-min": f.number(0, 1),
             # specsweep route in front of the two servers (the verify stage's run of a threshold)
             "--speculative": f.loopback_url, "--baseline": f.loopback_url, "--off-from": f.integer(1, 100_000),
             "--overlap": None, "--settle-ms": f.number(0, 30)}
    file_flags = ("--chat-template-file", "--ssl-key-file", "--ssl-cert-file", "--lora", "--control-vector",
                  "--grammar-file", "--json-schema-file", "--api-key-file", "--slot-save-path", "--path",
                  "--log-file", "--media-path")
    settings = LlamaCppSettings
    grid_fields = {"spec_type": "", "draft_max": "dmax", "draft_min": "dmin", "draft_p_min": "pmin"}
    k_field = "draft_max"
    method_field = "spec_type"
    method_names = _METHOD
    default_grid = {"draft_max": [2, 4, 8]}
    no_per_batch_switch = (
        "llama.cpp cannot take a per-batch schedule: its draft settings (--spec-draft-n-max, --spec-draft-n-min, "
        "--spec-draft-p-min) hold for every batch, p-min adapts to the draft's confidence, not to the load, and its "
        "server ignores per-request draft limits (xllamacpp 2026.10 drafted as much with 'speculative.n_max': 0). Its "
        "recommendation runs as `specsweep route` in front of two servers (speculative below the threshold, "
        "baseline from it).")
    routed = True
    metrics = MetricNames(
        gauges={"running": ("llamacpp:requests_processing",), "waiting": ("llamacpp:requests_deferred",),
                "kv_cache": ("llamacpp:kv_cache_usage_ratio",)},
        counters={"prompt_tokens": ("llamacpp:prompt_tokens_total",),
                  "generation_tokens": ("llamacpp:tokens_predicted_total",),
                  "spec_drafts": ("llamacpp:spec_decode_num_drafts_total",),
                  "spec_draft_tokens": ("llamacpp:spec_decode_num_draft_tokens_total",),
                  "spec_accepted_tokens": ("llamacpp:spec_decode_num_accepted_tokens_total",)},
        per_position=("llamacpp:spec_decode_num_accepted_tokens_per_pos_total",),
    )

    def presets(self) -> Mapping[str, Preset]:
        return {
            "llamacpp-baseline": lambda model, draft, python: baseline(model_path=model),
            "llamacpp-speculative": lambda model, draft, python: speculative(model_path=model, draft_model_path=draft),
        }

    def tokenize_body(self, text: str) -> dict[str, Any] | None:
        return {"content": text, "add_special": True}

    def read_event(self, event: dict[str, Any], rec: RequestRecord) -> None:
        timings = event.get("timings")
        if isinstance(timings, dict) and "draft_n" in timings:
            rec.spec_draft_tokens = int(timings.get("draft_n") or 0)
            rec.spec_accepted_tokens = int(timings.get("draft_n_accepted") or 0)

    def speculation(self, argv: Sequence[str]) -> SpeculationSettings | None:
        draft = flag(argv, "-md", "--model-draft")
        spec_type = flag(argv, "--spec-type")
        if not draft and (not spec_type or spec_type == "none"):
            return None
        n = flag(argv, "--spec-draft-n-max", "--draft-max", "--draft")
        return SpeculationSettings(engine=self.name, method=_METHOD.get(spec_type or "draft-simple", "draft_model"),
                                   model=draft, num_speculative_tokens=int(n) if n and n.isdigit() else 16)

    async def probe(self, api: ServerInfo) -> dict[str, Any]:
        props = await api.get_json("/props")
        if not props or "build_info" not in props:
            return {}
        fp: dict[str, Any] = {"engine_version": f"llama.cpp {props['build_info']}"}
        if props.get("model_path"):
            fp["model"] = props["model_path"]
        return fp

    def per_batch_setting(self, spec: SpeculationSettings, starts: Sequence[tuple[int, int]],
                          k_max: int) -> PerBatchSetting | None:
        if spec.engine != self.name:
            return None
        off = next((batch for batch, k in starts if k == 0), None)
        if off is None:
            return PerBatchSetting(engine=self.name, notes=(
                "Keep speculation on: run the speculative server alone.",))
        return PerBatchSetting(engine=self.name, route_off_from=off, notes=(
            "llama.cpp has no per-batch speculation switch: run a speculative and a baseline server and, in front of "
            f"them, `specsweep route --port PORT --speculative URL --baseline URL --off-from {off}` (requests go "
            f"to the baseline from {off} in flight).",))


ENGINE = LlamaCpp()
