"""Prompts to send: synthetic text of a given token length, the bundled set, or the user's file.

Lengths are exact where the server has a tokenize endpoint (llama.cpp, vLLM and SGLang
answer ``POST /tokenize``): synthetic prompts are then trimmed to the exact count.
Elsewhere they are approximate (words × 1.3) and labelled so.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from specsweep.bench.config import WorkloadConfig
from specsweep.errors import ConfigError
from specsweep.server_api import ServerAPI

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "data" / "prompts"
TOKENS_PER_WORD = 1.3

_WORDS = (
    "the model server token batch cache request stream latency throughput speculative draft verify accept "
    "engine kernel memory bandwidth compute scheduler queue prefill decode attention layer weight tensor "
    "river mountain water light music city garden window letter paper story answer question number system "
    "quick slow small large early late bright dark warm cold open close begin finish measure compare report"
).split()

Tokenizer = Callable[[str], Awaitable[int | None]]


@dataclass(frozen=True)
class Prompt:
    text: str
    input_tokens: int | None
    exact: bool


def server_tokenizer(api: ServerAPI) -> Tokenizer:
    """Count tokens with the server's /tokenize; None (and no further calls) when it has none."""
    state = {"works": True}

    async def count(text: str) -> int | None:
        if not state["works"]:
            return None
        n = await api.count_tokens(text)
        if n is None:
            state["works"] = False
        return n

    return count


def _read_file(path: Path) -> list[str]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompts_file {path} does not exist: give the path of a JSONL or Parquet file of prompts")
    if path.suffix.lower() == ".parquet":
        import pandas as pd

        try:
            df = pd.read_parquet(path)
        except Exception as exc:  # noqa: BLE001 - any reader error is a bad file
            raise ConfigError(f"prompts_file {path} is not a readable Parquet file: {exc}") from None
        if "prompt" not in df.columns:
            raise ConfigError(f"prompts_file {path} has no 'prompt' column (columns: {list(df.columns)})")
        prompts = [str(p) for p in df["prompt"].dropna()]
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"prompts_file {path} is not UTF-8 text: save it as UTF-8 JSONL") from None
        prompts = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                raise ConfigError(
                    f"prompts_file {path} line {n} is not JSON: each line must be an object like {{\"prompt\": \"...\"}}"
                ) from None
            if isinstance(item, str):
                prompts.append(item)
            elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
                prompts.append(item["prompt"])
            else:
                raise ConfigError(f"prompts_file {path} line {n} has no string field 'prompt': "
                                  "each line must be an object like {\"prompt\": \"...\"}")
    if not prompts:
        raise ConfigError(f"prompts_file {path} holds no prompts: add one {{\"prompt\": \"...\"}} per line")
    return prompts


def check_source(config: WorkloadConfig) -> None:
    """Read the prompt source once, so that a bad file is refused before any server starts."""
    if config.source == "file":
        _read_file(_prompts_file(config))
    elif config.source == "bundled":
        bundled_prompts(config.bundled_set)


def _prompts_file(config: WorkloadConfig) -> Path:
    if config.prompts_file is None:  # WorkloadConfig refuses this already; for the type checker
        raise ConfigError("source is 'file' but prompts_file is empty")
    return config.prompts_file


def bundled_prompts(name: str) -> list[str]:
    path = PROMPTS_DIR / f"{name}.jsonl"
    if not path.exists():
        names = sorted(p.stem for p in PROMPTS_DIR.glob("*.jsonl"))
        raise ConfigError(f"bundled prompt set {name!r} does not exist: choose one of {names}")
    return _read_file(path)


def _synthetic_text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, n_words)))


async def build_prompts(config: WorkloadConfig, count: int, tokenizer: Tokenizer | None = None) -> list[Prompt]:
    """``count`` prompts (cycling through the source when it holds fewer)."""
    rng = random.Random(config.seed)
    if config.source == "synthetic":
        prompts = []
        for _ in range(count):
            spread = config.input_len_range * config.input_len
            target = max(1, round(config.input_len + rng.uniform(-spread, spread)))
            words = max(1, round(target / TOKENS_PER_WORD))
            text = _synthetic_text(rng, words)
            n = await tokenizer(text) if tokenizer else None
            if n is None or tokenizer is None:
                prompts.append(Prompt(text, round(words * TOKENS_PER_WORD), exact=False))
                continue
            # Grow or trim word by word until the count is exact (or as close as words allow).
            ws = text.split()
            for _ in range(64):
                if n == target:
                    break
                if n < target:
                    ws += [rng.choice(_WORDS) for _ in range(max(1, round((target - n) / TOKENS_PER_WORD)))]
                else:
                    ws = ws[: max(1, len(ws) - max(1, round((n - target) / TOKENS_PER_WORD)))]
                text = " ".join(ws)
                n = await tokenizer(text) or n
            prompts.append(Prompt(text, n, exact=True))
        return prompts
    texts = bundled_prompts(config.bundled_set) if config.source == "bundled" else _read_file(_prompts_file(config))
    out = []
    for i in range(count):
        text = texts[(config.seed + i) % len(texts)]
        n = await tokenizer(text) if tokenizer else None
        out.append(Prompt(text, n if n is not None else round(len(text.split()) * TOKENS_PER_WORD), exact=n is not None))
    return out
