"""A server that breaks HTTP or SSE framing on purpose (every other request), for faults no real engine
produces on demand.

    python -m tests.helpers.bad_server --port P --mode MODE

Modes: bad-chunk-size, bad-status-line, oversized-headers, choices-not-list, invalid-utf8, endless-line. The other
requests get a well-formed streamed completion of four tokens, so a level against it has both.

Mode malformed: every streamed completion's events are malformed ('choices' not a list); /v1/models and /health
answer well; a POST to any other path (/tokenize, the cache resets) is never answered, as a server that leaves
unknown paths hanging; GET /served says how many completions it streamed.

Mode stalls: the answers outside the timed load never end. GET /health trickles one byte every 0.2 s; POST
/tokenize sends its headers and then nothing; GET /v1/models answers at once; a completion streams well.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tests.helpers.processes import stop_process

GOOD_EVENTS = [{"id": "x", "choices": [{"index": 0, "text": f" t{i}"}]} for i in range(4)]


def sse(events: list[bytes]) -> bytes:
    return b"".join(b"data: " + e + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def chunked(body: bytes) -> bytes:
    return f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def answer(mode: str) -> bytes:
    good = [json.dumps(e).encode() for e in GOOD_EVENTS]
    if mode == "all-choices-not-list":
        return HEAD + chunked(sse([json.dumps({"id": "x", "choices": {"text": f" t{i}"}}).encode() for i in range(4)]))
    if mode == "malformed":
        return b""
    if mode == "good":
        return HEAD + chunked(sse(good))
    if mode == "bad-chunk-size":
        return HEAD + b"zz\r\n" + sse(good) + b"\r\n0\r\n\r\n"
    if mode == "bad-status-line":
        return b"HTP/1.1 twohundred\r\nContent-Length: 2\r\n\r\nok"
    if mode == "oversized-headers":
        return b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Filler-%d: %s\r\n" % (i, b"a" * 1000) for i in range(200))
    if mode == "choices-not-list":
        return HEAD + chunked(sse([json.dumps({"id": "x", "choices": {"text": "oops"}}).encode()] + good))
    if mode == "endless-line":  # 32 MiB of one event that never ends its line
        return HEAD + chunked(b"data: {\"id\": \"x\", \"choices\": [{\"text\": \"" + b"a" * (32 << 20))
    if mode == "stalls":  # its requests outside the timed load are answered by ``stall``
        return HEAD + chunked(sse(good))
    if mode == "invalid-utf8":
        return HEAD + chunked(sse([b'{"id": "x", "choices": [{"index": 0, "text": "\xff\xfe"}]}'] + good))
    raise SystemExit(f"unknown mode {mode}")


async def stall(line: bytes, writer: asyncio.StreamWriter) -> bool:
    """Mode stalls: answer (or never finish answering) a request outside the timed load; False for the others."""
    if line.startswith(b"GET /health"):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
        while True:
            writer.write(b".")
            await writer.drain()
            await asyncio.sleep(0.2)
    if line.startswith(b"POST /tokenize"):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{")
        await writer.drain()
        await asyncio.Event().wait()  # never more
    if line.startswith(b"GET /v1/models"):
        body = json.dumps({"data": [{"id": "stalling"}]}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        await writer.drain()
        return True
    return False


@contextmanager
def running(mode: str) -> Iterator[str]:
    """This server in a process of its own, in ``mode``; its URL."""
    from tests.helpers.sshd import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.bad_server", "--port", str(port), "--mode", mode],
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and b"listening" in proc.stdout.readline()
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", required=True)
    args = ap.parse_args()
    answer(args.mode)  # refuse an unknown mode at once
    served = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(h.split(b":", 1)[1]) for h in head.split(b"\r\n")
                               if h.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                if args.mode == "malformed":
                    line = head.split(b"\r\n", 1)[0]
                    if line.startswith((b"POST /v1/completions", b"POST /v1/chat/completions")):
                        served += 1
                        writer.write(answer("all-choices-not-list"))
                    elif line.startswith(b"POST"):
                        await asyncio.Event().wait()  # never answered
                    else:
                        body = json.dumps({"data": [{"id": "malformed"}]} if b"/v1/models" in line else
                                          {"served": served} if b"/served" in line else {}).encode()
                        status = b"200 OK" if line.split(b" ")[1].split(b"?")[0] in (
                            b"/v1/models", b"/health", b"/served") else b"404 Not Found"
                        writer.write(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                     % (status, len(body), body))
                    await writer.drain()
                    continue
                if args.mode == "stalls":
                    if not await stall(head.split(b"\r\n", 1)[0], writer):
                        writer.write(answer("good"))
                        await writer.drain()
                    continue
                served += 1
                writer.write(answer("good" if served % 2 else args.mode))
                await writer.drain()
                # The broken answers leave the connection open: a client that does not notice waits.
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", args.port)
    print(f"listening on {args.port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
