"""``specsweep sim``: an SGLang-compatible server process driven by the performance model.

Takes SGLang's launch flags (so one profile runs against the simulator or a real SGLang
with only the program changed) plus its own: ``--sim-profile``, ``--startup-s``,
``--seed`` and faults. Health behaves as SGLang's: the port refuses connections while
"loading weights", /health answers 503 while "warming up", then 200 with an empty body.
``GET /sim/token_times?id=ID`` returns the monotonic time each token of a request was
written to the socket, so a client's timing error can be measured against the truth.

As SGLang 0.5.23 does: per-request speculation figures (``sglext.spec_tokens_details`` on the
OpenAI endpoints when asked with ``return_spec_tokens_details``, ``meta_info.spec_verify_ct``
and ``spec_accept_length`` on ``/generate``); ``--speculative-adaptive`` (a model of SGLang's
documented controller, ``adaptive.py``: tiers of draft steps moved by an average of accepted
drafts, per batch-size band; its active tier at ``/server_info``
``internal_states[0].speculative_num_steps``) with ``--speculative-adaptive-config FILE`` in the
controller's keys, or in the form the tune writes (batch sizes to candidate steps, 0 = no
speculation for that batch tier); ``/metrics`` in Prometheus text with ``--enable-metrics``.

``--sim-accept-rule REGEX=LENGTH`` gives the requests whose prompt matches REGEX their own accept length
(at 3 draft steps), so traffic whose acceptance shifts (code, then role-play) gives the controller
something to react to.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import os
import random
import re
import shlex
import sys
import tempfile
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from specsweep.targets.sim.adaptive import Controller, controller_from, is_controller_config
from specsweep.targets.sim.model import (
    CALIBRATION_STEPS,
    PROFILES,
    SimProfile,
    acceptance_probability,
    expected_throughput,
    mean_accept_length,
    sample_accepted,
    spec_step_params,
    speedup_at,
    step_time,
)

log = logging.getLogger("specsweep.targets.sim")
_perf = time.perf_counter
_WORDS = ("the model serves tokens quickly while the batch grows and the cache fills with keys values "
          "river light music garden window letter story answer number system").split()
_TOKEN_RX = re.compile(r"\w+|[^\w\s]")
VERSION = "0.5.4-specsweep-sim"


def natural_length(prompt: str) -> int:
    """Where the answer to ``prompt`` ends without ignore_eos: 8 to 512 tokens, the same for the same prompt
    on every server (as a model's greedy answer is), so that outputs can be compared between configurations."""
    return 8 + zlib.crc32(prompt.encode()) % 505


def count_tokens(text: str) -> int:
    return max(1, len(_TOKEN_RX.findall(text)))


@dataclass
class Faults:
    crash_on_start: bool = False
    never_healthy: bool = False
    die_after: int | None = None
    hang_after: int | None = None
    error_rate: float = 0.0
    cut_rate: float = 0.0
    malformed_rate: float = 0.0
    stall_s: float = 0.0  # pause this long mid-stream, once per request
    trickle_s: float = 0.0  # send streams one byte at a time, this far apart


class _Trickle:
    """A stream response that sends what it is given one byte at a time."""

    def __init__(self, resp: web.StreamResponse, interval_s: float) -> None:
        self.resp, self.interval_s = resp, interval_s

    async def write(self, data: bytes) -> None:
        for i in range(len(data)):
            await self.resp.write(data[i:i + 1])
            await asyncio.sleep(self.interval_s)


@dataclass
class SimRequest:
    rid: str
    max_tokens: int
    queue: asyncio.Queue[tuple[int, int]] = field(default_factory=asyncio.Queue)  # per step: (tokens, drafted)
    p: float = 0.0  # per-draft acceptance probability of this request
    emitted: int = 0
    verify_ct: int = 0
    cancelled: bool = False


def read_speedups(items: list[str]) -> dict[int, float] | None:
    """``--sim-speedup BATCH=X`` (repeatable): the speculative server's speedup over the baseline at each batch
    size (log-linear between them), e.g. the crossover of a published table."""
    if not items:
        return None
    out = {}
    for text in items:
        batch, sep, value = text.partition("=")
        try:
            b, x = int(batch), float(value)
        except ValueError:
            raise ValueError(f"--sim-speedup {text!r}: give BATCH=SPEEDUP, e.g. 16=1.02") from None
        if not sep or b < 1 or not 0.05 <= x <= 20:
            raise ValueError(f"--sim-speedup {text!r}: BATCH must be at least 1 and SPEEDUP from 0.05 to 20")
        out[b] = x
    return out


def read_accept_rule(text: str) -> tuple[re.Pattern[str], float]:
    """``--sim-accept-rule REGEX=LENGTH``: prompts matching REGEX accept LENGTH tokens per verify step (at 3 steps)."""
    pattern, sep, length = text.rpartition("=")
    if not sep or not pattern:
        raise ValueError(f"--sim-accept-rule {text!r}: give REGEX=LENGTH, e.g. 'def |class '=3.2")
    try:
        value = float(length)
    except ValueError:
        raise ValueError(f"--sim-accept-rule {text!r}: LENGTH {length!r} is not a number") from None
    if not 1.0 <= value <= CALIBRATION_STEPS + 1:
        raise ValueError(f"--sim-accept-rule {text!r}: LENGTH must be between 1 and {CALIBRATION_STEPS + 1}")
    try:
        return re.compile(pattern), value
    except re.error as exc:
        raise ValueError(f"--sim-accept-rule {text!r}: bad REGEX: {exc}") from None


def read_adaptive_config(text: str) -> dict[int, list[int]]:
    """``--speculative-adaptive-config``: batch sizes (as strings) to ``{"candidate_steps": [...]}``.
    Refused as SGLang refuses it: no integer key, or a candidate list that is not a list of integers >= 0."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("the adaptive config must be a JSON object keyed by batch size")
    tiers: dict[int, list[int]] = {}
    for key, entry in data.items():
        try:
            batch = int(key)
        except ValueError:
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else entry
        if not isinstance(steps, list) or not steps or not all(isinstance(x, int) and x >= 0 for x in steps):
            raise ValueError(f"batch size {key}: candidate_steps must be a non-empty list of integers >= 0 "
                             f"(got {steps!r})")
        tiers[batch] = steps
    if not tiers:
        raise ValueError("the adaptive config has no integer batch-size key")
    return tiers


class BatchLoop:
    """Continuous batching: one loop steps all running requests together."""

    def __init__(self, profile: SimProfile, speculative: bool, max_draft: int, max_running: int, rng: random.Random,
                 tiers: dict[int, list[int]] | None = None, controller: Controller | None = None,
                 speedups: dict[int, float] | None = None) -> None:
        self.profile = profile
        self.speculative = speculative
        self.max_draft = max_draft
        self.max_running = max_running
        self.rng = rng
        self.p = acceptance_probability(profile.accept_length, CALIBRATION_STEPS) if speculative else 0.0
        self.tiers = sorted(tiers.items()) if tiers else None
        self.controller = controller
        self.speedups = speedups if speculative else None
        self._steps_by_batch: dict[int, int] = {}
        self.running: list[SimRequest] = []
        self.waiting: collections.deque[SimRequest] = collections.deque()
        self.wake = asyncio.Event()
        self.hung = False
        self.stall_s = 0.0  # one stall of the whole engine, at its next step (a fault)
        self.total_tokens = 0
        self.total_verify = 0
        self.total_drafted = 0
        self.total_accepted = 0

    def steps_for(self, b: int) -> int:
        """Draft steps for a batch of ``b``: the fixed --speculative-num-steps, or with adaptive tiers the
        candidate of the tier with the largest key <= b (the smallest tier below it) that the model says
        gives the most tokens per second at this batch, as SGLang's adaptive controller aims to."""
        if not self.speculative:
            return 0
        if self.controller is not None:
            return self.controller.steps_for(b)
        if not self.tiers:
            return self.max_draft
        if b not in self._steps_by_batch:
            candidates = self.tiers[0][1]
            for key, steps in self.tiers:
                if key <= b:
                    candidates = steps
            self._steps_by_batch[b] = max(candidates, key=lambda s: expected_throughput(self.profile, b, True, s))
        return self._steps_by_batch[b]

    @property
    def avg_accept_length(self) -> float:
        return self.total_tokens / self.total_verify if self.total_verify else 0.0

    def submit(self, req: SimRequest) -> None:
        self.waiting.append(req)
        self.wake.set()

    async def loop(self) -> None:
        next_t = _perf()
        while True:
            while self.waiting and len(self.running) < self.max_running:
                self.running.append(self.waiting.popleft())
            self.running = [r for r in self.running if not r.cancelled]
            if not self.running or self.hung:
                self.wake.clear()
                await self.wake.wait()
                next_t = _perf()
                continue
            if self.stall_s:
                log.warning("fault: the engine stalls for %.2f s", self.stall_s)
                await asyncio.sleep(self.stall_s)
                self.stall_s, next_t = 0.0, _perf()
            b = len(self.running)
            steps = self.steps_for(b)
            dt = step_time(b, *spec_step_params(self.profile, steps))
            if self.speedups and steps:
                # A profile of speedups by batch: a verify step lasts what makes this batch's speedup the given one
                # (its tokens per step at this draft length, against a plain step's time at the same batch).
                tokens = mean_accept_length(self.p, steps)
                dt = tokens * step_time(b, *spec_step_params(self.profile, 0)) / speedup_at(self.speedups, b)
            next_t = max(next_t + dt, _perf() - 0.05)  # keep the schedule; do not bank lost time
            delay = next_t - _perf()
            await asyncio.sleep(delay if delay > 0 else 0)
            if self.hung:
                continue
            done = []
            accepted = 0
            for r in self.running:
                k = sample_accepted(self.rng, r.p, steps) if steps else 1
                accepted += k - 1  # before the cut at max_tokens: what the verify step accepted
                k = min(k, r.max_tokens - r.emitted)
                r.emitted += k
                r.verify_ct += 1
                self.total_tokens += k
                self.total_verify += 1
                self.total_drafted += steps
                self.total_accepted += k - 1
                r.queue.put_nowait((k, steps))
                if r.emitted >= r.max_tokens:
                    done.append(r)
            if self.controller is not None:
                self.controller.observe(b, steps, accepted / b)
            if done:
                self.running = [r for r in self.running if r.emitted < r.max_tokens]


@dataclass(frozen=True)
class _Ask:
    """A completion request as the simulator answers it."""

    chat: bool
    prompt: str
    max_tokens: int
    end: str
    prompt_tokens: int
    rid: str
    created: int
    model: str
    obj: str
    include_usage: bool
    continuous: bool

    def usage(self, produced: int) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": produced,
                "total_tokens": self.prompt_tokens + produced}


