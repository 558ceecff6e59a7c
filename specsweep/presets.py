"""Ready-made server profiles for the engines specsweep knows.

SGLang: baseline and EAGLE-3 (``--speculative-algorithm EAGLE3`` with a draft model).
vLLM: baseline, EAGLE-3, draft model and n-gram speculation (``specsweep.vllm.presets``).
llama.cpp: baseline and draft speculation, runnable on this machine's CPU (see
``specsweep.llamacpp``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from specsweep.errors import ConfigError
from specsweep.profiles import ServerProfile, make_profile

# SGLang's launcher and its scheduler and detokenizer processes (they rename themselves
# "sglang::scheduler_TP0" and the like, and can outlive the launcher), and the simulator's
# launcher: the leftover kill takes marked processes of these names only.
SGLANG_CLEANUP = [r"sglang::", r"sglang\.launch_server", r"-m specsweep\.sim\b"]


def sglang_baseline(
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
    module = (["specsweep.sim", "--sim-profile", sim_profile, "--startup-s", f"{sim_startup_s:g}"] if simulate
              else ["sglang.launch_server"])
    argv = [python if not simulate or python != "python" else sys.executable, "-m", *module, "--model-path", model_path,
            "--host", "{host}", "--port", "{port}", "--tp", str(tp), "--enable-metrics", *extra_args]
    return make_profile(
        {
            "name": name,
            "engine": "sglang",
            "argv": argv,
            "env": env or {},
            "host": host,
            "port": port,
            "health_path": "/health",
            "startup_timeout_s": 1800.0,
            "health_poll_max_interval_s": 0.2,
            "cleanup_patterns": SGLANG_CLEANUP,
            "probe_path": "/generate",
            "description": "SGLang. It takes an API key only as a flag (add --api-key {api_key} to argv), which every "
            "user of the host can read with ps: prefer no key on a host's loopback, reached over SSH.",
        }
    )


def sglang_eagle3(
    model_path: str,
    draft_model_path: str,
    *,
    num_steps: int = 3,
    eagle_topk: int = 1,
    num_draft_tokens: int | None = None,
    tp: int = 8,
    name: str = "sglang-eagle3",
    port: int = 30000,
    host: str = "127.0.0.1",
    python: str = "python",
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    simulate: bool = False,
    sim_profile: str = "kimi-k2.5-int4-8x-rtx-pro-6000",
    sim_startup_s: float = 3.0,
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
    return sglang_baseline(model_path, tp=tp, name=name, port=port, host=host, python=python,
                           extra_args=[*spec, *extra_args], env=env, simulate=simulate, sim_profile=sim_profile,
                           sim_startup_s=sim_startup_s)


PRESET_NAMES = ("sglang-baseline", "sglang-eagle3", "sim-baseline", "sim-eagle3", "llamacpp-baseline",
                "llamacpp-speculative", "vllm-baseline", "vllm-eagle3", "vllm-draft", "vllm-ngram")


def by_name(name: str, *, model_path: str | None = None, draft_model_path: str | None = None,
            python: str | None = None) -> ServerProfile:
    """A preset by its CLI name. ``python``: the interpreter that runs vLLM or SGLang on the host."""
    from specsweep import llamacpp

    if name == "sglang-baseline":
        return sglang_baseline(model_path or "", python=python or "python")
    if name == "sglang-eagle3":
        return sglang_eagle3(model_path or "", draft_model_path or "", python=python or "python")
    if name == "sim-baseline":
        return sglang_baseline(model_path or "moonshotai/Kimi-K2.5", simulate=True, name="sim-baseline")
    if name == "sim-eagle3":
        return sglang_eagle3(model_path or "moonshotai/Kimi-K2.5", draft_model_path or "lightseekorg/kimi-k2.5-eagle3",
                             simulate=True, name="sim-eagle3")
    if name == "llamacpp-baseline":
        return llamacpp.baseline_profile(model_path=model_path)
    if name == "llamacpp-speculative":
        return llamacpp.speculative_profile(model_path=model_path, draft_model_path=draft_model_path)
    if name.startswith("vllm-"):
        return _vllm_by_name(name, model_path, draft_model_path, python)
    raise ConfigError(f"unknown preset {name!r}: choose one of {', '.join(PRESET_NAMES)}")


def _vllm_by_name(name: str, model: str | None, draft: str | None, python: str | None) -> ServerProfile:
    from specsweep.vllm import presets as vllm

    kw: dict[str, Any] = {"python": python or "python"}
    if name == "vllm-baseline":
        return vllm.vllm_baseline(model or "", **kw)
    if name == "vllm-eagle3":
        return vllm.vllm_eagle3(model or "", draft or "", **kw)
    if name == "vllm-draft":
        return vllm.vllm_draft(model or "", draft or "", **kw)
    if name == "vllm-ngram":
        return vllm.vllm_ngram(model or "", **kw)
    raise ConfigError(f"unknown preset {name!r}: choose one of {', '.join(PRESET_NAMES)}")

