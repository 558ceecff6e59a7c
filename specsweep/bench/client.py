"""Stream one request and record what arrived, when.

The timed path uses specsweep's minimal HTTP/1.1 client (``specsweep.server.http1``): requests are bytes
prepared before the level, connections are opened before the clock starts, and each read
is stamped with the kernel's receive time. General clients cost more per request than a
streamed token's budget allows (see benchmarks/client_speed.py); everything outside the
timed path uses httpx.

One function per wire format rather than per engine: OpenAI completions, OpenAI chat,
and the native /generate; what an engine adds to requests, and where its answers carry
speculation figures, comes from its module (``specsweep.engines``). Timing is taken when bytes arrive from the network, so
events that arrive in one read share a timestamp (as they reached the client together).
Tokens per chunk come from the server's running usage count when it sends one
(``continuous_usage_stats``, /generate's ``meta_info``); otherwise one per chunk, rescaled
to the final ``usage`` when that differs, so that ITL under speculation is per token.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import time
from typing import Any

import orjson

from specsweep import engines
from specsweep.bench.config import RequestSpec
from specsweep.bench.workload import Prompt
from specsweep.records import RequestRecord
from specsweep.server.http1 import ConnectionLost, HTTPStatusError, Pool, ProtocolError

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "generate": "/generate"}
_perf = time.perf_counter


def request_body(opts: RequestSpec, prompt: Prompt, output_len: int, model: str | None,
                 engine: str = engines.CUSTOM) -> dict[str, Any]:
    """The JSON body of one streamed request, with what the engine asks to be sent (its per-request
    speculation figures, where it has them). ``output_len`` caps the prompt's own output length."""
    max_tokens = min(output_len, prompt.max_tokens) if prompt.max_tokens else output_len
    ignore_eos = bool(opts.ignore_eos)
    if opts.path_kind == "generate":
        body: dict[str, Any] = {
            "text": prompt.text,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": opts.temperature, "top_p": opts.top_p,
                                "ignore_eos": ignore_eos},
            "stream": True,
        }
    else:
        body = {
            "max_tokens": max_tokens,
            "temperature": opts.temperature,
            "top_p": opts.top_p,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "ignore_eos": ignore_eos,
        }
        if model:
            body["model"] = model
        body.update(engines.request_fields(engine))
        if opts.path_kind == "chat":
            body["messages"] = [{"role": role, "content": content}
                                for role, content in (prompt.messages or (("user", prompt.text),))]
        else:
            body["prompt"] = prompt.text
    body.update(opts.extra_body)
    return body