#: Parsed arguments /server_info leaves out (a secret, and objects built from other arguments).
_NOT_SHOWN = frozenset({"api_key", "adaptive_tiers", "adaptive_controller", "accept_rules", "speedups"})


class SimServer:
    def __init__(self, args: argparse.Namespace, ignored: list[str]) -> None:
        self.args = args
        self.ignored = ignored
        self.profile = PROFILES[args.sim_profile]
        self.speculative = bool(args.speculative_algorithm)
        self.max_draft = args.speculative_num_steps if self.speculative else 0
        self.rng = random.Random(args.seed)
        max_running = args.max_running_requests or self.profile.max_running_requests
        self.engine = BatchLoop(self.profile, self.speculative, self.max_draft, max_running, self.rng, args.adaptive_tiers,
                                args.adaptive_controller, args.speedups)
        self.accept_rules = [(rx, acceptance_probability(length, CALIBRATION_STEPS)) for rx, length in args.accept_rules]
        self.prompt_tokens_total = 0
        # A prefix cache as far as the benchmark can see it: a prompt seen since the last flush is a hit.
        self.cached: set[int] = set()
        self.cache_lookups = self.cache_hits = 0
        self.faults = Faults(
            crash_on_start=args.fault_crash_on_start, never_healthy=args.fault_never_healthy,
            die_after=args.fault_die_after, hang_after=args.fault_hang_after, error_rate=args.fault_error_rate,
            cut_rate=args.fault_cut_rate, malformed_rate=args.fault_malformed_rate, stall_s=args.fault_stall_s,
            trickle_s=args.fault_trickle_s,
        )
        self.ready_at = 0.0
        self.requests_started = 0
        self.requests_finished = 0
        self._token_log: collections.OrderedDict[str, list[float]] = collections.OrderedDict()
        self.seq = 0

    # -- helpers ----------------------------------------------------------------------------

    def model_name(self) -> str:
        return self.args.served_model_name or self.args.model_path

    def _new_id(self) -> str:
        self.seq += 1
        return f"sim-{os.getpid()}-{self.seq}"

    def _times(self, rid: str) -> list[float]:
        times: list[float] = []
        self._token_log[rid] = times
        while len(self._token_log) > 20000:
            self._token_log.popitem(last=False)
        return times

    @staticmethod
    def _text(k: int, start: int, prompt: str = "") -> str:
        """Tokens ``start`` to ``start + k`` of the answer to ``prompt`` (the same answer on every server)."""
        salt = zlib.crc32(prompt.encode()) if prompt else 0
        return "".join(" " + _WORDS[(salt + start + i) % len(_WORDS)] for i in range(k))

    def _check_generation_faults(self) -> web.Response | None:
        self.requests_started += 1
        if self.args.fault_engine_stall_after is not None and self.requests_started == self.args.fault_engine_stall_after:
            self.engine.stall_s = self.args.fault_engine_stall_s
        if self.faults.hang_after is not None and self.requests_started > self.faults.hang_after:
            if not self.engine.hung:
                log.warning("fault: generation hangs from now on (health stays 200)")
            self.engine.hung = True
        if self.faults.error_rate and self.rng.random() < self.faults.error_rate:
            return web.json_response({"object": "error", "message": "simulated internal error", "code": 500}, status=500)
        return None

    async def _cold(self) -> None:
        """A freshly started engine: its first requests wait for compiled kernels and cold caches, less
        and less (the first --sim-cold-ttft-s, then linearly down to nothing after N)."""
        n = self.args.sim_cold_requests
        if self.requests_started <= n:
            await asyncio.sleep(self.args.sim_cold_ttft_s * (n - self.requests_started + 1) / n)

    def _finished_one(self) -> None:
        self.requests_finished += 1
        if self.faults.die_after is not None and self.requests_finished == self.faults.die_after:
            log.error("fault: dying after %d requests", self.requests_finished)
            # Once this answer has left (a few ms on a local socket): whatever else is in flight is cut.
            asyncio.get_running_loop().call_later(DIE_FLUSH_S, fault_exit, 1)

    # -- token production ---------------------------------------------------------------------

    def _acceptance(self, prompt: str) -> float:
        """The per-draft acceptance of a request: the first --sim-accept-rule its prompt matches, else the profile's."""
        for rx, p in self.accept_rules:
            if rx.search(prompt):
                return p
        return self.engine.p

    async def _tokens(self, n: int, prompt: str = "") -> AsyncIterator[tuple[int, int]]:
        """Yield (k, d) per engine step until n tokens have been produced: k tokens emitted, d draft tokens
        proposed for it (0 without speculation)."""
        if self.profile.direct:
            interval = self.profile.token_interval_s
            t0 = _perf()
            for i in range(n):
                if interval:
                    delay = t0 + (i + 1) * interval - _perf()
                    if delay > 0:
                        await asyncio.sleep(delay)
                yield 1, 0
            return
        req = SimRequest(self._new_id(), n, p=self._acceptance(prompt) if self.speculative else 0.0)
        self.engine.submit(req)
        try:
            got = 0
            while got < n:
                k, drafted = await req.queue.get()
                got += k
                yield k, drafted
        finally:
            req.cancelled = True
            self.engine.wake.set()

    # -- endpoints ---------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        if self.faults.never_healthy or _perf() < self.ready_at:
            return web.Response(status=503)
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.args.model_path, "tokenizer_path": self.args.model_path,
                                  "is_generation": True})

    async def server_info(self, request: web.Request) -> web.Response:
        args = {k: v for k, v in vars(self.args).items()
                if not k.startswith(("fault_", "sim_")) and k not in _NOT_SHOWN}
        return web.json_response({
            **args,
            "version": self.args.sim_version,
            "sim_profile": self.profile.name,
            "ignored_args": self.ignored,
            "internal_states": [{
                # Cumulative since start, as SGLang's is: take differences around a level.
                "avg_spec_accept_length": self.engine.avg_accept_length if self.speculative else None,
                "last_gen_throughput": 0.0,
                # The adaptive controller's active tier (the draft steps of its last verify step); the fixed steps
                # without it, 0 without speculation.
                "speculative_num_steps": (self.engine.controller.active_steps or self.engine.steps_for(1)
                                          if self.engine.controller is not None else self.max_draft),
            }],
        })

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name(), "object": "model", "created": int(time.time()), "owned_by": "sglang",
             "root": self.model_name()}
        ]})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        only = self.args.fault_tokenize_only
        if only is not None and not isinstance(body.get(only), str):
            # A server that ignores a body field it does not know and counts the empty prompt it is left with.
            return web.json_response({"tokens": [], "count": 0, "max_model_len": 262144})
        text = body.get(only) if only else (body.get("prompt") or body.get("text") or body.get("content") or "")
        n = self.args.fault_tokenize_constant if self.args.fault_tokenize_constant is not None else count_tokens(text)
        return web.json_response({"tokens": list(range(n)), "count": n, "max_model_len": 262144})

    async def token_times(self, request: web.Request) -> web.Response:
        rid = request.query.get("id", "")
        if rid not in self._token_log:
            return web.json_response({"error": f"unknown request id {rid!r}"}, status=404)
        return web.json_response({"id": rid, "clock": "CLOCK_MONOTONIC (time.perf_counter)",
                                  "token_times_s": self._token_log[rid]})

    async def metrics(self, request: web.Request) -> web.Response:
        """SGLang's Prometheus page (``--enable-metrics``): its gauges of the running batch, the queue and
        the KV cache (here: the share of running slots in use), and its cumulative token counters."""
        if not self.args.enable_metrics:
            return web.Response(status=404, text="metrics are off: start with --enable-metrics")
        e, label = self.engine, f'{{model_name="{self.model_name()}"}}'
        rows = [
            ("sglang:num_running_reqs", "gauge", "The number of running requests.", len(e.running)),
            ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", len(e.waiting)),
            ("sglang:token_usage", "gauge", "The token usage.", len(e.running) / e.max_running),
            ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.",
             self.cache_hits / self.cache_lookups if self.cache_lookups else 0.0),
            ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", self.prompt_tokens_total),
            ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", e.total_tokens),
        ]
        if self.speculative:
            rows.append(("sglang:spec_accept_length", "gauge", "The average acceptance length of speculative decoding.",
                         e.avg_accept_length))
        text = "".join(f"# HELP {name} {help_}\n# TYPE {name} {kind}\n{name}{label} {float(value)!r}\n"
                       for name, kind, help_, value in rows)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    def _look_up(self, prompt: str) -> None:
        key = zlib.crc32(prompt.encode())
        self.cache_lookups += 1
        self.cache_hits += key in self.cached
        self.cached.add(key)

    async def flush_cache(self, request: web.Request) -> web.Response:
        """SGLang's /flush_cache: empties the prefix cache (refused while requests run, as SGLang does)."""
        if self.engine.running:
            return web.Response(status=400, text="Cache not flushed: there are running requests.")
        self.cached.clear()
        self.cache_lookups = self.cache_hits = 0
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are running "
                                 "or waiting requests, the operation will not be performed.)\n")

    def _auth(self, request: web.Request) -> web.Response | None:
        if self.args.api_key and request.headers.get("Authorization") != f"Bearer {self.args.api_key}":
            return web.json_response({"error": "invalid API key"}, status=401)
        return None

    async def openai(self, request: web.Request) -> web.StreamResponse:
        """``/v1/completions`` and ``/v1/chat/completions``: the request read (its faults and cold start first),
        then answered whole or streamed."""
        if (denied := self._auth(request)) is not None:
            return denied
        body = await request.json()
        if (fault := self._check_generation_faults()) is not None:
            return fault
        await self._cold()
        ask = self._ask(body, chat=request.path.endswith("/chat/completions"))
        if not body.get("stream"):
            return await self._whole(ask)
        return await self._stream(request, ask, want_spec=bool(body.get("return_spec_tokens_details")) and
                                  self.speculative)

    def _ask(self, body: dict[str, Any], *, chat: bool) -> _Ask:
        """What a completion request asks for: its prompt, how many tokens (up to its natural end unless
        ignore_eos), and the ids and names its answer carries."""
        requested = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        prompt = (" ".join(m.get("content", "") for m in body.get("messages", []) if isinstance(m.get("content"), str))
                  if chat else str(body.get("prompt", "")))
        max_tokens = requested if body.get("ignore_eos", False) else min(requested, natural_length(prompt))
        prompt_tokens = count_tokens(prompt)
        self.prompt_tokens_total += prompt_tokens
        self._look_up(prompt)
        opts = body.get("stream_options") or {}
        return _Ask(chat=chat, prompt=prompt, max_tokens=max_tokens, end="stop" if max_tokens < requested else "length",
                    prompt_tokens=prompt_tokens, rid=self._new_id(), created=int(time.time()),
                    model=body.get("model") or self.model_name(),
                    obj="chat.completion.chunk" if chat else "text_completion",
                    include_usage=bool(opts.get("include_usage")), continuous=bool(opts.get("continuous_usage_stats")))

    async def _whole(self, ask: _Ask) -> web.Response:
        """The answer in one JSON body."""
        produced, text = 0, ""
        async for k, _ in self._tokens(ask.max_tokens, ask.prompt):
            text += self._text(k, produced, ask.prompt)
            produced += k
        self._finished_one()
        choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": ask.end}
                                  if ask.chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": ask.end})
        return web.json_response({"id": ask.rid, "object": "chat.completion" if ask.chat else "text_completion",
                                  "created": ask.created, "model": ask.model, "choices": [choice],
                                  "usage": ask.usage(produced)})

    async def _stream(self, request: web.Request, ask: _Ask, *, want_spec: bool) -> web.StreamResponse:
        """The answer as server-sent events, a token (or a verify step's tokens) at a time, with the faults the
        simulator was asked for (a cut, a malformed line, a stall, a trickle)."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        times = self._times(ask.rid)
        cut_at = self._fault_at(self.faults.cut_rate, ask.max_tokens)
        malformed_at = self._fault_at(self.faults.malformed_rate, ask.max_tokens)
        stall_at = ask.max_tokens // 2 if self.faults.stall_s else None
        out: web.StreamResponse | _Trickle = _Trickle(resp, self.faults.trickle_s) if self.faults.trickle_s else resp
        faulty = cut_at or malformed_at or stall_at or self.faults.trickle_s
        if self.profile.direct and not self.profile.token_interval_s and not faulty:
            await self._instant_stream(resp, ask.rid, ask.obj, ask.created, ask.model, ask.chat, ask.prompt_tokens,
                                       ask.max_tokens, ask.continuous, times, ask.end)
            await self._end(out, ask, ask.max_tokens)
            return resp
        produced = steps = drafted = 0
        async for k, d in self._tokens(ask.max_tokens, ask.prompt):
            text = self._text(k, produced, ask.prompt)
            produced, steps, drafted = produced + k, steps + 1, drafted + d
            await out.write(b"data: " + orjson.dumps(self._event(ask, text, produced, steps, drafted, want_spec))
                            + b"\n\n")
            times.extend([_perf()] * k)
            if malformed_at is not None and produced >= malformed_at:
                malformed_at = None
                await out.write(b'data: {"id": "' + ask.rid.encode() + b'", "choices": [\n\n')
            if cut_at is not None and produced >= cut_at:
                log.warning("fault: cutting request %s off after %d tokens", ask.rid, produced)
                request.transport.close() if request.transport else None
                return resp
            if stall_at is not None and produced >= stall_at:
                stall_at = None
                await asyncio.sleep(self.faults.stall_s)
        await self._end(out, ask, produced)
        return resp

    def _event(self, ask: _Ask, text: str, produced: int, steps: int, drafted: int, want_spec: bool) -> dict[str, Any]:
        """One streamed event: the text of a verify step; the finish reason, and SGLang's speculation figures where
        asked, on the last."""
        finish = ask.end if produced >= ask.max_tokens else None
        choice = ({"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": finish}
                  if ask.chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
        event: dict[str, Any] = {"id": ask.rid, "object": ask.obj, "created": ask.created, "model": ask.model,
                                 "choices": [choice]}
        if ask.continuous:
            event["usage"] = ask.usage(produced)
        if finish and want_spec:
            event["sglext"] = {"spec_tokens_details": self._spec_details(produced, steps, drafted)}
        return event

    async def _end(self, out: web.StreamResponse | _Trickle, ask: _Ask, produced: int) -> None:
        """The stream's end: the usage event where asked, then [DONE]."""
        if ask.include_usage:
            await out.write(b"data: " + orjson.dumps({"id": ask.rid, "object": ask.obj, "created": ask.created,
                                                       "model": ask.model, "choices": [],
                                                       "usage": ask.usage(produced)}) + b"\n\n")
        await out.write(b"data: [DONE]\n\n")
        self._finished_one()

    def _fault_at(self, rate: float, max_tokens: int) -> int | None:
        """The token after which a fault hits this request, or None (it hits a ``rate`` share of requests)."""
        return self.rng.randint(1, max(1, max_tokens - 1)) if rate and self.rng.random() < rate else None

    def _spec_details(self, produced: int, steps: int, proposed: int) -> dict[str, Any]:
        """SGLang's per-request speculation figures (``sglext.spec_tokens_details``): each verify step
        proposes its draft tokens (the batch tier's steps under adaptive speculation, none at 0) and
        accepts all it emits but the bonus token."""
        correct = max(0, produced - steps)
        return {"spec_verify_ct": steps, "spec_num_proposed_drafts": proposed, "spec_num_correct_drafts": correct,
                "spec_accept_length": produced / steps if steps else 0.0,
                "spec_accept_rate": correct / proposed if proposed else 0.0}

    async def _instant_stream(self, resp: web.StreamResponse, rid: str, obj: str, created: int, model: str, chat: bool,
                              prompt_tokens: int, n: int, continuous: bool, times: list[float], end: str) -> None:
        """As fast as the server can: one token per SSE event, events pre-rendered, written 16 at a time
        (what TCP does anyway when a fast server streams to a client that is reading)."""
        head = orjson.dumps({"id": rid, "object": obj, "created": created, "model": model})[:-1]
        field = b'"delta":{"role":"assistant","content":' if chat else b'"text":'
        tail_close = b"}" if chat else b',"logprobs":null'
        batch: list[bytes] = []
        for i in range(n):
            text = orjson.dumps(" " + _WORDS[i % len(_WORDS)])
            finish = b'"%s"' % end.encode() if i == n - 1 else b"null"
            usage = (b',"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}'
                     % (prompt_tokens, i + 1, prompt_tokens + i + 1)) if continuous else b""
            batch.append(b"data: " + head + b',"choices":[{"index":0,' + field + text + tail_close
                         + b',"finish_reason":' + finish + b"}]" + usage + b"}\n\n")
            if len(batch) == 16 or i == n - 1:
                await resp.write(b"".join(batch))
                now = _perf()
                times.extend([now] * len(batch))
                batch.clear()

    async def generate(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._auth(request)) is not None:
            return denied
        body = await request.json()
        if (fault := self._check_generation_faults()) is not None:
            return fault
        sp = body.get("sampling_params") or {}
        requested = int(sp.get("max_new_tokens") or 128)
        max_tokens = requested if sp.get("ignore_eos", False) else min(requested, natural_length(str(body.get("text", ""))))
        end = "stop" if max_tokens < requested else "length"
        prompt_tokens = count_tokens(str(body.get("text", "")))
        self.prompt_tokens_total += prompt_tokens
        self._look_up(str(body.get("text", "")))
        rid = self._new_id()
        text, produced, steps = "", 0, 0

        def meta(done: bool) -> dict[str, Any]:
            m: dict[str, Any] = {"id": rid, "prompt_tokens": prompt_tokens, "completion_tokens": produced,
                                 "cached_tokens": 0, "finish_reason": {"type": end, "length": produced} if done else None}
            if self.speculative:
                m["spec_verify_ct"] = steps
                m["spec_accept_length"] = produced / steps if steps else 0.0
            return m

        if not body.get("stream"):
            async for k, _ in self._tokens(max_tokens, str(body.get("text", ""))):
                text += self._text(k, produced, str(body.get("text", "")))
                produced += k
                steps += 1
            self._finished_one()
            return web.json_response({"text": text, "meta_info": meta(True)})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        times = self._times(rid)
        async for k, _ in self._tokens(max_tokens, str(body.get("text", ""))):
            text += self._text(k, produced, str(body.get("text", "")))
            produced += k
            steps += 1
            await resp.write(b"data: " + orjson.dumps({"text": text, "meta_info": meta(produced >= max_tokens)}) + b"\n\n")
            times.extend([_perf()] * k)
        await resp.write(b"data: [DONE]\n\n")
        self._finished_one()
        return resp


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(prog="specsweep sim", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", "--model", default="moonshotai/Kimi-K2.5")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--tp-size", "--tp", type=int, default=1, dest="tp_size")
    ap.add_argument("--speculative-algorithm", default=None, choices=["EAGLE", "EAGLE3", "NEXTN", "MTP", None])
    ap.add_argument("--speculative-draft-model-path", default=None)
    ap.add_argument("--speculative-num-steps", type=int, default=3)
    ap.add_argument("--speculative-eagle-topk", type=int, default=1)
    ap.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    ap.add_argument("--max-running-requests", type=int, default=None)
    ap.add_argument("--speculative-adaptive", action="store_true",
                    help="a MODEL of SGLang's documented adaptive controller (not evidence about SGLang): tiers of "
                         "draft steps moved by an average of accepted drafts, per batch-size band (EAGLE/EAGLE3 with "
                         "--speculative-eagle-topk 1)")
    ap.add_argument("--speculative-adaptive-config", default=None, metavar="FILE",
                    help='JSON, the controller\'s keys: {"candidate_steps": [1, 3, 7], "ema_alpha": 0.2, '
                         '"update_interval": 5, "warmup_batches": 10, "down_hysteresis": -0.25, "up_hysteresis": 0.0, '
                         '"batch_size_bands": [[1, 64, [1, 3, 7]], [64, null, [1, 2, 5]]]}; or a table by batch '
                         'size as the tune writes it: {"1": {"candidate_steps": [3]}, "8": {"candidate_steps": [0]}} '
                         '(0 = no speculation)')
    ap.add_argument("--enable-metrics", action="store_true", help="serve Prometheus metrics at /metrics")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--ssl-keyfile", default=None, help="serve TLS with this key (as SGLang and vLLM do)")
    ap.add_argument("--ssl-certfile", default=None, help="... and this certificate")
    ap.add_argument("--sim-profile", default="kimi-k2.5-int4-8x-rtx-pro-6000", choices=sorted(PROFILES))
    ap.add_argument("--startup-s", type=float, default=3.0,
                    help="seconds until healthy: 60%% loading (refused), 40%% warm-up (503)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fault-crash-on-start", action="store_true", help="exit 1 while loading weights")
    ap.add_argument("--fault-never-healthy", action="store_true", help="/health answers 503 forever")
    ap.add_argument("--fault-die-after", type=int, default=None, metavar="N",
                    help="exit abruptly once the N-th request's answer has left")
    ap.add_argument("--fault-hang-after", type=int, default=None, metavar="N",
                    help="generation hangs after N requests; /health stays 200")
    ap.add_argument("--fault-error-rate", type=float, default=0.0, help="fraction of requests answered 500")
    ap.add_argument("--fault-cut-rate", type=float, default=0.0, help="fraction of streams cut off mid-way")
    ap.add_argument("--fault-malformed-rate", type=float, default=0.0, help="fraction of streams with a malformed SSE line")
    ap.add_argument("--sim-cold-requests", type=int, default=0, metavar="N",
                    help="the first N generations after the start are slow: the first waits --sim-cold-ttft-s "
                    "before its first token, the next ones less and less")
    ap.add_argument("--sim-cold-ttft-s", type=float, default=0.2)
    ap.add_argument("--sim-version", default=VERSION, help="the version /server_info reports (a test plays an "
                    "engine upgrade with it)")
    ap.add_argument("--sim-speedup", action="append", default=[], metavar="BATCH=SPEEDUP",
                    help="with speculation: its speedup over the baseline at this batch size (repeat for a profile; "
                    "log-linear between, flat beyond), in place of the profile's own")
    ap.add_argument("--sim-accept-rule", action="append", default=[], metavar="REGEX=LENGTH",
                    help="requests whose prompt matches REGEX accept LENGTH tokens per verify step at 3 draft steps "
                         "(the first rule that matches; the profile's figure otherwise): traffic whose acceptance "
                         "shifts by phase")
    ap.add_argument("--fault-stall-s", type=float, default=0.0, help="pause every stream this long half-way")
    ap.add_argument("--fault-trickle-s", type=float, default=0.0, metavar="S",
                    help="send streams one byte at a time, S seconds apart: every read gets data quickly, "
                         "the whole answer takes far longer than any request timeout")
    ap.add_argument("--fault-engine-stall-after", type=int, default=None, metavar="N",
                    help="once, as the N-th generation request arrives, the whole engine stalls (every stream waits) "
                         "for --fault-engine-stall-s")
    ap.add_argument("--fault-engine-stall-s", type=float, default=1.0)
    ap.add_argument("--fault-tokenize-only", default=None, metavar="FIELD",
                    help="/tokenize reads only this body field (prompt, text or content) and answers any other body "
                         "with a count of 0, as a server that ignores a field it does not know")
    ap.add_argument("--fault-tokenize-constant", type=int, default=None, metavar="N",
                    help="/tokenize answers N tokens for any text")
    ap.add_argument("--fault-once-file", default=None, metavar="PATH",
                    help="apply the faults only while PATH does not exist; create it when one fires "
                         "(the next start runs clean: rehearse a retry)")
    args, unknown = ap.parse_known_args(argv)
    if args.speculative_algorithm and args.speculative_eagle_topk == 1 and args.speculative_num_draft_tokens not in (
        None, args.speculative_num_steps + 1
    ):
        ap.error("with --speculative-eagle-topk 1, --speculative-num-draft-tokens must be --speculative-num-steps + 1")
    args.adaptive_tiers = args.adaptive_controller = None
    try:
        args.speedups = read_speedups(args.sim_speedup)
    except ValueError as exc:
        ap.error(str(exc))
    try:
        args.accept_rules = [read_accept_rule(rule) for rule in args.sim_accept_rule]
    except ValueError as exc:
        ap.error(str(exc))
    if args.speculative_adaptive:
        if args.speculative_algorithm not in ("EAGLE", "EAGLE3") or args.speculative_eagle_topk != 1:
            ap.error("--speculative-adaptive needs --speculative-algorithm EAGLE or EAGLE3 with --speculative-eagle-topk 1")
        try:
            text = "{}"
            if args.speculative_adaptive_config:
                with open(args.speculative_adaptive_config, encoding="utf-8") as f:
                    text = f.read()
            if text == "{}" or is_controller_config(text):
                args.adaptive_controller = controller_from(json.loads(text), args.speculative_num_steps)
            else:
                args.adaptive_tiers = read_adaptive_config(text)
        except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
            ap.error(f"--speculative-adaptive-config {args.speculative_adaptive_config}: {exc}")
    return args, unknown


