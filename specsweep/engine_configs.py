"""The recommendation in the forms the engines load, and the rules those engines hold them to.

vLLM (V1, dynamic speculative decoding): ``--speculative-config`` with
``num_speculative_tokens_per_batch_size``, a list of ``[range_start, range_end, K]`` with
inclusive ranges: positive, sorted, not overlapping, the first starting at 1, K >= 0 (0: no
speculation for those batch sizes); a gap takes the previous range's K and the last range
carries on to the largest batch. A dict is refused.

SGLang (0.5.23): ``--speculative-adaptive --speculative-adaptive-config FILE``, a JSON object
whose keys are batch sizes as strings, each ``{"candidate_steps": [ints >= 0]}``; a batch uses
the entry with the largest key <= its size; 0 steps is no speculation. Only EAGLE/EAGLE3
with ``--speculative-eagle-topk 1``. A file with no integer key, or a candidate list that is
not a list of non-negative integers, is refused.

The batch these key on is the scheduler's running batch, which is at most the client's
concurrency: "off from concurrency C" becomes "off from batch size C".
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from pydantic import BaseModel, Field

MAX_BATCH = 4096

#: SGLang's --speculative-algorithm and llama.cpp's --spec-type, as vLLM names the method.
_VLLM_METHOD = {"EAGLE3": "eagle3", "EAGLE": "eagle", "NEXTN": "mtp", "MTP": "mtp", "draft-simple": "draft_model",
                "ngram-simple": "ngram", "ngram-mod": "ngram"}


class SpeculationSettings(BaseModel):
    """What the speculative configuration drafts, read from its launch command."""

    engine: str = Field(description="sglang, vllm, llamacpp or unknown.")
    method: str = Field(description="As vLLM names it: eagle3, eagle, mtp, draft_model, ngram, ...")
    model: str | None = Field(None, description="The draft model, where there is one.")
    num_speculative_tokens: int = Field(ge=1, description="Tokens drafted per step (K; SGLang's steps).")
    eagle_topk: int | None = Field(None, description="SGLang's --speculative-eagle-topk (adaptive needs 1).")


def _flag(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def speculation_from_command(command: str | None) -> SpeculationSettings | None:
    """The speculative settings of a launch command (SGLang, vLLM or llama.cpp); None when it does not speculate."""
    if not command:
        return None
    try:
        argv = shlex.split(command)
    except ValueError:
        argv = command.split()
    algorithm = _flag(argv, "--speculative-algorithm")
    if algorithm:
        steps = _flag(argv, "--speculative-num-steps")
        topk = _flag(argv, "--speculative-eagle-topk")
        return SpeculationSettings(engine="sglang", method=_VLLM_METHOD.get(algorithm.upper(), algorithm.lower()),
                                   model=_flag(argv, "--speculative-draft-model-path"),
                                   num_speculative_tokens=int(steps) if steps and steps.isdigit() else 3,
                                   eagle_topk=int(topk) if topk and topk.isdigit() else 1)
    vllm = _flag(argv, "--speculative-config", "--speculative_config")
    if vllm:
        try:
            cfg = json.loads(vllm)
        except json.JSONDecodeError:
            return None
        return SpeculationSettings(engine="vllm", method=str(cfg.get("method", "draft_model")), model=cfg.get("model"),
                                   num_speculative_tokens=int(cfg.get("num_speculative_tokens") or 1))
    draft = _flag(argv, "-md", "--model-draft")
    spec_type = _flag(argv, "--spec-type")
    if draft or (spec_type and spec_type != "none"):
        n = _flag(argv, "--spec-draft-n-max", "--draft-max", "--draft")
        return SpeculationSettings(engine="llamacpp", method=_VLLM_METHOD.get(spec_type or "draft-simple", "draft_model"),
                                   model=draft, num_speculative_tokens=int(n) if n and n.isdigit() else 16)
    return None


# -- vLLM ----------------------------------------------------------------------------------------


def _off_starts(k: int, off_from: int | None) -> list[tuple[int, int]]:
    """(first batch size, K) for "K below off_from, 0 from it on"."""
    if off_from is None:
        return [(1, k)]
    if off_from <= 1:
        return [(1, 0)]
    return [(1, k), (off_from, 0)]


def ranges_schedule(starts: list[tuple[int, int]]) -> list[list[int]]:
    """``num_speculative_tokens_per_batch_size`` from (first batch size, K) pairs, the first at 1: each
    range runs to just below the next one's start, the last to the largest batch."""
    return [[start, starts[i + 1][0] - 1 if i + 1 < len(starts) else MAX_BATCH, k]
            for i, (start, k) in enumerate(starts)]


def vllm_schedule(k: int, off_from: int | None) -> list[list[int]]:
    """``num_speculative_tokens_per_batch_size``: K below ``off_from``, 0 from it on."""
    return ranges_schedule(_off_starts(k, off_from))


def vllm_speculative_config(spec: SpeculationSettings, off_from: int | None) -> dict[str, Any]:
    """The object for vLLM's ``--speculative-config``."""
    return vllm_ranges_config(spec, _off_starts(spec.num_speculative_tokens, off_from), spec.num_speculative_tokens)


def vllm_ranges_config(spec: SpeculationSettings, starts: list[tuple[int, int]], k_max: int) -> dict[str, Any]:
    """``--speculative-config`` with a K per batch-size range. vLLM caps each range's K at
    ``num_speculative_tokens``, so that is the largest K of the schedule (``k_max``)."""
    cfg: dict[str, Any] = {"method": spec.method}
    if spec.model:
        cfg["model"] = spec.model
    cfg["num_speculative_tokens"] = k_max
    cfg["num_speculative_tokens_per_batch_size"] = ranges_schedule(starts)
    check_vllm_speculative_config(cfg)
    return cfg


def check_vllm_speculative_config(cfg: dict[str, Any]) -> None:
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


# -- SGLang --------------------------------------------------------------------------------------


def sglang_adaptive_config(steps: int, off_from: int | None) -> dict[str, dict[str, list[int]]]:
    """The file for ``--speculative-adaptive-config``: ``steps`` below ``off_from``, 0 from it on."""
    return sglang_ranges_config(_off_starts(steps, off_from))


def sglang_ranges_config(starts: list[tuple[int, int]]) -> dict[str, dict[str, list[int]]]:
    """The adaptive file from (first batch size, steps) pairs: one batch tier each."""
    cfg = {str(start): {"candidate_steps": [steps]} for start, steps in starts}
    check_sglang_adaptive_config(cfg)
    return cfg


def check_sglang_adaptive_config(cfg: dict[str, Any]) -> None:
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


def sglang_flags(spec: SpeculationSettings, file: str = "sglang-adaptive-config.json") -> str:
    """The SGLang launch flags that load the adaptive file: with the speculative profile's own EAGLE
    settings when it is an EAGLE one, else only the adaptive flags (to add to an EAGLE/EAGLE3 launch)."""
    adaptive = ["--speculative-adaptive", "--speculative-adaptive-config", file]
    if spec.method not in ("eagle", "eagle3"):
        return shlex.join(adaptive)
    steps = spec.num_speculative_tokens
    algorithm = {"eagle3": "EAGLE3", "eagle": "EAGLE"}.get(spec.method, spec.method.upper())
    parts = ["--speculative-algorithm", algorithm]
    if spec.model:
        parts += ["--speculative-draft-model-path", spec.model]
    parts += ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens",
              str(steps + 1), *adaptive]
    return shlex.join(parts)


def vllm_flags(cfg: dict[str, Any]) -> str:
    return shlex.join(["--speculative-config", json.dumps(cfg, separators=(",", ":"))])