def _spread(total: int, n: int) -> list[int]:
    base, extra = divmod(total, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


#: The longest SSE line (one event) and the most bytes of one streamed answer the client takes.
MAX_EVENT = 1 << 20
MAX_STREAM = 64 << 20


class _Parser:
    """Incremental SSE parser for one response: each byte is scanned for line ends once, a line is at most
    MAX_EVENT and the whole answer at most MAX_STREAM bytes (a ProtocolError past either)."""

    __slots__ = ("endpoint", "rec", "buf", "done", "malformed", "usage_tokens", "running", "gen_text_len", "gen_tokens",
                 "read_engine_fields", "received", "text_hash")

    def __init__(self, endpoint: str, rec: RequestRecord, read_engine_fields: engines.EventReader) -> None:
        self.endpoint = endpoint
        self.read_engine_fields = read_engine_fields
        self.rec = rec
        self.buf = b""
        self.done = False
        self.malformed = 0
        self.usage_tokens: int | None = None
        self.running: int | None = None  # last running completion_tokens seen
        self.gen_text_len = 0
        self.gen_tokens = 0
        self.received = 0
        self.text_hash = hashlib.blake2b(digest_size=8)  # of the generated text, as it arrives

    def feed(self, data: bytes, now: float) -> None:
        self.received += len(data)
        if self.received > MAX_STREAM:
            raise ProtocolError(f"the streamed answer passed {MAX_STREAM >> 20} MiB")
        if b"\n" not in data:  # the line goes on: only the new bytes are scanned
            self.buf += data
            if len(self.buf) > MAX_EVENT:
                raise ProtocolError(f"an event line longer than {MAX_EVENT >> 10} KiB")
            return
        lines = (self.buf + data).split(b"\n")
        self.buf = lines.pop()
        if len(self.buf) > MAX_EVENT or any(len(line) > MAX_EVENT for line in lines):
            raise ProtocolError(f"an event line longer than {MAX_EVENT >> 10} KiB")
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # blank lines, comments (": ping"), event names
            payload = line[5:].strip()
            if not payload:
                continue
            if payload == b"[DONE]":
                self.done = True
                continue
            try:
                event = orjson.loads(payload)
            except orjson.JSONDecodeError as exc:
                if "UTF-8" in str(exc):
                    raise ProtocolError(f"an event is not valid UTF-8 ({exc})") from None
                self.malformed += 1
                continue
            if not isinstance(event, dict):
                self.malformed += 1
                continue
            self._event(event, now)

    def _event(self, ev: dict[str, Any], now: float) -> None:
        rec = self.rec
        if rec.response_id is None:
            rid = ev.get("id") or (ev.get("meta_info") or {}).get("id")
            rec.response_id = str(rid) if rid is not None else None
        if self.endpoint == "generate":
            text = ev.get("text") or ""
            meta = ev.get("meta_info") or {}
            tokens = meta.get("completion_tokens")
            new_text = len(text) > self.gen_text_len
            if new_text and isinstance(text, str):  # /generate sends the whole text so far
                self.text_hash.update(text[self.gen_text_len:].encode())
            k = (tokens - self.gen_tokens) if isinstance(tokens, int) else (1 if new_text else 0)
            if k > 0 or new_text:
                self._chunk(now, max(k, 1))
            self.gen_text_len = max(self.gen_text_len, len(text))
            if isinstance(tokens, int):
                self.gen_tokens = tokens
                self.usage_tokens = tokens
            self.read_engine_fields(ev, rec)
            if isinstance(meta.get("prompt_tokens"), int):
                rec.prompt_tokens, rec.prompt_tokens_exact = meta["prompt_tokens"], True
            if finish := meta.get("finish_reason"):
                self.done = True
                kind = finish.get("type") if isinstance(finish, dict) else finish
                rec.finish_reason = str(kind) if kind is not None else None
            return
        usage = ev.get("usage")
        choices = ev.get("choices")
        text = None
        if choices:
            if not isinstance(choices, list) or not isinstance(choices[0], dict):
                raise ProtocolError(f"an event's 'choices' is not a list of objects: {str(choices)[:80]}")
            c0 = choices[0]
            text = c0.get("text") if self.endpoint == "completions" else (c0.get("delta") or {}).get("content")
            if isinstance(c0.get("finish_reason"), str):
                rec.finish_reason = c0["finish_reason"]
            if isinstance(text, str):
                self.text_hash.update(text.encode())
        running = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if text:
            if isinstance(running, int) and self.running is not None:
                k = running - self.running
            elif isinstance(running, int):
                k = running
            else:
                k = 1
            self._chunk(now, max(k, 1))
        if isinstance(running, int):
            self.running = running
            self.usage_tokens = running
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            rec.prompt_tokens, rec.prompt_tokens_exact = usage["prompt_tokens"], True
        self.read_engine_fields(ev, rec)

    def _chunk(self, now: float, k: int) -> None:
        rec = self.rec
        if rec.first_token_s is None:
            rec.first_token_s = now
        rec.last_token_s = now
        rec.chunk_times_s.append(now)
        rec.chunk_tokens.append(k)

    def finish(self) -> None:
        rec = self.rec
        rec.output_digest = self.text_hash.hexdigest() if rec.chunk_tokens else None
        chunks = len(rec.chunk_tokens)
        if self.usage_tokens is not None:
            rec.output_tokens = self.usage_tokens
            rec.output_tokens_source = "meta_info" if self.endpoint == "generate" else "usage"
            if chunks and sum(rec.chunk_tokens) != self.usage_tokens and self.running is None:
                # No running count: spread the server's total over the chunks that carried text.
                rec.chunk_tokens = _spread(self.usage_tokens, chunks)
        else:
            rec.output_tokens = sum(rec.chunk_tokens)
            rec.output_tokens_source = "chunks"


def _os_error(exc: OSError) -> tuple[str, str]:
    """A plain OSError is named by its errno (EHOSTUNREACH: "No route to host"), not just "OSError"."""
    name = type(exc).__name__
    if type(exc) is OSError and exc.errno is not None and exc.errno in errno.errorcode:
        return errno.errorcode[exc.errno], f"{os.strerror(exc.errno)}: {exc}"
    return name, str(exc) or name


async def stream_request(pool: Pool, raw: bytes, rec: RequestRecord, endpoint: str, timeout_s: float,
                         read_engine_fields: engines.EventReader | None = None) -> RequestRecord:
    """Send one streamed request (``raw``: the whole HTTP request, prepared) and fill ``rec``.

    Errors become fields of the record, never exceptions (except cancellation, which
    keeps the partial record and propagates).
    """
    parser = _Parser(endpoint, rec, read_engine_fields or engines.EventReader(engines.CUSTOM))

    def sent() -> None:
        rec.sent_s = _perf()

    try:
        async with asyncio.timeout(timeout_s):
            await pool.request(raw, parser.feed, sent)
        rec.status_code = 200
        if parser.buf.strip():
            parser.feed(b"\n", _perf())
        if not parser.done:
            rec.error_type, rec.error_message = "CutOff", "the stream ended before its final event ([DONE])"
        elif parser.malformed:
            rec.error_type = "MalformedSSE"
            rec.error_message = f"{parser.malformed} event(s) were not valid JSON"
    except ProtocolError as exc:
        rec.error_type, rec.error_message = "ProtocolError", str(exc)
    except HTTPStatusError as exc:
        rec.status_code = exc.status
        rec.error_type, rec.error_message = "HTTPStatus", str(exc)
    except TimeoutError:
        rec.error_type, rec.error_message = "Timeout", f"no complete answer within {timeout_s:g} s"
    except ConnectionLost as exc:
        rec.error_type = "CutOff" if rec.chunk_times_s else "ConnectionLost"
        rec.error_message = str(exc)
    except OSError as exc:
        rec.error_type, rec.error_message = _os_error(exc)
    except asyncio.CancelledError:
        rec.error_type, rec.error_message = "Cancelled", "the level was cancelled"
        rec.end_s = _perf()
        parser.finish()
        raise
    if rec.sent_s is None:
        rec.sent_s = rec.scheduled_s
    rec.end_s = _perf()
    parser.finish()
    return rec