async def serve(args: argparse.Namespace, ignored: list[str]) -> None:
    sim = SimServer(args, ignored)
    log.info("specsweep sim %s: profile %s (%s), speculation %s, max running requests %d",
             VERSION, sim.profile.name, sim.profile.description, args.speculative_algorithm or "off", sim.engine.max_running)
    if args.adaptive_controller:
        log.info("adaptive speculation (a model of SGLang's documented controller): bands %s",
                 ", ".join(f"[{b.lo}, {b.hi}): {b.steps}" for b in args.adaptive_controller.bands))
    if args.adaptive_tiers:
        log.info("adaptive speculation: candidate steps by batch size %s",
                 ", ".join(f"{b}+: {steps}" for b, steps in sorted(args.adaptive_tiers.items())))
    if ignored:
        log.info("ignored SGLang arguments (accepted, no effect in the simulator): %s", " ".join(ignored))
    log.info("Load weight begin. model %s, tp %d", args.model_path, args.tp_size)
    load_s, warm_s = args.startup_s * 0.6, args.startup_s * 0.4
    await asyncio.sleep(load_s)
    if args.fault_crash_on_start:
        log.error("fault: RuntimeError: CUDA error: out of memory while loading weights (simulated crash)")
        fault_exit(1)
    log.info("Load weight end. KV cache allocated; capturing CUDA graphs")
    app = web.Application(client_max_size=64 * 1024 * 1024)
    r = app.router
    r.add_get("/health", sim.health)
    r.add_get("/health_generate", sim.health)
    r.add_get("/get_model_info", sim.model_info)
    r.add_get("/model_info", sim.model_info)
    r.add_get("/get_server_info", sim.server_info)
    r.add_get("/server_info", sim.server_info)
    r.add_get("/v1/models", sim.models)
    r.add_post("/v1/completions", sim.openai)
    r.add_post("/v1/chat/completions", sim.openai)
    r.add_post("/generate", sim.generate)
    r.add_post("/tokenize", sim.tokenize)
    r.add_post("/flush_cache", sim.flush_cache)
    r.add_get("/sim/token_times", sim.token_times)
    r.add_get("/metrics", sim.metrics)
    # On a stop, requests still in flight get a second to end (aiohttp would wait a minute for them).
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    tls = None
    if args.ssl_certfile:
        import ssl
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
    site = web.TCPSite(runner, args.host, args.port, backlog=4096, reuse_address=True, ssl_context=tls)
    await site.start()
    sim.ready_at = _perf() + warm_s
    engine_task = asyncio.create_task(sim.engine.loop())
    await asyncio.sleep(warm_s)
    if args.fault_never_healthy:
        log.warning("fault: /health will answer 503 forever")
    else:
        log.info("The server is fired up and ready to roll!")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("received a stop signal: shutting down")
    engine_task.cancel()
    await runner.cleanup()


