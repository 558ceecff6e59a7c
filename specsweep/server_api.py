"""The server's HTTP API outside the timed path: one client, one place for the auth header.

Health checks, the readiness probe, ``/v1/models``, ``/tokenize``, ``/metrics`` and the
server-info endpoints all go through ``ServerAPI``. The timed path (the load generator's
streamed requests) has its own minimal client (``bench.http1``) and takes only the auth
header from here (``bearer``). Whatever the traffic path to the server is, it is the
``base_url`` given here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import httpx
import orjson
from pydantic import SecretStr

from specsweep import engine_metrics


def bearer(api_key: SecretStr | None) -> dict[str, str]:
    """The request header that carries an API key (none without one)."""
    return {"Authorization": f"Bearer {api_key.get_secret_value()}"} if api_key else {}


def reason(exc: BaseException) -> str:
    """Why a request got no answer, in words."""
    if isinstance(exc, httpx.ConnectError):
        return "connection refused"
    if isinstance(exc, httpx.TimeoutException):
        return "no answer (timeout)"
    return f"{type(exc).__name__}: {exc}"


class ServerAPI:
    """The server's API: an httpx client bound to one base URL and API key. Use as an async
    context manager, or call ``aclose``."""

    def __init__(self, base_url: str, api_key: SecretStr | None = None, *, timeout_s: float = 10.0,
                 connect_timeout_s: float = 2.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = bearer(api_key)
        self._client = httpx.AsyncClient(
            base_url=self.base_url, headers=bearer(api_key),
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=8, max_keepalive_connections=8),
        )
        self._tokenize_field: str | None = None  # the /tokenize body this server takes ("": none)

    async def __aenter__(self) -> ServerAPI:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- readiness --------------------------------------------------------------------------

    async def status(self, path: str) -> int:
        """The HTTP status of a GET (raises httpx.HTTPError when there is no answer)."""
        return (await self._client.get(path)).status_code

    async def probe(self, path: str) -> str | None:
        """One tiny generation at ``path``; None when it worked, else why not."""
        body: dict[str, Any] = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
        if path.endswith("/generate"):
            body = {"text": "Hello", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        elif path.endswith("/chat/completions"):
            body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1, "temperature": 0}
        try:
            r = await self._client.post(path, json=body, timeout=60)
        except httpx.HTTPError as exc:
            return f"probe failed: {reason(exc)}"
        return None if r.status_code == 200 else f"probe answered {r.status_code}"

    # -- what the server says about itself ---------------------------------------------------

    async def get_json(self, path: str) -> dict[str, Any] | None:
        """A JSON object from a GET, or None (no answer, not 200, not a JSON object)."""
        try:
            r = await self._client.get(path)
            data = r.json() if r.status_code == 200 and r.content else None
        except (httpx.HTTPError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    async def first_model(self) -> str | None:
        """The id of the first model in ``/v1/models``."""
        data = await self.get_json("/v1/models")
        models = data.get("data") if data else None
        if isinstance(models, list) and models and isinstance(models[0], dict) and "id" in models[0]:
            return str(models[0]["id"])
        return None

    async def metrics_text(self) -> str | None:
        """The Prometheus page at ``/metrics``, or None."""
        try:
            r = await self._client.get("/metrics")
        except httpx.HTTPError:
            return None
        return r.text if r.status_code == 200 else None

    async def engine_snapshot(self) -> dict[str, float]:
        """The engine's ``/metrics`` in specsweep's vocabulary (``engine_metrics.snapshot``); empty when
        it serves none."""
        text = await self.metrics_text()
        return engine_metrics.snapshot(text) if text else {}

    # -- tokenizer ---------------------------------------------------------------------------

    #: The bodies /tokenize takes: llama.cpp's, vLLM's, SGLang's.
    TOKENIZE_FIELDS = ("content", "prompt", "text")

    def _tokenize_body(self, field: str, text: str) -> dict[str, Any]:
        return {"content": text, "add_special": True} if field == "content" else {field: text}

    async def _tokenize(self, field: str, text: str) -> int | None:
        try:
            r = await self._client.post("/tokenize", json=self._tokenize_body(field, text), timeout=30)
            data = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        if not isinstance(data, dict):
            return None
        if isinstance(data.get("count"), int):
            return int(data["count"])
        if isinstance(data.get("tokens"), list):
            return len(data["tokens"])
        return None

    async def count_tokens(self, text: str) -> int | None:
        """Tokens in ``text`` by the server's ``/tokenize``; None when the server has none."""
        counts = await self.count_tokens_many([text])
        return counts[0] if counts else None

    async def count_tokens_many(self, texts: Sequence[str], *, concurrency: int = 8) -> list[int] | None:
        """Tokens in each text by the server's ``/tokenize`` (llama.cpp, vLLM and SGLang answer it, each
        with its own body: found once per server, on the first text), the rest sent ``concurrency`` at a
        time. None when the server has no tokenizer (or stops answering one)."""
        if not texts:
            return []
        if self._tokenize_field is None:
            self._tokenize_field = ""
            for field in self.TOKENIZE_FIELDS:
                if await self._tokenize(field, texts[0]) is not None:
                    self._tokenize_field = field
                    break
        field = self._tokenize_field
        if not field:
            return None
        # Thousands of calls: through the load generator's own HTTP/1.1 client (prepared bytes, kept-alive
        # connections), about ten times cheaper per call than a general client.
        from specsweep.bench.http1 import Pool

        pool = Pool(self.base_url, concurrency)

        async def one(text: str) -> int | None:
            body = bytearray()
            try:
                await pool.request(pool.request_bytes("/tokenize", orjson.dumps(self._tokenize_body(field, text)),
                                                      self._headers), lambda data, _t: body.extend(data))
                data = orjson.loads(body)
            except Exception:  # noqa: BLE001 - once more through the general client: a blip, or an odd answer
                return await self._tokenize(field, text)
            if isinstance(data, dict) and isinstance(data.get("count"), int):
                return int(data["count"])
            if isinstance(data, dict) and isinstance(data.get("tokens"), list):
                return len(data["tokens"])
            return await self._tokenize(field, text)

        try:
            counts = await asyncio.gather(*(one(t) for t in texts))
        finally:
            pool.close()
        return None if any(n is None for n in counts) else [int(n) for n in counts if n is not None]
