"""Prompts to send: synthetic text of a given token length, or a real prompt set (``datasets``).

Lengths are exact where a tokenizer counts them: the model's own ``tokenizer.json`` read
locally (``workload.tokenizer``; milliseconds for thousands of prompts), else the server's
``POST /tokenize``, a few calls at a time (only where its answers make sense: see
``specsweep.server.api``). Without a tokenizer they are approximate (words × 1.3) and labelled
so: a count is never stored as exact that was not.

A synthetic prompt is a prefix of its own seeded word sequence, drawn once: its length is found
by searching the number of words (all prompts counted together in each round), or, where the
local tokenizer can cut at a token, by cutting there. Its cost per prompt does not grow with
the rounds, and the rounds stop as soon as no prompt's count can move closer to its target.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from specsweep.bench import datasets
from specsweep.bench.config import WorkloadConfig
from specsweep.errors import ConfigError
from specsweep.vocabulary import WORDS as _WORDS

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "data" / "prompts"
TOKENS_PER_WORD = 1.3



Counter = Callable[[list[str]], Awaitable[list[int] | None]]


@dataclass(frozen=True)
class Prompt:
    """One prompt as sent: its text (completions; what is counted), its chat messages where it has them,
    its category, its own output length (under the workload's output_len), its arrival in a trace and its
    phase of a workload whose traffic shifts (0, 1, 2, ...: which turn of the phases it was sent in)."""

    text: str
    input_tokens: int | None
    exact: bool
    messages: tuple[tuple[str, str], ...] | None = None
    category: str | None = None
    max_tokens: int | None = None
    arrival_s: float | None = None
    phase: int | None = None

    def to_wire(self) -> list[Any]:
        return [self.text, self.input_tokens, self.exact, [list(m) for m in self.messages or ()] or None,
                self.category, self.max_tokens, self.arrival_s, self.phase]

    @classmethod
    def from_wire(cls, wire: list[Any]) -> Prompt:
        text, n, exact, messages, category, max_tokens, arrival, *rest = wire  # a client of before phases sends 7
        return cls(text, n, exact, tuple((r, c) for r, c in messages) if messages else None, category, max_tokens,
                   arrival, rest[0] if rest else None)


@dataclass(frozen=True)
class Tokenizer:
    """Counts tokens of many texts at once: the model's own tokenizer here, or the server's /tokenize."""

    source: Literal["local", "server"]
    count: Counter
    #: Cut texts to a number of tokens (a local tokenizer decodes a prefix of the text's tokens).
    trim: Callable[[list[str], list[int]], list[str]] | None = None


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
        # Never the reader's own message: it quotes the file (the value it did not expect). Its position only.
        at = re.search(r"line \d+ column \d+", str(exc))
        raise ConfigError(f"tokenizer {file} is not a tokenizers JSON file the 'tokenizers' package can read"
                          f"{f' (at {at.group(0)})' if at else ''}: give the model's own tokenizer.json") from None

    specials = len(tok.encode("", add_special_tokens=True).ids)

    async def count(texts: list[str]) -> list[int] | None:
        return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=True)]

    def trim(texts: list[str], targets: list[int]) -> list[str]:
        encoded = tok.encode_batch(texts, add_special_tokens=False)
        return [tok.decode(e.ids[:max(1, t - specials)]) if len(e.ids) > t - specials else text
                for text, e, t in zip(texts, encoded, targets, strict=True)]

    return Tokenizer("local", count, trim)


def items_of(config: WorkloadConfig) -> list[datasets.Item]:
    """The source's prompts as it gives them (not for synthetic text)."""
    if config.source == "mt-bench":
        return datasets.mt_bench()
    if config.source == "humaneval":
        return datasets.humaneval()
    if config.source == "sharegpt":
        return datasets.sharegpt(config.prompts_file)
    if config.source == "bundled":
        return [datasets.Item(t) for t in bundled_prompts(config.bundled_set)]
    if config.prompts_file is None:  # WorkloadConfig refuses this already; for the type checker
        raise ConfigError("source is 'file' but prompts_file is empty")
    return datasets.prompts_file(config.prompts_file)


def check_source(config: WorkloadConfig) -> None:
    """Read the prompt source (and the tokenizer) once, so that a bad file is refused before any server starts."""
    if config.tokenizer is not None:
        local_tokenizer(config.tokenizer)
    if config.source != "synthetic":
        items_of(config)


def bundled_prompts(name: str) -> list[str]:
    path = PROMPTS_DIR / f"{name}.jsonl"
    if not path.exists():
        names = sorted(p.stem for p in PROMPTS_DIR.glob("*.jsonl"))
        raise ConfigError(f"bundled prompt set {name!r} does not exist: choose one of {names}")
    return [i.text for i in datasets.prompts_file(path)]


MAX_ROUNDS = 32


def _approximate(texts: Sequence[str]) -> list[Prompt]:
    return [Prompt(t, round(len(t.split()) * TOKENS_PER_WORD), exact=False) for t in texts]


async def build_prompts(config: WorkloadConfig, count: int, tokenizer: Tokenizer | None = None) -> list[Prompt]:
    """``count`` prompts (cycling through the source when it holds fewer), counted by ``tokenizer``."""
    if config.source != "synthetic":  # a file's reading and parsing kept off the event loop
        return await _from_items(await asyncio.to_thread(items_of, config), config, count, tokenizer)
    rng = random.Random(config.seed)
    spread = config.input_len_range * config.input_len
    targets = [max(1, round(config.input_len + rng.uniform(-spread, spread))) for _ in range(count)]
    # Each prompt's own words, drawn once: twice its target is more than enough for any tokenizer
    # that gives a word at least half a token.
    words = [rng.choices(_WORDS, k=2 * t + 4) for t in targets]
    if tokenizer is None:
        return _approximate([" ".join(ws[:max(1, round(t / TOKENS_PER_WORD))]) for ws, t in zip(words, targets, strict=True)])
    found = await _cut_at_tokens(words, targets, tokenizer) if tokenizer.trim is not None else None
    return found if found is not None else await _search_words(words, targets, tokenizer)


async def _from_items(items: list[datasets.Item], config: WorkloadConfig, count: int,
                      tokenizer: Tokenizer | None) -> list[Prompt]:
    """``count`` of the set's prompts in a seeded order that takes its categories in turn (cycling), counted; a
    ShareGPT answer's length becomes its prompt's output length (counted alike). A trace (arrival_s on every
    line) keeps its order."""
    phases: list[int | None] = [None] * count
    if config.phases:
        chosen, phases = _in_phases(items, config.phases, config.phase_requests, config.seed, count)
    else:
        if items[0].arrival_s is None:
            items = _interleaved(items, config.seed)
        chosen = [items[i % len(items)] for i in range(count)]
    texts = [i.text for i in chosen]
    answers = [i.answer for i in chosen if i.answer is not None]
    counts = await tokenizer.count(texts + answers) if tokenizer and chosen else None
    exact = counts is not None
    if counts is None:
        counts = [round(len(t.split()) * TOKENS_PER_WORD) for t in texts + answers]
    answer_len = iter(counts[len(texts):])
    return [Prompt(i.text, n, exact, i.messages, i.category,
                   max(1, next(answer_len)) if i.answer is not None else i.max_tokens, i.arrival_s, phase)
            for i, n, phase in zip(chosen, counts, phases, strict=False)]


def _in_phases(items: list[datasets.Item], phases: list[str], per_phase: int, seed: int,
               count: int) -> tuple[list[datasets.Item], list[int | None]]:
    """``count`` prompts in phases: ``per_phase`` of the first category, then of the next, cycling through the
    categories (each category's prompts in a seeded order, cycling when it holds fewer). Returns the prompts
    and each one's phase number. A category the set does not hold is refused, naming the ones it does."""
    rng = random.Random(seed)
    groups: dict[str, list[datasets.Item]] = {}
    for item in items:
        if item.category is not None:
            groups.setdefault(item.category, []).append(item)
    missing = [c for c in phases if c not in groups]
    if missing:
        raise ConfigError(f"workload.phases names {missing}, which the prompt set does not hold: choose among its "
                          f"categories {sorted(groups)}")
    for group in groups.values():
        rng.shuffle(group)
    taken = dict.fromkeys(groups, 0)
    chosen: list[datasets.Item] = []
    numbers: list[int | None] = []
    for i in range(count):
        phase = i // per_phase
        category = phases[phase % len(phases)]
        group = groups[category]
        chosen.append(group[taken[category] % len(group)])
        taken[category] += 1
        numbers.append(phase)
    return chosen, numbers


def _interleaved(items: list[datasets.Item], seed: int) -> list[datasets.Item]:
    """The set in a seeded order that takes its categories in turn (MT-Bench lists its questions category by
    category): any stretch of it is a fair mix, and each category has its share of every block."""
    rng = random.Random(seed)
    groups: dict[str | None, list[datasets.Item]] = {}
    for item in items:
        groups.setdefault(item.category, []).append(item)
    for group in groups.values():
        rng.shuffle(group)
    order = sorted(groups, key=lambda c: (c is None, c or ""))
    rng.shuffle(order)
    out: list[datasets.Item] = []
    while any(groups.values()):
        out += [groups[c].pop() for c in order if groups[c]]
    return out


async def _cut_at_tokens(words: list[list[str]], targets: list[int], tokenizer: Tokenizer) -> list[Prompt] | None:
    """A local tokenizer that decodes: each prompt's words (enough of them) cut at its target token, in one
    round; None when the cut text does not count back to the target (a tokenizer without a decoder)."""
    assert tokenizer.trim is not None
    texts = tokenizer.trim([" ".join(ws) for ws in words], targets)
    counts = await tokenizer.count(texts)
    if counts is None or counts != targets:
        return None
    return [Prompt(t, n, exact=True) for t, n in zip(texts, counts, strict=True)]


async def _search_words(words: list[list[str]], targets: list[int], tokenizer: Tokenizer) -> list[Prompt]:
    """Each prompt's length in words, searched until it counts exactly its target (or no count can come
    closer): the first guess from the average tokens per word, then the count's own rate, then bisection
    between the longest prefix found short and the shortest found long. All pending prompts are counted
    together in each round. If the tokenizer stops answering, every count is approximate."""
    n = len(targets)
    lo = [1] * n  # every prefix shorter than lo counts short
    hi = [len(ws) for ws in words]  # every prefix longer than hi counts long
    guess = [min(hi[i], max(1, round(targets[i] / TOKENS_PER_WORD))) for i in range(n)]
    best = [(1 << 62, 1, 0)] * n  # (distance, words, count) of the closest prefix counted so far
    pending = list(range(n))
    for _ in range(MAX_ROUNDS):
        if not pending:
            break
        counts = await tokenizer.count([" ".join(words[i][:guess[i]]) for i in pending])
        if counts is None:  # the tokenizer went away: nothing is exact
            return _approximate([" ".join(ws[:max(1, round(t / TOKENS_PER_WORD))]) for ws, t in zip(words, targets, strict=True)])
        still = []
        for i, got in zip(pending, counts, strict=True):
            k, target = guess[i], targets[i]
            if abs(got - target) < best[i][0]:
                best[i] = (abs(got - target), k, got)
            if got == target:
                continue
            if got < target:
                lo[i] = k + 1
            else:
                hi[i] = k - 1
            if lo[i] > hi[i]:
                continue  # no length left that could count closer
            rate = got / k if got > 0 else 0.0
            step = round(target / rate) if rate > 0 else (lo[i] + hi[i]) // 2
            guess[i] = step if lo[i] <= step <= hi[i] and step != k else (lo[i] + hi[i]) // 2
            still.append(i)
        pending = still
    # Every prompt was counted in the first round: each has its closest prefix, counted exactly.
    return [Prompt(" ".join(ws[:k]), got, exact=True) for ws, (_, k, got) in zip(words, best, strict=True)]


def prompts_digest(prompts: Sequence[Prompt]) -> str:
    """A hash of the prompts' texts, in order: equal digests, the same prompts."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(p.text.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]