_ONCE_FILE: str | None = None


#: How long the dying fault lets the N-th answer leave before the process exits.
DIE_FLUSH_S = 0.01


def fault_exit(code: int) -> None:
    """Exit abruptly for a fault, noting it in the once-file if there is one."""
    if _ONCE_FILE:
        with contextlib.suppress(OSError), \
                os.fdopen(os.open(_ONCE_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w") as f:
            f.write("a fault fired\n")
    sys.stdout.flush()
    os._exit(code)


def once_file_folders() -> list[str]:
    """Where --fault-once-file may be: the temporary folder, or the user's ~/.specsweep (the simulator's own
    places), links resolved. It creates the file: anywhere else it could plant one (a policy file)."""
    return [os.path.realpath(tempfile.gettempdir()), os.path.realpath(os.path.expanduser("~/.specsweep"))]


def _apply_once_file(args: argparse.Namespace) -> None:
    """With --fault-once-file: no faults once the file exists (an earlier start already failed)."""
    global _ONCE_FILE
    path = args.fault_once_file
    if not path:
        return
    real = os.path.realpath(path)
    if not any(real.startswith(folder + "/") for folder in once_file_folders()):
        raise SystemExit(f"specsweep sim: --fault-once-file {path}: give a file in {' or '.join(once_file_folders())}")
    if os.path.exists(path):
        log.info("fault once-file %s exists: running without faults", path)
        for name, value in list(vars(args).items()):
            if name.startswith("fault_") and name != "fault_once_file":
                setattr(args, name, False if isinstance(value, bool) else 0.0 if isinstance(value, float) else None)
        return
    _ONCE_FILE = path


#: More arguments from the host's environment, after the command's own (a later one wins): a test host plays other
#: hardware, or an engine that differs, whatever command the run sends it.
HOST_ARGS_ENV = "SPECSWEEP_SIM_HOST_ARGS"


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", stream=sys.stdout)
    argv = list(sys.argv[1:] if argv is None else argv)
    if host_args := shlex.split(os.environ.get(HOST_ARGS_ENV, "")):
        logging.info("this host's own arguments (%s): %s", HOST_ARGS_ENV, " ".join(host_args))
    args, ignored = parse_args(argv + host_args)
    _apply_once_file(args)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args, ignored))


if __name__ == "__main__":
    main()
