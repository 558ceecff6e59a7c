"""The server's HTTP API outside the timed load: one client, one place for the auth header.

Health checks, the readiness probe, ``/v1/models``, ``/tokenize``, ``/metrics`` and the
server-info endpoints all go through ``ServerAPI``. Every call is bounded as a whole (not per
read: a server that trickles an answer byte by byte is cut at the call's deadline) and so is
every answer's size; a call that gets no usable answer raises ``NoAnswer`` (the project's own
error: nothing of the HTTP library escapes), or returns None where "nothing" is an answer.

The timed path (the load generator's streamed requests) uses the minimal client in ``http1``
(so do the thousands of ``/tokenize`` calls of prompt preparation); ``bearer`` is its auth header.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import httpx
import orjson
from pydantic import SecretStr

from specsweep import engines
from specsweep.errors import NoAnswer
from specsweep.server import engine_metrics
from specsweep.server.http1 import Pool, bearer

#: The most an answer outside the timed load may hold (a /metrics page of a large server is ~1 MiB).
MAX_ANSWER_BYTES = 16 * 1024 * 1024
#: The most finding the /tokenize form may take, all probes together, and one probe; counting a prompt set
#: may take this plus a little per prompt. Past them, counts are approximate (and labelled so).
TOKENIZE_DETECT_S = 15.0
TOKENIZE_CALL_S = 10.0
TOKENIZE_PER_TEXT_S = 0.01


class Answer:
    __slots__ = ("status", "body")

    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body

    def json(self) -> Any:
        """The body as JSON, or None when it is not JSON."""
        try:
            return orjson.loads(self.body) if self.body else None
        except orjson.JSONDecodeError:
            return None


#: Texts whose token counts tell whether a /tokenize body form is understood (see ``tokenize_form``).
_PROBE_TEXT = "the quick brown fox jumps over the lazy dog"
_PROBE_REPEATS = 4


def plausible_count(n: int, text: str) -> bool:
    """A token count a real tokenizer could give a non-empty text: at least one, and no more than its
    bytes plus a few special tokens."""
    return 1 <= n <= len(text.encode()) + 8


def counts_agree(one: int, repeated: int, times: int) -> bool:
    """The count of a text repeated ``times`` times, against the text's own: about ``times`` as many
    (special tokens are added once, and pieces may merge across the joins)."""
    return repeated > one and (times - 1) * one - 8 <= repeated <= times * one + 8


class ServerAPI:
    """The server's API: an HTTP client bound to one base URL and API key. Use as an async context
    manager, or call ``aclose``. ``timeout_s``: the most one call may take, whole."""

    def __init__(self, base_url: str, api_key: SecretStr | None = None, *, timeout_s: float = 10.0,
                 connect_timeout_s: float = 2.0, known: dict[str, Any] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._headers = bearer(api_key)
        self._client = httpx.AsyncClient(
            base_url=self.base_url, headers=self._headers,
            timeout=httpx.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s)),
            limits=httpx.Limits(max_connections=8, max_keepalive_connections=8),
        )
        # What the server said of its optional endpoints, shared by the caller across instances for one server:
        # "tokenize_form" (which engine's /tokenize body it understands, -1: none), "cache_resets" (paths to try).
        self.known: dict[str, Any] = {} if known is None else known

    async def __aenter__(self) -> ServerAPI:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- one bounded call ----------------------------------------------------------------------

    async def call(self, method: str, path: str, *, json: Any = None, timeout_s: float | None = None) -> Answer:
        """One request, its whole answer read within ``timeout_s`` (default the client's) and at most
        MAX_ANSWER_BYTES; NoAnswer otherwise."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        what = f"{method} {self.base_url}{path}"
        try:
            async with asyncio.timeout(limit):
                async with self._client.stream(method, path, json=json) as response:
                    body = bytearray()
                    async for chunk in response.aiter_raw():
                        body += chunk
                        if len(body) > MAX_ANSWER_BYTES:
                            raise NoAnswer(f"{what}: the answer is larger than {MAX_ANSWER_BYTES >> 20} MiB: not read")
                    return Answer(response.status_code, bytes(body))
        except TimeoutError:
            raise NoAnswer(f"{what}: no whole answer within {limit:g} s") from None
        except httpx.ConnectError as exc:
            raise NoAnswer(f"{what}: connection refused ({exc})", refused=True) from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            # Closed at once (a tunnel whose far end cannot connect) or mid-answer.
            raise NoAnswer(f"{what}: the connection closed ({type(exc).__name__}: {exc})", refused=True) from None
        except httpx.HTTPError as exc:
            raise NoAnswer(f"{what}: {type(exc).__name__}: {exc}") from None

    async def _maybe(self, method: str, path: str, **kwargs: Any) -> Answer | None:
        try:
            return await self.call(method, path, **kwargs)
        except NoAnswer:
            return None

    # -- readiness --------------------------------------------------------------------------

    async def status(self, path: str, *, timeout_s: float | None = None) -> int:
        """The HTTP status of a GET (NoAnswer when there is none)."""
        return (await self.call("GET", path, timeout_s=timeout_s)).status

    async def probe(self, path: str, *, timeout_s: float = 60.0) -> str | None:
        """One tiny generation at ``path``; None when it worked, else why not."""
        body: dict[str, Any] = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
        if path.endswith("/generate"):
            body = {"text": "Hello", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        elif path.endswith("/chat/completions"):
            body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1, "temperature": 0}
        try:
            answer = await self.call("POST", path, json=body, timeout_s=timeout_s)
        except NoAnswer as exc:
            return f"probe failed: {exc}"
        return None if answer.status == 200 else f"probe answered {answer.status}"

    # -- what the server says about itself ---------------------------------------------------

    async def get_json(self, path: str) -> dict[str, Any] | None:
        """A JSON object from a GET, or None (no answer, not 200, not a JSON object)."""
        answer = await self._maybe("GET", path)
        data = answer.json() if answer is not None and answer.status == 200 else None
        return data if isinstance(data, dict) else None

    async def post_json(self, path: str, body: dict[str, Any], *, timeout_s: float | None = None) -> dict[str, Any] | None:
        """A JSON object from a POST, or None (no answer, not 200, not a JSON object)."""
        answer = await self._maybe("POST", path, json=body, timeout_s=timeout_s)
        data = answer.json() if answer is not None and answer.status == 200 else None
        return data if isinstance(data, dict) else None

    async def first_model(self) -> str | None:
        """The id of the first model in ``/v1/models``."""
        data = await self.get_json("/v1/models")
        models = data.get("data") if data else None
        if isinstance(models, list) and models and isinstance(models[0], dict) and isinstance(models[0].get("id"), str):
            return str(models[0]["id"])
        return None

    async def reset_prefix_cache(self, paths: Sequence[str]) -> str | None:
        """Empty the server's prefix cache through the first of ``paths`` (POST) it answers with 2xx; the path
        that did it, or None (no such endpoint, or refused). A path it never answers (a server that leaves unknown
        paths hanging) ends the tries: the next would wait as long."""
        for path in self.known.get("cache_resets", paths):
            try:
                answer: Answer | None = await self.call("POST", path, timeout_s=min(self.timeout_s, 30.0))
            except NoAnswer as exc:
                if not exc.refused:
                    break
                answer = None
            if answer is not None and 200 <= answer.status < 300:
                self.known["cache_resets"] = [path]
                return path
        self.known.setdefault("cache_resets", [])  # none works here: not asked (nor waited on) again
        return None

    async def metrics_text(self) -> str | None:
        """The Prometheus page at ``/metrics``, or None."""
        answer = await self._maybe("GET", "/metrics")
        return answer.body.decode("utf-8", errors="replace") if answer is not None and answer.status == 200 else None

    async def engine_snapshot(self) -> dict[str, float]:
        """The engine's ``/metrics`` in specsweep's vocabulary (``engine_metrics.snapshot``); empty when
        it serves none."""
        text = await self.metrics_text()
        return engine_metrics.snapshot(text) if text else {}

    # -- tokenizer ---------------------------------------------------------------------------

    def _tokenize_body(self, form: int, text: str) -> dict[str, Any]:
        return engines.tokenize_bodies()[form](text) or {}

    @staticmethod
    def _count_of(data: Any) -> int | None:
        if isinstance(data, dict):
            if isinstance(data.get("count"), int) and not isinstance(data["count"], bool):
                return int(data["count"])
            if isinstance(data.get("tokens"), list):
                return len(data["tokens"])
        return None

    async def _tokenize(self, form: int, text: str) -> int | None:
        """The count a form gives; None when the answer makes no count. A /tokenize that never answers raises
        NoAnswer (the detection then stops: every other form would wait as long)."""
        try:
            answer = await self.call("POST", "/tokenize", json=self._tokenize_body(form, text), timeout_s=TOKENIZE_CALL_S)
        except NoAnswer as exc:
            if not exc.refused:
                raise
            return None
        return self._count_of(answer.json()) if answer.status == 200 else None

    async def tokenize_form(self) -> int | None:
        """Which /tokenize body this server understands (each engine's module gives its own), found once: a
        form counts only when it gives a known text a plausible positive count, and the same text repeated
        about as many times as many tokens. A server that answers a form it does not know with a count of 0,
        or with one count for everything, is not believed. None: no form makes sense (counts are then
        approximate)."""
        if "tokenize_form" not in self.known:
            self.known["tokenize_form"] = -1
            repeated = " ".join([_PROBE_TEXT] * _PROBE_REPEATS)
            with contextlib.suppress(TimeoutError, NoAnswer):  # a server that never finishes an answer: approximate
                async with asyncio.timeout(TOKENIZE_DETECT_S):
                    for form in range(len(engines.tokenize_bodies())):
                        one = await self._tokenize(form, _PROBE_TEXT)
                        if one is None or not plausible_count(one, _PROBE_TEXT):
                            continue
                        many = await self._tokenize(form, repeated)
                        if many is not None and plausible_count(many, repeated) and \
                                counts_agree(one, many, _PROBE_REPEATS):
                            self.known["tokenize_form"] = form
                            break
        form = self.known["tokenize_form"]
        return None if form < 0 else form

    async def count_tokens(self, text: str) -> int | None:
        """Tokens in ``text`` by the server's ``/tokenize``; None when it has no tokenizer that makes sense."""
        counts = await self.count_tokens_many([text])
        return counts[0] if counts else None

    async def count_tokens_many(self, texts: Sequence[str], *, concurrency: int = 8) -> list[int] | None:
        """Tokens in each text by the server's ``/tokenize`` (in the form ``tokenize_form`` found), sent
        ``concurrency`` at a time. None when the server has no tokenizer that makes sense, or when any
        count is not a plausible one for its text: then no count is taken as exact."""
        if not texts:
            return []
        form = await self.tokenize_form()
        if form is None:
            return None
        # Thousands of calls: through the load generator's own HTTP/1.1 client (prepared bytes, kept-alive
        # connections), about ten times cheaper per call than a general client.
        pool = Pool(self.base_url, concurrency)

        async def one(text: str) -> int | None:
            body = bytearray()

            def take(data: bytes, _t: float) -> None:
                body.extend(data)
                if len(body) > MAX_ANSWER_BYTES:
                    raise ValueError("the /tokenize answer is too large")

            try:
                async with asyncio.timeout(TOKENIZE_CALL_S):
                    await pool.request(pool.request_bytes("/tokenize", orjson.dumps(self._tokenize_body(form, text)),
                                                          self._headers), take)
                n = self._count_of(orjson.loads(body))
            except Exception:  # noqa: BLE001 - once more through the general client: a blip, or an odd answer
                try:
                    n = await self._tokenize(form, text)
                except NoAnswer:
                    n = None
            return n if n is not None and (plausible_count(n, text) or not text) else None

        try:
            async with asyncio.timeout(TOKENIZE_DETECT_S + TOKENIZE_PER_TEXT_S * len(texts)):
                counts = await asyncio.gather(*(one(t) for t in texts))
        except TimeoutError:
            return None  # counted approximately, and labelled so
        finally:
            pool.close()
        return None if any(n is None for n in counts) else [int(n) for n in counts if n is not None]
