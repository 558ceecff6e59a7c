"""A server that breaks HTTP or SSE framing on purpose (every other request), for faults no real engine
produces on demand.

    python -m tests.helpers.bad_server --port P --mode MODE

Modes: bad-chunk-size, bad-status-line, oversized-headers, choices-not-list, invalid-utf8, endless-line. The other
requests get a well-formed streamed completion of four tokens, so a level against it has both.
"""

from __future__ import annotations

import argparse
import asyncio
import json

GOOD_EVENTS = [{"id": "x", "choices": [{"index": 0, "text": f" t{i}"}]} for i in range(4)]


def sse(events: list[bytes]) -> bytes:
    return b"".join(b"data: " + e + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def chunked(body: bytes) -> bytes:
    return f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def answer(mode: str) -> bytes:
    good = [json.dumps(e).encode() for e in GOOD_EVENTS]
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
    if mode == "invalid-utf8":
        return HEAD + chunked(sse([b'{"id": "x", "choices": [{"index": 0, "text": "\xff\xfe"}]}'] + good))
    raise SystemExit(f"unknown mode {mode}")


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
