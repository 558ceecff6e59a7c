"""``specsweep route``: a load-aware router in front of two servers of one model, for engines without a per-batch
speculation switch (whose draft settings hold for every batch, and which ignore per-request draft limits).

    python -m specsweep.route --port 8090 --speculative http://127.0.0.1:8081 --baseline http://127.0.0.1:8082 \\
        --off-from 8

A generation request (``/v1/completions``, ``/v1/chat/completions``, ``/completion``, ``/generate``) that arrives
while ``off-from`` or more requests are in flight through the router, itself counted, goes to the baseline server;
any other goes to the speculative one. At a steady concurrency C every request sees C in flight, so "off from 8"
serves C < 8 with speculation and C >= 8 without, as the comparison's recommendation says. Every other path goes to
the speculative server (both serve the same model). ``/health`` is ready when both servers are; ``/metrics`` is both
servers' series summed, with the router's own (``specsweep_route_*``). Each answer names the server that gave it in
``X-Specsweep-Upstream``. Answers stream through as they arrive.

One server serves at a time, as an engine switches speculation for a whole batch: when the load crosses the
threshold, new requests wait until the requests still on the other server have finished, then go to the new one.
Two servers that share processors or a GPU and both compute at once slow each other far more than twice (their
threads wait on each other at every step): measured here, a router that let both serve read 0.08-0.27 of the
baseline's throughput at a level it routed to the baseline. ``--overlap`` lets both serve at once, for servers on
hardware of their own. A request that would speculate waits ``--settle-ms`` (3 ms) for the requests arriving with
it, so that a burst is routed by its whole size rather than by the order it arrived in.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

log = logging.getLogger("specsweep.route")
#: How a launch command names the router (``python -m MODULE``).
MODULE = "specsweep.route"

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/completion", "/completions", "/generate"})
#: Headers that belong to one connection, not to the message (RFC 9110 7.6.1), and those aiohttp sets itself.
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "host", "content-length"})
UPSTREAM_HEADER = "X-Specsweep-Upstream"
#: How long an upstream may take to accept a connection, and to send the next bytes of an answer.
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 600.0
_SERIES = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)(?:\s+\d+)?$")


#: How long a request that would speculate waits for the requests arriving with it (a quiet gap), and at most.
SETTLE_S = 0.003
SETTLE_MAX_S = 0.03


class Router:
    """The routing rule and its counts: which server a request goes to, by the requests in flight, and (unless
    ``overlap``) one server serving at a time."""

    def __init__(self, speculative: str, baseline: str, off_from: int, *, overlap: bool = False,
                 settle_s: float = SETTLE_S) -> None:
        if off_from < 1:
            raise ValueError(f"--off-from must be at least 1 (got {off_from})")
        self.upstreams = {"speculative": speculative.rstrip("/"), "baseline": baseline.rstrip("/")}
        self.off_from = off_from
        self.overlap = overlap
        self.settle_s = settle_s
        self.in_flight = 0
        self.routed = {"speculative": 0, "baseline": 0}
        self.busy = {"speculative": 0, "baseline": 0}
        self.active = "speculative"
        self.switch_to: str | None = None
        self.switches = 0
        self.held = 0
        self.both_busy_s = 0.0
        self._both_since: float | None = None
        self._last_arrival = -1.0
        self._changed = asyncio.Condition()

    def choose(self) -> str:
        """The server for a generation request arriving now (already counted in ``in_flight``)."""
        return "baseline" if self.in_flight >= self.off_from else "speculative"

    async def admit(self) -> str:
        """The server this generation request (counted in ``in_flight``) goes to, once it may: call ``leave`` with
        it when the answer has ended."""
        now = time.monotonic()
        self._last_arrival = now
        if self.settle_s > 0 and self.choose() == "speculative":
            # A burst's requests arrive within milliseconds of each other: route by its size once it has arrived.
            while time.monotonic() - now < SETTLE_MAX_S and self.choose() == "speculative":
                await asyncio.sleep(self.settle_s)
                if time.monotonic() - self._last_arrival >= self.settle_s:
                    break
        name = self.choose()
        async with self._changed:
            if not self.overlap:
                waited = False
                while True:
                    # Each time, by the load now (the waiting requests counted): a switch asked for in a dip, or by a
                    # request since gone, is dropped once the load points back at the server serving.
                    want = self.choose()
                    if want == self.active:
                        if self.switch_to is not None:
                            self.switch_to = None
                            self._changed.notify_all()
                        break
                    self.switch_to = want
                    if self.busy[self.active] == 0:
                        self.active, self.switch_to = want, None
                        self.switches += 1
                        self._changed.notify_all()
                        break
                    waited = True
                    await self._changed.wait()
                self.held += waited
                name = self.active
            self.busy[name] += 1
            self.routed[name] += 1
            self._both_busy_changed()
        return name

    async def leave(self, name: str) -> None:
        async with self._changed:
            self.busy[name] -= 1
            self._both_busy_changed()
            self._changed.notify_all()

    def _both_busy_changed(self) -> None:
        both = all(self.busy.values())
        if both and self._both_since is None:
            self._both_since = time.monotonic()
        elif not both and self._both_since is not None:
            self.both_busy_s += time.monotonic() - self._both_since
            self._both_since = None


def merge_metrics(pages: Sequence[str]) -> str:
    """Prometheus text pages of the same engine, one page: each series' values summed (requests in flight,
    tokens and drafts counted add up; a ratio such as a cache's usage is summed too, which this says in a
    comment), each # HELP/# TYPE line once."""
    comments: dict[str, None] = {}
    values: dict[str, float] = {}
    for page in pages:
        for line in page.splitlines():
            line = line.strip()
            if not line:
                continue
            if line.startswith("#"):
                comments.setdefault(line)
                continue
            m = _SERIES.match(line)
            if m is None:
                continue
            try:
                value = float(m.group(2))
            except ValueError:
                continue
            values[m.group(1)] = values.get(m.group(1), 0.0) + value
    out = ["# specsweep route: the series of both servers, summed", *comments]
    out += [f"{name} {value:g}" for name, value in values.items()]
    return "\n".join(out) + "\n"


