"""SGLang: everything specsweep knows of it, and its simulator (``sim``) for rehearsals.

- Launch: ``python -m sglang.launch_server --model-path M --host H --port P --tp N``; EAGLE-3 with
  ``--speculative-algorithm EAGLE3 --speculative-draft-model-path D --speculative-num-steps S
  --speculative-eagle-topk K --speculative-num-draft-tokens N`` (with topk 1, N = S + 1).
- Health: ``/health`` answers 503 while it loads and warms up, then 200 with an empty body; the
  status is the rule, never the body. ``--host`` defaults to 127.0.0.1 (reached over SSH).
- Metrics: ``/metrics`` with ``--enable-metrics`` (running and queued requests, token usage).
- Per-request speculation: the OpenAI endpoints answer ``sglext.spec_tokens_details`` when asked
  with ``return_spec_tokens_details``; the native ``/generate`` puts ``spec_verify_ct`` in ``meta_info``.
- Version: ``/server_info`` (older: ``/get_server_info``) with ``version`` and the server arguments.
- Per-batch speculation (0.5.23): ``--speculative-adaptive --speculative-adaptive-config FILE``, a
  JSON object keyed by batch size (strings), each ``{"candidate_steps": [ints >= 0]}``; a batch uses
  the entry with the largest key <= its size; 0 steps is no speculation. EAGLE/EAGLE3 with topk 1
  only. SGLang refuses a file with no integer key or a candidate list that is not non-negative ints.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, model_validator

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

#: SGLang's launcher and its scheduler and detokenizer processes (they rename themselves
#: "sglang::scheduler_TP0" and the like, and can outlive the launcher), and the simulator's
#: launcher: the leftover kill takes marked processes of these names only.
CLEANUP = [r"sglang::", r"sglang\.launch_server", r"-m specsweep\.targets\.sim\b"]
SIM_MODULE = "specsweep.targets.sim"
ADAPTIVE_FILE = "sglang-adaptive-config.json"
#: The user's config of SGLang's own controller, written on the host for the verify stage's fourth arm.
CONTROLLER_FILE = "sglang-adaptive-controller.json"
_METHOD = {"EAGLE3": "eagle3", "EAGLE": "eagle", "NEXTN": "mtp", "MTP": "mtp"}


def baseline(
    model_path: str,
    *,
    tp: int = 8,
    name: str = "sglang-baseline",
    port: int = 30000,
    host: str = "127.0.0.1",
    python: str = "python",
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    simulate: bool = False,
    sim_profile: str = "kimi-k2.5-int4-8x-rtx-pro-6000",
    sim_startup_s: float = 3.0,
) -> ServerProfile:
    """SGLang without speculation. ``simulate`` runs specsweep's SGLang simulator with the same flags.
    ``--enable-metrics``: the running batch, queue and KV-cache use are read from /metrics per level."""
    if not model_path:
        raise ConfigError("model_path is required for the SGLang presets: give the target model's path or hub id")
    if tp < 1:
        raise ConfigError(f"tp must be at least 1 (got {tp})")
    module = ([SIM_MODULE, "--sim-profile", sim_profile, "--startup-s", f"{sim_startup_s:g}"] if simulate
              else ["sglang.launch_server"])
    argv = [python if not simulate or python != "python" else sys.executable, "-m", *module, "--model-path", model_path,
            "--host", "{host}", "--port", "{port}", "--tp", str(tp), "--enable-metrics", *extra_args]
    return make_profile({
        "name": name,
        "engine": "sglang",
        "argv": argv,
        "env": env or {},
        "host": host,
        "port": port,
        "health_path": "/health",
        "startup_timeout_s": 1800.0,
        "health_poll_max_interval_s": 0.2,
        "cleanup_patterns": CLEANUP,
        "probe_path": "/generate",
        "description": "SGLang. It takes an API key only as a flag (add --api-key {api_key} to argv), which every "
        "user of the host can read with ps: prefer no key on a host's loopback, reached over SSH.",
    })


def eagle3(
    model_path: str,
    draft_model_path: str,
    *,
    num_steps: int = 3,
    eagle_topk: int = 1,
    num_draft_tokens: int | None = None,
    name: str = "sglang-eagle3",
    extra_args: Sequence[str] = (),
    **kwargs: Any,
) -> ServerProfile:
    """SGLang with EAGLE-3 speculative decoding. With topk 1, draft tokens = steps + 1."""
    if not draft_model_path:
        raise ConfigError("draft_model_path is required for EAGLE-3: give the EAGLE-3 draft model's path or hub id")
    if num_steps < 1 or eagle_topk < 1:
        raise ConfigError(f"num_steps and eagle_topk must be at least 1 (got {num_steps}, {eagle_topk})")
    if num_draft_tokens is None:
        num_draft_tokens = num_steps + 1 if eagle_topk == 1 else num_steps * eagle_topk + 1
    if eagle_topk == 1 and num_draft_tokens != num_steps + 1:
        raise ConfigError(
            f"num_draft_tokens: with eagle_topk 1, SGLang needs num_draft_tokens = num_steps + 1 "
            f"= {num_steps + 1} (got {num_draft_tokens}); change one of them"
        )
    spec = [
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", draft_model_path,
        "--speculative-num-steps", str(num_steps),
        "--speculative-eagle-topk", str(eagle_topk),
        "--speculative-num-draft-tokens", str(num_draft_tokens),
    ]
    return baseline(model_path, name=name, extra_args=[*spec, *extra_args], **kwargs)


class SGLangSettings(EngineSettings):
    """An SGLang deployment: the target model, its EAGLE-3 draft, and where it listens."""

    engine: Literal["sglang"] = Field("sglang", description="The engine these settings are for.")
    model_path: str = Field("moonshotai/Kimi-K2.5", description="Target model path or hub id on the GPU host.")
    draft_model_path: str = Field("lightseekorg/kimi-k2.5-eagle3", description="EAGLE-3 draft model path or hub id.")
    tp: int = Field(8, ge=1, le=64, description="Tensor parallel size (--tp).")
    port: int = Field(30000, ge=1, le=65535, description="Server port.")
    bind_host: str = Field("127.0.0.1", description="Address the server binds to on the GPU host (SGLang's own "
                           "default; the client reaches it through an SSH tunnel). 0.0.0.0 exposes it to the "
                           "host's whole network.")
    num_steps: int = Field(3, ge=1, le=16, description="--speculative-num-steps.")
    eagle_topk: int = Field(1, ge=1, le=16, description="--speculative-eagle-topk.")
    num_draft_tokens: int | None = Field(None, ge=2, description="--speculative-num-draft-tokens; default steps + 1 for topk 1.")
    python: str = Field("python", description="Python interpreter on the host that has sglang installed.")
    extra_args: list[str] = Field(default_factory=list, description="More launch arguments, one per item.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment, e.g. CUDA_VISIBLE_DEVICES, NCCL_* tuning.")
    env_secrets: dict[str, str] = Field(
        default_factory=dict, description="Environment read from Prefect Secret blocks: {\"HF_TOKEN\": \"hf-token\"}."
    )
    cuda_graph_max_bs: int | None = Field(None, ge=1, description="--cuda-graph-max-bs: the largest batch captured "
                                          "in a CUDA graph (larger batches run eagerly).")
    max_running_requests: int | None = Field(None, ge=1, description="--max-running-requests: the most requests "
                                             "decoded together (the largest batch the per-batch settings meet).")
    simulate: bool = Field(False, description="Rehearse against specsweep's SGLang simulator instead of a real SGLang.")
    sim_profile: str = Field("kimi-k2.5-int4-8x-rtx-pro-6000", description="Simulator performance profile.")

    @model_validator(mode="after")
    def _draft_tokens(self) -> SGLangSettings:
        if self.eagle_topk == 1 and self.num_draft_tokens is not None and self.num_draft_tokens != self.num_steps + 1:
            raise ValueError(f"with eagle_topk 1, SGLang needs num_draft_tokens = num_steps + 1 ({self.num_steps + 1}, "
                             f"not {self.num_draft_tokens}): leave num_draft_tokens empty")
        return self

    def _tuning(self) -> list[str]:
        return [*(["--cuda-graph-max-bs", str(self.cuda_graph_max_bs)] if self.cuda_graph_max_bs else []),
                *(["--max-running-requests", str(self.max_running_requests)] if self.max_running_requests else [])]

    def profile(self, kind: Kind) -> ServerProfile:
        prefix = "sim" if self.simulate else "sglang"
        common: dict[str, Any] = dict(tp=self.tp, port=self.port, host=self.bind_host, python=self.python,
                                      extra_args=[*self._tuning(), *self.extra_args], env=self.env,
                                      simulate=self.simulate, sim_profile=self.sim_profile)
        if kind == "baseline":
            profile = baseline(self.model_path, name=f"{prefix}-baseline", **common)
        else:
            profile = eagle3(self.model_path, self.draft_model_path, num_steps=self.num_steps,
                             eagle_topk=self.eagle_topk, num_draft_tokens=self.num_draft_tokens,
                             name=f"{prefix}-eagle3", **common)
        return profile.model_copy(update={"env_secrets": dict(self.env_secrets)})


def check_adaptive_config(cfg: Any) -> None:
    """Raise ValueError where SGLang would refuse the adaptive config (or leave small batches uncovered)."""
    if not isinstance(cfg, dict) or not cfg:
        raise ValueError("the adaptive config must be a JSON object with batch sizes as keys")
    keys = []
    for key, entry in cfg.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) >= 1):
            raise ValueError(f"key {key!r} is not a batch size (a positive integer as a string)")
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not (isinstance(steps, list) and steps and all(isinstance(s, int) and s >= 0 for s in steps)):
            raise ValueError(f"{key}: candidate_steps must be a non-empty list of integers >= 0")
        keys.append(int(key))
    if min(keys) != 1:
        raise ValueError("the smallest key must be 1, so that every batch size has an entry")


def adaptive_config(starts: Sequence[tuple[int, int]]) -> dict[str, dict[str, list[int]]]:
    """The adaptive file from (first batch size, steps) pairs: one batch tier each."""
    cfg = {str(start): {"candidate_steps": [steps]} for start, steps in starts}
    check_adaptive_config(cfg)
    return cfg


def adaptive_flags(spec: SpeculationSettings, file: str = ADAPTIVE_FILE) -> str:
    """The launch flags that load the adaptive file: with the speculative profile's own EAGLE settings
    when it is an EAGLE one, else only the adaptive flags (to add to an EAGLE/EAGLE3 launch)."""
    adaptive = ["--speculative-adaptive", "--speculative-adaptive-config", file]
    if spec.method not in ("eagle", "eagle3"):
        return shlex.join(adaptive)
    steps = spec.num_speculative_tokens
    parts = ["--speculative-algorithm", spec.method.upper()]
    if spec.model:
        parts += ["--speculative-draft-model-path", spec.model]
    parts += ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens",
              str(steps + 1), *adaptive]
    return shlex.join(parts)


def _sim_preset(kind: Kind) -> Preset:
    def make(model_path: str | None, draft_model_path: str | None, python: str | None) -> ServerProfile:
        model = model_path or "moonshotai/Kimi-K2.5"
        if kind == "baseline":
            return baseline(model, simulate=True, name="sim-baseline")
        return eagle3(model, draft_model_path or "lightseekorg/kimi-k2.5-eagle3", simulate=True, name="sim-eagle3")
    return make


def _private_file(value: str) -> str | None:
    """A file specsweep wrote on the host (``Host.write_private_file``: ``~/.specsweep/files/<name>``)."""
    parts = value.split("/")
    ok = len(parts) >= 3 and parts[-3:-1] == [".specsweep", "files"] and ".." not in parts and f.model(value) is None
    return None if ok else "must be a file specsweep wrote on the host (~/.specsweep/files/<name>)"


_STEPS = f.integer(1, 64)


def _sim_profiles() -> list[str]:
    from specsweep.targets.sim.model import PROFILES  # the simulator's module stays out of a plain import

    return sorted(PROFILES)


class SGLang(Engine):
    name = "sglang"
    label = "SGLang"
    launch_modules = ("sglang.launch_server", "specsweep.targets.sim")
    flags = {"--model-path": f.model, "--host": f.address, "--port": f.port, "--tp": f.integer(1, 64),
             "--enable-metrics": None, "--speculative-algorithm": f.choice("EAGLE3", "EAGLE", "NEXTN", "MTP"),
             "--speculative-draft-model-path": f.model, "--speculative-num-steps": _STEPS,
             "--speculative-eagle-topk": _STEPS, "--speculative-num-draft-tokens": f.integer(2, 1024),
             "--cuda-graph-max-bs": f.integer(1, 1 << 16), "--max-running-requests": f.integer(1, 1 << 16),
             "--speculative-adaptive": None, "--speculative-adaptive-config": _private_file,
             "--api-key": f.placeholder("{api_key}"),
             # the simulator's own (its presets)
             "--sim-profile": f.choice(*_sim_profiles()), "--startup-s": f.number(0, 3600)}
    file_flags = ("--chat-template", "--config", "--tokenizer-path", "--ssl-keyfile", "--ssl-certfile",
                  "--ssl-ca-certs", "--lora-paths", "--download-dir", "--speculative-adaptive-config",
                  "--fault-once-file", "--tool-server", "--json-model-override-args")
    code_flags = ("--trust-remote-code", "--enable-custom-logit-processor", "--custom-weight-loader")
    env_names = ("SGLANG_*",)
    settings = SGLangSettings
    grid_fields = {"num_steps": "steps", "eagle_topk": "topk", "num_draft_tokens": "draft"}
    k_field = "num_steps"
    default_grid = {"num_steps": [1, 3, 5]}
    metrics = MetricNames(
        gauges={"running": ("sglang:num_running_reqs",), "waiting": ("sglang:num_queue_reqs",),
                "kv_cache": ("sglang:token_usage",), "prefix_cache_hit_rate": ("sglang:cache_hit_rate",)},
        counters={"preemptions": ("sglang:num_retracted_reqs_total",),
                  "prompt_tokens": ("sglang:prompt_tokens_total",),
                  "generation_tokens": ("sglang:generation_tokens_total",)},
    )
    request_fields = {"return_spec_tokens_details": True}
    cache_reset = "/flush_cache"
    controller = "SGLang's adaptive speculation (--speculative-adaptive)"
    tier_at = "/server_info"

    def presets(self) -> Mapping[str, Preset]:
        return {
            "sglang-baseline": lambda model, draft, python: baseline(model or "", python=python or "python"),
            "sglang-eagle3": lambda model, draft, python: eagle3(model or "", draft or "", python=python or "python"),
            "sim-baseline": _sim_preset("baseline"),
            "sim-eagle3": _sim_preset("speculative"),
        }

    def tokenize_body(self, text: str) -> dict[str, Any] | None:
        return {"text": text}

    def read_event(self, event: dict[str, Any], rec: RequestRecord) -> None:
        meta = event.get("meta_info")
        if isinstance(meta, dict) and isinstance(meta.get("spec_verify_ct"), int):  # /generate
            rec.spec_verify_ct = meta["spec_verify_ct"]
        ext = event.get("sglext")
        details = ext.get("spec_tokens_details") if isinstance(ext, dict) else None
        if isinstance(details, dict):
            if isinstance(details.get("spec_verify_ct"), int):
                rec.spec_verify_ct = details["spec_verify_ct"]
            proposed, correct = details.get("spec_num_proposed_drafts"), details.get("spec_num_correct_drafts")
            if isinstance(proposed, int) and isinstance(correct, int):
                rec.spec_draft_tokens, rec.spec_accepted_tokens = proposed, correct

    def speculation(self, argv: Sequence[str]) -> SpeculationSettings | None:
        algorithm = flag(argv, "--speculative-algorithm")
        if not algorithm:
            return None
        steps = flag(argv, "--speculative-num-steps")
        topk = flag(argv, "--speculative-eagle-topk")
        return SpeculationSettings(engine=self.name, method=_METHOD.get(algorithm.upper(), algorithm.lower()),
                                   model=flag(argv, "--speculative-draft-model-path"),
                                   num_speculative_tokens=int(steps) if steps and steps.isdigit() else 3,
                                   eagle_topk=int(topk) if topk and topk.isdigit() else 1)

    async def probe(self, api: ServerInfo) -> dict[str, Any]:
        info = await api.get_json("/server_info") or await api.get_json("/get_server_info")
        if not info or not info.get("version"):
            return {}
        fp: dict[str, Any] = {"engine_version": f"sglang {info['version']}"}
        server_args = info.get("server_args")
        args: dict[str, Any] = server_args if isinstance(server_args, dict) else info
        for key in ("model_path", "tp_size", "speculative_algorithm", "speculative_num_steps",
                    "speculative_eagle_topk", "speculative_num_draft_tokens"):
            if key in args:
                fp[f"server_{key}"] = args[key]
        return fp

    def per_batch_setting(self, spec: SpeculationSettings, starts: Sequence[tuple[int, int]],
                          k_max: int) -> PerBatchSetting | None:
        if spec.engine == self.name and (spec.eagle_topk or 1) != 1:
            return PerBatchSetting(engine=self.name, notes=(
                f"SGLang's adaptive speculation needs --speculative-eagle-topk 1; this run used {spec.eagle_topk}: no "
                "adaptive file is given. Run the best setting as a fixed one, or measure with topk 1.",))
        flags = adaptive_flags(spec.model_copy(update={"num_speculative_tokens": k_max}))
        note = () if spec.method in ("eagle", "eagle3") else (
            f"added to an EAGLE/EAGLE3 launch (this run's speculation, {spec.method}, is not one)",)
        return PerBatchSetting(engine=self.name, file_name=ADAPTIVE_FILE, content=adaptive_config(starts), flags=flags,
                               notes=note)

    def controller_tier(self, info: dict[str, Any]) -> int | None:
        """``internal_states[0].speculative_num_steps`` of a server started with ``--speculative-adaptive`` (its
        arguments say so, at the top or under ``server_args``); None from any other."""
        nested = info.get("server_args")
        args = nested if isinstance(nested, dict) else info
        if not args.get("speculative_adaptive"):
            return None
        states = info.get("internal_states")
        state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
        steps = state.get("speculative_num_steps")
        return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0 else None

    def controller_setting(self, argv: Sequence[str], config: Mapping[str, Any] | None = None) -> PerBatchSetting | None:
        """``--speculative-adaptive`` on the speculative launch: its documented default tiers, or the user's
        config (``candidate_steps``, ``ema_alpha``, ... in SGLang's keys) as ``--speculative-adaptive-config``.
        SGLang runs it with EAGLE/EAGLE3 at topk 1 only."""
        spec = self.speculation(argv)
        if spec is None or spec.method not in ("eagle", "eagle3") or (spec.eagle_topk or 1) != 1:
            return PerBatchSetting(engine=self.name, notes=(
                "SGLang's adaptive speculation runs EAGLE/EAGLE3 with --speculative-eagle-topk 1 only; this launch "
                f"speculates {'nothing' if spec is None else f'{spec.method} at topk {spec.eagle_topk}'}.",))
        if not config:
            return PerBatchSetting(engine=self.name, flags="--speculative-adaptive",
                                   notes=("SGLang's documented default tiers",))
        return PerBatchSetting(engine=self.name, file_name=CONTROLLER_FILE, content=dict(config),
                               flags=shlex.join(["--speculative-adaptive", "--speculative-adaptive-config",
                                                 CONTROLLER_FILE]), notes=("the user's controller config",))


ENGINE = SGLang()
