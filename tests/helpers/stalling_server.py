"""A server whose answers outside the timed load never end, on purpose: no real engine does this on demand.

    python -m tests.helpers.stalling_server --port P

GET /health trickles one byte every 0.2 s and never finishes; POST /tokenize sends its headers and then
nothing; GET /v1/models answers at once; POST /v1/completions streams a well-formed four-token answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json

EVENTS = [{"id": "x", "choices": [{"index": 0, "text": f" t{i}"}]} for i in range(4)]
SSE = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in EVENTS) + b"data: [DONE]\n\n"


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            line = head.split(b"\r\n", 1)[0].decode()
            length = next((int(h.split(b":", 1)[1]) for h in head.split(b"\r\n")
                           if h.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            if line.startswith("GET /health"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
                while True:
                    writer.write(b".")
                    await writer.drain()
                    await asyncio.sleep(0.2)
            if line.startswith("POST /tokenize"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{")
                await writer.drain()
                await asyncio.Event().wait()  # never more
            if line.startswith("GET /v1/models"):
                body = json.dumps({"data": [{"id": "stalling"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body), body))
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(SSE), SSE))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    server = await asyncio.start_server(handle, "127.0.0.1", args.port)
    print(f"listening on {args.port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