def _forwarded(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in dict(headers).items() if k.lower() not in _HOP}


class RouteServer:
    """The router as an HTTP server: aiohttp in, aiohttp out, answers streamed through."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.session: aiohttp.ClientSession | None = None

    async def start(self, app: web.Application) -> None:
        timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S)
        # A connection per request (force_close): a server that closes its idle keep-alive connections (some engines
        # do) would otherwise fail a request written on one it had just closed ("Can not write request body").
        self.session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False,
                                             connector=aiohttp.TCPConnector(limit=0, force_close=True))

    async def stop(self, app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.on_startup.append(self.start)
        app.on_cleanup.append(self.stop)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        return app

    async def _status(self, base: str, path: str) -> int | None:
        assert self.session is not None
        try:
            async with self.session.get(base + path, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                await resp.read()
                return resp.status
        except (TimeoutError, aiohttp.ClientError):
            return None

    async def health(self, request: web.Request) -> web.Response:
        statuses = {name: await self._status(base, "/health") for name, base in self.router.upstreams.items()}
        if all(s == 200 for s in statuses.values()):
            return web.json_response({"status": "ok"})
        waiting = ", ".join(f"{name}: {'no answer' if s is None else f'HTTP {s}'}" for name, s in statuses.items()
                            if s != 200)
        return web.json_response({"status": "loading", "not ready": waiting}, status=503)

    async def metrics(self, request: web.Request) -> web.Response:
        assert self.session is not None
        pages = []
        for base in self.router.upstreams.values():
            try:
                async with self.session.get(base + "/metrics", headers=_forwarded(request.headers),
                                            timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    if resp.status == 200:
                        pages.append(await resp.text())
            except (TimeoutError, aiohttp.ClientError):
                continue
        own = (f"# TYPE specsweep_route_in_flight gauge\nspecsweep_route_in_flight {self.router.in_flight}\n"
               "# TYPE specsweep_route_requests_total counter\n"
               + "".join(f'specsweep_route_requests_total{{upstream="{k}"}} {v}\n' for k, v in self.router.routed.items())
               + "# TYPE specsweep_route_switches_total counter\n"
               f"specsweep_route_switches_total {self.router.switches}\n"
               "# TYPE specsweep_route_held_total counter\n"
               f"specsweep_route_held_total {self.router.held}\n"
               "# TYPE specsweep_route_both_busy_seconds_total counter\n"
               f"specsweep_route_both_busy_seconds_total {self.router.both_busy_s:.6f}\n"
               f"# specsweep_route_off_from {self.router.off_from}\n")
        return web.Response(text=merge_metrics(pages) + own, content_type="text/plain")

    async def forward(self, request: web.Request) -> web.StreamResponse:
        if not (request.method == "POST" and request.path in GENERATION_PATHS):
            return await self._proxy(request, "speculative")
        self.router.in_flight += 1
        try:
            name = await self.router.admit()
            try:
                return await self._proxy(request, name)
            finally:
                await self.router.leave(name)
        finally:
            self.router.in_flight -= 1

    async def _proxy(self, request: web.Request, name: str) -> web.StreamResponse:
        assert self.session is not None
        url = self.router.upstreams[name] + request.rel_url.path_qs
        body = await request.read()
        response: web.StreamResponse | None = None
        try:
            async with self.session.request(request.method, url, data=body or None,
                                            headers=_forwarded(request.headers)) as upstream:
                response = web.StreamResponse(status=upstream.status, headers=_forwarded(upstream.headers))
                response.headers[UPSTREAM_HEADER] = name
                await response.prepare(request)
                async for piece in upstream.content.iter_any():
                    await response.write(piece)
                await response.write_eof()
                return response
        except (TimeoutError, aiohttp.ClientError) as exc:
            if response is not None and response.prepared:
                # Cut off mid-answer: the client sees the answer end early, as it would from the server itself.
                log.warning("the %s server's answer to %s was cut off: %s", name, request.path, exc)
                raise
            return web.json_response({"error": {"message": f"the {name} server did not answer: {exc or type(exc).__name__}",
                                                "type": "upstream_error"}}, status=502,
                                     headers={UPSTREAM_HEADER: name})


def _url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a server's base URL such as http://127.0.0.1:8081")
    return text.rstrip("/")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="specsweep route", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("--host", default="127.0.0.1", help="Address to listen on (default 127.0.0.1).")
    p.add_argument("--port", type=int, required=True, help="Port to listen on.")
    p.add_argument("--speculative", type=_url, required=True, help="Base URL of the server that speculates.")
    p.add_argument("--baseline", type=_url, required=True, help="Base URL of the server that does not.")
    p.add_argument("--off-from", type=int, required=True,
                   help="Requests in flight (this one counted) from which requests go to the baseline server.")
    p.add_argument("--overlap", action="store_true",
                   help="Let both servers serve at once (servers on hardware of their own). By default one serves at "
                        "a time: at a switch, new requests wait until the other server's requests have finished.")
    p.add_argument("--settle-ms", type=float, default=SETTLE_S * 1000,
                   help=f"How long a request that would speculate waits for the requests arriving with it, a quiet gap "
                        f"(default {SETTLE_S * 1000:g}; at most {SETTLE_MAX_S * 1000:g} in all; 0: route at once).")
    args = p.parse_args(argv)
    if args.off_from < 1:
        p.error(f"--off-from must be at least 1 (got {args.off_from})")
    if not 0 <= args.settle_ms <= SETTLE_MAX_S * 1000:
        p.error(f"--settle-ms must lie in 0..{SETTLE_MAX_S * 1000:g} (got {args.settle_ms:g})")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    log.info("routing on %s:%d: below %d in flight to %s, from %d to %s; %s", args.host, args.port, args.off_from,
             args.speculative, args.off_from, args.baseline,
             "both may serve at once" if args.overlap else "one server serves at a time")

    async def serve() -> None:
        server = RouteServer(Router(args.speculative, args.baseline, args.off_from, overlap=args.overlap,
                                    settle_s=args.settle_ms / 1000))
        runner = web.AppRunner(server.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, args.host, args.port).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
