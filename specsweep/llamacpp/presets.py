"""llama.cpp profiles: baseline, and draft speculation (``--spec-type draft-simple``).

``llama-server`` is used when it is on PATH; otherwise specsweep's launcher over the
xllamacpp wheel, which takes the same flags, so the profile reads the same either way.
Without explicit model paths, the tiny generated models under data/models/ are built
(once) and used.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from specsweep.errors import ConfigError
from specsweep.profiles import ServerProfile, make_profile

DEFAULT_PORT = 8081
REPO_ROOT = Path(__file__).resolve().parents[2]


def default_models_dir() -> Path:
    return Path(os.environ.get("SPECSWEEP_MODELS_DIR") or REPO_ROOT / "data" / "models")


def server_command() -> list[str]:
    binary = shutil.which("llama-server")
    return [binary] if binary else [sys.executable, "-m", "specsweep.llamacpp.launcher"]


def _models(model_path: str | None, draft_model_path: str | None, need_draft: bool,
            layers: int | None) -> tuple[str, str | None]:
    if model_path and (draft_model_path or not need_draft):
        return model_path, draft_model_path
    from specsweep.llamacpp.models import ModelSpec, make_models

    spec = ModelSpec() if layers is None else ModelSpec(n_layer=layers)
    # Each shape in its own folder: a server may have the other shape's file open.
    where = default_models_dir() if spec == ModelSpec() else default_models_dir() / f"layers-{spec.n_layer}"
    files = make_models(where, spec)
    return model_path or str(files.target), draft_model_path or (str(files.draft) if need_draft else None)


def _profile(name: str, argv: list[str], port: int) -> ServerProfile:
    return make_profile(
        {
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
        }
    )


def _common(model: str, parallel: int, ctx: int, threads: int) -> list[str]:
    if parallel < 1 or threads < 1 or ctx < 256:
        raise ConfigError("parallel and threads must be at least 1 and ctx at least 256")
    return [*server_command(), "-m", model, "--host", "{host}", "--port", "{port}",
            "-np", str(parallel), "-c", str(ctx), "-t", str(threads), "--metrics"]


def baseline_profile(
    *, model_path: str | None = None, parallel: int = 8, ctx: int = 8192, threads: int = 2,
    port: int = DEFAULT_PORT, name: str = "llamacpp-baseline", layers: int | None = None,
) -> ServerProfile:
    """``layers``: of the generated target (the draft is its first block); default 8."""
    model, _ = _models(model_path, None, need_draft=False, layers=layers)
    return _profile(name, _common(model, parallel, ctx, threads), port)


def speculative_profile(
    *, model_path: str | None = None, draft_model_path: str | None = None, parallel: int = 8, ctx: int = 8192,
    threads: int = 2, draft_max: int = 4, draft_min: int = 0, draft_p_min: float | None = None,
    port: int = DEFAULT_PORT, name: str = "llamacpp-speculative", layers: int | None = None,
) -> ServerProfile:
    model, draft = _models(model_path, draft_model_path, need_draft=True, layers=layers)
    assert draft is not None
    if draft_max < 1 or not 0 <= draft_min <= draft_max:
        raise ConfigError(f"draft_max must be at least 1 and draft_min from 0 to draft_max (got {draft_max}, {draft_min})")
    argv = [*_common(model, parallel, ctx, threads), "-md", draft, "--spec-type", "draft-simple",
            "--spec-draft-n-max", str(draft_max)]
    if draft_min:
        argv += ["--spec-draft-n-min", str(draft_min)]
    if draft_p_min is not None:
        argv += ["--spec-draft-p-min", f"{draft_p_min:g}"]
    return _profile(name, argv, port)
