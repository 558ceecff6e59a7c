"""A level's prompts: built once per workload in this process (both configurations get the very same),
marked per block where the engine's prefix cache cannot be emptied, warm-up prompts no level sends, and the
request options the prompts decide."""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from specsweep.bench.config import RequestSpec, WorkloadConfig
from specsweep.bench.workload import Prompt, Tokenizer, build_prompts, local_tokenizer, prompts_digest
from specsweep.errors import ConfigError
from specsweep.server.api import ServerAPI


@dataclass(frozen=True)
class PromptSet:
    """A level's prompts, how their lengths were counted, and their digest (stored with the level, so a
    comparison can tell that both configurations were sent the same prompts)."""

    prompts: tuple[Prompt, ...]
    counted_by: str  # local | server | approximate
    digest: str

#: The prompt sets built in this process, the most recent last: a worker serves many runs, so it keeps a few.
_prompt_cache: OrderedDict[str, PromptSet] = OrderedDict()
PROMPT_CACHE_SETS = 16

def server_tokenizer(api: ServerAPI) -> Tokenizer:
    """The server's /tokenize, a few calls at a time; None counts (the approximate path) where its answers
    make no sense."""
    return Tokenizer("server", api.count_tokens_many)

async def _prompts(api: ServerAPI, model: str | None, workload: WorkloadConfig, count: int) -> PromptSet:
    """The prompts for one level: built once per workload, seed and count in this process, so that both
    configurations of a comparison get the very same prompts."""
    key = json.dumps([model if workload.tokenizer is None else None, workload.model_dump(mode="json"), count])
    if key not in _prompt_cache:
        tokenizer = local_tokenizer(workload.tokenizer) if workload.tokenizer else server_tokenizer(api)
        prompts = tuple(await build_prompts(workload, count, tokenizer))
        counted_by = tokenizer.source if prompts and all(p.exact for p in prompts) else "approximate"
        _prompt_cache[key] = PromptSet(prompts, counted_by, prompts_digest(prompts))
        while len(_prompt_cache) > PROMPT_CACHE_SETS:
            _prompt_cache.popitem(last=False)
    _prompt_cache.move_to_end(key)
    return _prompt_cache[key]

def marked(prompt_set: PromptSet, block: str, config: str = "") -> PromptSet:
    """The prompts, each opening with a mark of its block and place (``[block#i]``): nothing of one block is a prefix
    cached by another. The marks are the same in each configuration (the block's key, not the server's), so the
    configurations compared are sent the very same prompts. With ``config``, the configuration's own mark too
    (``[block#i.ccc]``, one length for every name), for a configuration that shares its servers with the others
    (the verify stage's router sends to the very servers the fixed policies are measured on: with the block's mark
    alone, its blocks read 2-3x the speculative server's own, from that server's cache)."""
    def mark(p: Prompt, i: int, own: str) -> Prompt:
        tag = f"[{block}#{i}{own}] "
        messages = p.messages
        if messages:
            first_user = next((j for j, (role, _) in enumerate(messages) if role == "user"), 0)
            messages = tuple((r, tag + c if j == first_user else c) for j, (r, c) in enumerate(messages))
        return dataclasses.replace(p, text=tag + p.text, messages=messages)

    own = f".{zlib.crc32(config.encode()) % 1000:03d}" if config else ""
    prompts = tuple(mark(p, i, own) for i, p in enumerate(prompt_set.prompts))
    return PromptSet(prompts, prompt_set.counted_by, prompts_digest(prompts))

def warmup_workload(workload: WorkloadConfig, prompts: Sequence[Prompt]) -> WorkloadConfig:
    """Prompts for warm-up requests that no level measures (a cache must not hold a measured prompt): synthetic
    text of the measured prompts' median length, from a seed of its own."""
    lengths = sorted(p.input_tokens for p in prompts if p.input_tokens)
    return workload.model_copy(update={
        "source": "synthetic", "input_len": lengths[len(lengths) // 2] if lengths else workload.input_len,
        "input_len_range": 0.0, "seed": workload.seed + 7_000_003})

def request_for(request: RequestSpec, workload: WorkloadConfig, prompts: Sequence[Prompt]) -> RequestSpec:
    """The request options with the defaults the prompts decide: chat for chat messages, ignore_eos for synthetic
    text only. Chat messages cannot go to the completions endpoint (the model's chat template would be lost)."""
    chat = any(p.messages for p in prompts)
    resolved = request.resolved(chat=chat, synthetic=workload.source == "synthetic")
    if chat and resolved.path_kind != "chat":
        raise ConfigError(f"the prompts of source {workload.source!r} are chat messages, which the "
                          f"{resolved.path_kind} endpoint cannot take without losing the model's chat template: "
                          "set request.endpoint to 'chat' (or leave it empty)")
    return resolved
