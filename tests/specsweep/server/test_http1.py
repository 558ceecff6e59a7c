"""The timed path's HTTP/1.1 parser, fed real response bytes split at every boundary."""

from __future__ import annotations

import asyncio
import random

import pytest

from specsweep.server.http1 import ConnectionLost, HTTPStatusError, _Response

PIECES = [b'data: {"a":1}\n\n', b'data: {"a":"xyz"}\n\n', b"data: [DONE]\n\n"]
CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
           + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in PIECES) + b"0\r\n\r\n")
BODY = b'data: {"a":1}\n\ndata: {"a":"xyz"}\n\ndata: [DONE]\n\n'


async def feed_in_pieces(raw: bytes, cuts: list[int]) -> tuple[bytes, _Response, asyncio.Future[None]]:
    got = bytearray()
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    resp = _Response(lambda data, now: got.extend(data), done)
    last = 0
    for c in [*sorted(cuts), len(raw)]:
        if c > last:
            resp.feed(raw[last:c], 0.0)
            last = c
    return bytes(got), resp, done


@pytest.mark.parametrize("seed", range(30))
async def test_chunked_body_survives_any_split(seed: int) -> None:
    rng = random.Random(seed)
    cuts = rng.sample(range(1, len(CHUNKED)), k=rng.randint(1, 12))
    got, resp, done = await feed_in_pieces(CHUNKED, cuts)
    assert got == BODY and done.done() and done.exception() is None and resp.keep_alive


async def test_every_single_byte_boundary() -> None:
    got, _, done = await feed_in_pieces(CHUNKED, list(range(1, len(CHUNKED))))
    assert got == BODY and done.done()


async def test_content_length_and_close_delimited() -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    got, resp, done = await feed_in_pieces(raw, [20, 40])
    assert got == b"hello" and done.done() and resp.keep_alive
    raw = b"HTTP/1.0 200 OK\r\n\r\nuntil close"
    got, resp, done = await feed_in_pieces(raw, [3])
    assert got == b"until close" and not done.done() and not resp.keep_alive
    resp.eof()
    assert done.done() and done.exception() is None


async def test_error_status_carries_the_body() -> None:
    raw = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 12\r\n\r\nsimulated!!!"
    got, _, done = await feed_in_pieces(raw, [10])
    assert got == b""
    with pytest.raises(HTTPStatusError, match="HTTP 500: simulated!!!"):
        done.result()


async def test_cut_off_mid_body_is_connection_lost() -> None:
    got, resp, done = await feed_in_pieces(CHUNKED[:110], [30, 95])
    resp.eof()
    with pytest.raises(ConnectionLost):
        done.result()
    assert got  # what arrived before the cut was delivered


async def test_connections_opened_ahead_of_a_level_wait_a_bounded_time_on_a_server_that_takes_none() -> None:
    # A server whose listen queue is full (it accepts nothing): the kernel drops further SYNs and connect()
    # would wait for its retries, about two minutes. Opening connections ahead of a level gives up in its bound.
    import socket
    import time

    from specsweep.server.http1 import Pool

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    queued = []
    for _ in range(8):  # fill the queue: the first connections complete, the next ones hang
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        queued.append(s)
    await asyncio.sleep(0.2)
    pool = Pool(f"http://127.0.0.1:{port}", 4)
    t0 = time.perf_counter()
    await pool.prefill(4, timeout_s=0.5)
    waited = time.perf_counter() - t0
    assert waited < 5.0, waited  # the bound (0.5 s) and scheduling, not the kernel's SYN retries (~127 s)
    assert len(pool.idle) < 4  # those that could not open are left to the requests that need them
    pool.close()
    for s in queued:
        s.close()
    server.close()
