"""Prompts to send: synthetic text of a given token length, the bundled set, or the user's file.

Lengths are exact where a tokenizer counts them: the model's own ``tokenizer.json`` read
locally (``workload.tokenizer``; milliseconds for thousands of prompts), else the server's
``POST /tokenize`` (llama.cpp, vLLM and SGLang answer it), a few calls at a time. Synthetic
prompts are then grown or trimmed to the exact count, all of them in each round. Without
a tokenizer they are approximate (words × 1.3) and labelled so.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

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

Counter = Callable[[list[str]], Awaitable[list[int] | None]]


@dataclass(frozen=True)
class Prompt:
    text: str
    input_tokens: int | None
    exact: bool


@dataclass(frozen=True)
class Tokenizer:
    """Counts tokens of many texts at once: the model's own tokenizer here, or the server's /tokenize."""

    source: Literal["local", "server"]
    count: Counter
    #: Cut texts to a number of tokens (a local tokenizer decodes a prefix of the text's tokens).
    trim: Callable[[list[str], list[int]], list[str]] | None = None


def server_tokenizer(api: ServerAPI) -> Tokenizer:
    """The server's /tokenize, a few calls at a time; None counts (the approximate path) when it has none."""
    return Tokenizer("server", lambda texts: api.count_tokens_many(texts))


def local_tokenizer(path: Path) -> Tokenizer:
    """The model's own ``tokenizer.json`` (a file, or a folder holding one), read with the ``tokenizers``
    package: nothing is downloaded, and counting thousands of prompts takes milliseconds."""
    path = Path(path).expanduser()
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"tokenizer {path}: no tokenizer.json there: give the model's tokenizer.json (or its folder)")
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:  # pragma: no cover - a dependency of the project
        raise ConfigError("tokenizer: the 'tokenizers' package is not installed (pip install tokenizers)") from None
    try:
        tok = HFTokenizer.from_file(str(file))
    except Exception as exc:  # noqa: BLE001 - any reader error is a bad file
        raise ConfigError(f"tokenizer {file} is not a tokenizers JSON file: {exc}") from None

    specials = len(tok.encode("", add_special_tokens=True).ids)

    async def count(texts: list[str]) -> list[int] | None:
        return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=True)]

    def trim(texts: list[str], targets: list[int]) -> list[str]:
        encoded = tok.encode_batch(texts, add_special_tokens=False)
        return [tok.decode(e.ids[:max(1, t - specials)]) if len(e.ids) > t - specials else text
                for text, e, t in zip(texts, encoded, targets, strict=True)]

    return Tokenizer("local", count, trim)


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
    """Read the prompt source (and the tokenizer) once, so that a bad file is refused before any server starts."""
    if config.tokenizer is not None:
        local_tokenizer(config.tokenizer)
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


MAX_ROUNDS = 32


def _words_for(rng: random.Random, tokens: float, per_word: float) -> list[str]:
    return [rng.choice(_WORDS) for _ in range(max(1, round(tokens / per_word)))]


async def build_prompts(config: WorkloadConfig, count: int, tokenizer: Tokenizer | None = None) -> list[Prompt]:
    """``count`` prompts (cycling through the source when it holds fewer).

    Synthetic prompts of exact length are built in rounds: every prompt not yet at its target
    is grown or trimmed by the words its own tokens-per-word suggests, and all of them are
    counted at once (one batch for a local tokenizer, a few concurrent calls for a server's).
    A prompt that cannot hit its target exactly (a word of two tokens where one is missing)
    keeps the closest length found, counted exactly."""
    rng = random.Random(config.seed)
    if config.source != "synthetic":
        texts = bundled_prompts(config.bundled_set) if config.source == "bundled" else _read_file(_prompts_file(config))
        chosen = [texts[(config.seed + i) % len(texts)] for i in range(count)]
        counts = await tokenizer.count(chosen) if tokenizer and chosen else None
        if counts is None:
            return [Prompt(t, round(len(t.split()) * TOKENS_PER_WORD), exact=False) for t in chosen]
        return [Prompt(t, n, exact=True) for t, n in zip(chosen, counts, strict=True)]
    spread = config.input_len_range * config.input_len
    targets = [max(1, round(config.input_len + rng.uniform(-spread, spread))) for _ in range(count)]
    words = [_words_for(rng, t, TOKENS_PER_WORD) for t in targets]
    texts = [" ".join(ws) for ws in words]
    counts = await tokenizer.count(texts) if tokenizer and texts else None
    if counts is None:
        return [Prompt(t, round(len(ws) * TOKENS_PER_WORD), exact=False) for t, ws in zip(texts, words, strict=True)]
    best = [(abs(n - t), txt, n) for txt, n, t in zip(texts, counts, targets, strict=True)]
    pending = [i for i in range(count) if counts[i] != targets[i]]
    trim = tokenizer.trim if tokenizer is not None else None
    for _ in range(MAX_ROUNDS):
        if not pending or tokenizer is None:
            break
        for i in pending:
            n, ws = counts[i], words[i]
            per_word = max(0.25, n / max(1, len(ws)))
            if n < targets[i]:  # grow (past the target where the tokenizer can cut at a token)
                ws += _words_for(rng, (targets[i] - n) * (1.5 if trim else 1.0), per_word)
            elif trim is None:
                del ws[max(1, len(ws) - max(1, round((n - targets[i]) / per_word))):]
        texts = [" ".join(words[i]) for i in pending]
        if trim is not None:
            texts = trim(texts, [targets[i] for i in pending])
            for i, text in zip(pending, texts, strict=True):
                words[i] = text.split()
        trial = await tokenizer.count(texts)
        if trial is None:  # the tokenizer went away: keep what was counted
            break
        for i, text, n in zip(pending, texts, trial, strict=True):
            counts[i] = n
            if abs(n - targets[i]) < best[i][0]:
                best[i] = (abs(n - targets[i]), text, n)
        still = [i for i in pending if best[i][0] != 0]
        if trim is not None and len(still) == len(pending):
            trim = None  # cutting at a token does not survive a round trip here (no decoder?): words only
        pending = still
    return [Prompt(txt, n, exact=True) for _, txt, n in best]


def prompts_digest(prompts: Sequence[Prompt]) -> str:
    """A hash of the prompts' texts, in order: equal digests, the same prompts."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(p.text.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]
