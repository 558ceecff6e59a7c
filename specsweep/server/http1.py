"""A minimal HTTP/1.1 client for the timed path: keep-alive connections, one request at a time each.

Why not a general client: at 64 requests in flight, building each request through a
general-purpose client took about 100 µs, so a wave of 64 new requests held the event
loop for several milliseconds while early first tokens were already waiting in the
socket — a timing error of several ms on TTFT. Here each request is bytes prepared
before the level starts, written to a connection opened before the clock starts, and
the response is parsed straight from ``data_received`` (status line, headers, chunked or
length-delimited body), each read stamped with ``perf_counter`` as it arrives.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from pydantic import SecretStr

_perf = time.perf_counter

OnData = Callable[[bytes, float], None]


def bearer(api_key: SecretStr | None) -> dict[str, str]:
    """The request header that carries an API key (none without one)."""
    return {"Authorization": f"Bearer {api_key.get_secret_value()}"} if api_key else {}


class ConnectionLost(Exception):
    """The server closed the connection or the network failed before the response ended."""


class ProtocolError(Exception):
    """The server's answer broke HTTP or SSE framing: the request fails at once, its connection is closed."""


#: The longest response head, and the longest chunk-size or trailer line, the client buffers.
MAX_HEAD = 64 * 1024
MAX_LINE = 64 * 1024


class HTTPStatusError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:500].decode('utf-8', errors='replace')}")
        self.status = status


#: The states of a response being parsed.
HEAD, CHUNK_SIZE, CHUNK_DATA, CHUNK_END, LENGTH_BODY, UNTIL_CLOSE, TRAILER, DONE = range(8)


class _Response:
    """Incremental parser of one response; body bytes go to ``on_data`` when the status is 200."""

    __slots__ = ("on_data", "buf", "state", "status", "remaining", "chunked", "keep_alive", "done", "error_body",
                 "got_bytes")

    def __init__(self, on_data: OnData, done: asyncio.Future[None]) -> None:
        self.on_data = on_data
        self.buf = b""
        self.state = HEAD
        self.status = 0
        self.remaining = 0
        self.chunked = False
        self.keep_alive = True
        self.done = done
        self.error_body = bytearray()
        self.got_bytes = False

    def _body(self, data: bytes, now: float) -> None:
        if self.status == 200:
            self.on_data(data, now)
        elif len(self.error_body) < 4096:
            self.error_body += data

    def _finish(self) -> None:
        self.state = DONE
        if not self.done.done():
            if self.status == 200:
                self.done.set_result(None)
            else:
                self.done.set_exception(HTTPStatusError(self.status, bytes(self.error_body)))

    def fail(self, exc: BaseException) -> None:
        self.state, self.keep_alive, self.buf = DONE, False, b""
        if not self.done.done():
            self.done.set_exception(exc)

    def feed(self, data: bytes, now: float) -> None:
        """Parse what arrived, one step of the state the response is in at a time; each step returns the bytes
        it left (none: wait for more). A broken answer (or one the body's consumer refuses) fails the request
        with ProtocolError at once; nothing is raised into the socket callback."""
        try:
            self.got_bytes = True
            buf = self.buf + data if self.buf else data
            self.buf = b""
            steps = _STEPS
            while buf:
                buf = steps[self.state](self, buf, now)
        except ProtocolError as exc:
            self.fail(exc)
        except Exception as exc:  # noqa: BLE001 - the consumer's parser met something it cannot read
            self.fail(ProtocolError(f"{type(exc).__name__}: {exc}"))

    def _chunk_data(self, buf: bytes, now: float) -> bytes:  # the hot path
        n = self.remaining
        if len(buf) <= n:
            self._body(buf, now)
            self.remaining = n - len(buf)
            if self.remaining == 0:
                self.state = CHUNK_END
            return b""
        self._body(buf[:n], now)
        self.remaining, self.state = 0, CHUNK_END
        return buf[n:]

    def _line(self, buf: bytes) -> tuple[bytes, bytes] | None:
        """The next CRLF-ended line and what follows it; None (the bytes kept) until one has arrived whole."""
        i = buf.find(b"\r\n")
        if i < 0:
            if len(buf) > MAX_LINE:
                raise ProtocolError(f"a chunk-size or trailer line longer than {MAX_LINE // 1024} KiB")
            self.buf = buf
            return None
        return buf[:i], buf[i + 2:]

    def _chunk_size(self, buf: bytes, now: float) -> bytes:
        got = self._line(buf)
        if got is None:
            return b""
        line, buf = got
        digits = line.split(b";", 1)[0].strip()
        if not digits or len(digits) > 16 or digits.strip(b"0123456789abcdefABCDEF"):
            raise ProtocolError(f"bad chunk size {line[:40]!r}")
        size = int(digits, 16)
        if size == 0:
            self.state = TRAILER
        else:
            self.remaining, self.state = size, CHUNK_DATA
        return buf

    def _chunk_end(self, buf: bytes, now: float) -> bytes:
        got = self._line(buf)
        if got is None:
            return b""
        line, buf = got
        if line:
            raise ProtocolError(f"chunk data not followed by CRLF (got {line[:40]!r})")
        self.state = CHUNK_SIZE
        return buf

    def _trailer(self, buf: bytes, now: float) -> bytes:
        got = self._line(buf)
        if got is None:
            return b""
        line, buf = got
        if not line:
            self._finish()
            return b""
        return buf

    def _length_body(self, buf: bytes, now: float) -> bytes:
        n = self.remaining
        piece = buf[:n]
        self._body(piece, now)
        self.remaining = n - len(piece)
        if self.remaining == 0:
            self._finish()
            return b""
        return buf[len(piece):]

    def _until_close(self, buf: bytes, now: float) -> bytes:
        self._body(buf, now)
        return b""

    def _head(self, buf: bytes, now: float) -> bytes:
        i = buf.find(b"\r\n\r\n")
        if i < 0 or i > MAX_HEAD:
            if len(buf) > MAX_HEAD:
                raise ProtocolError(f"response headers longer than {MAX_HEAD // 1024} KiB")
            self.buf = buf
            return b""
        head, buf = buf[:i], buf[i + 4:]
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
            raise ProtocolError(f"bad status line {lines[0][:80]!r}")
        self.status = int(parts[1])
        length = None
        for h in lines[1:]:
            name, _, value = h.partition(b":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value:
                self.chunked = True
            elif name == b"content-length":
                if not value.isdigit():
                    raise ProtocolError(f"bad Content-Length {value[:40]!r}")
                length = int(value)
            elif name == b"connection" and value == b"close":
                self.keep_alive = False
        if parts[0] == b"HTTP/1.0":
            self.keep_alive = False
        if self.chunked:
            self.state = CHUNK_SIZE
        elif length is not None:
            self.remaining, self.state = length, LENGTH_BODY
            if length == 0:
                self._finish()
                return b""
        else:
            self.state, self.keep_alive = UNTIL_CLOSE, False
        return buf

    def _after_end(self, buf: bytes, now: float) -> bytes:
        self.keep_alive = False  # bytes after the end of a response: the connection is not reusable
        return b""

    def eof(self) -> None:
        if self.state == UNTIL_CLOSE:
            self._finish()
        elif self.state != DONE and not self.done.done():
            self.done.set_exception(ConnectionLost("the server closed the connection before the response ended"))


#: Each state's step, indexed by the state.
_STEPS = (_Response._head, _Response._chunk_size, _Response._chunk_data, _Response._chunk_end, _Response._length_body,
          _Response._until_close, _Response._trailer, _Response._after_end)


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.response: _Response | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # a TCP connection's transport
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        now = _perf()
        if self.response is not None:
            self.response.feed(data, now)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.response is not None:
            self.response.eof()


SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


def realtime_offset() -> float:
    """time.time() - perf_counter(), from the tightest of a few paired readings."""
    best, offset = float("inf"), 0.0
    for _ in range(9):
        a = _perf()
        t = time.time()
        b = _perf()
        if b - a < best:
            best, offset = b - a, t - (a + b) / 2
    return offset


class _RawConn:
    """A plain-TCP connection read with recvmsg, so each read carries the kernel's receive time.

    When the event loop is busy (many connections ready at once), the time a read is
    processed can be milliseconds after the bytes arrived; the kernel's timestamp (the
    arrival of the last segment in the read) is not delayed by that.
    """

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop, offset: float) -> None:
        self.sock = sock
        self.loop = loop
        self.offset = offset
        self.response: _Response | None = None
        self.lost = False
        loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            data, anc, _, _ = self.sock.recvmsg(262144, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._lost()
            return
        if not data:
            self._lost()
            return
        now = _perf()
        for level, kind, cdata in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(cdata) >= 16:
                sec, nsec = struct.unpack("qq", cdata[:16])
                now = min(now, sec + nsec * 1e-9 - self.offset)
        if self.response is not None:
            self.response.feed(data, now)

    def _lost(self) -> None:
        if not self.lost:
            self.lost = True
            self.close()
            if self.response is not None:
                self.response.eof()

    async def write(self, raw: bytes) -> None:
        try:
            sent = self.sock.send(raw)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._lost()
            raise ConnectionLost(f"the connection failed while sending: {exc}") from None
        if sent < len(raw):
            await self.loop.sock_sendall(self.sock, raw[sent:])

    def close(self) -> None:
        try:
            self.loop.remove_reader(self.sock.fileno())
        except (ValueError, OSError):
            pass
        self.sock.close()


#: The most one connection opened ahead of a level may take: loopback or a tunnel's local end answers at once; a
#: server whose listen queue is full would otherwise hold the level for the kernel's SYN retries (about 2 min).
PREFILL_CONNECT_S = 10.0


class Pool:
    """Keep-alive connections to one server, at most ``limit`` open at once."""

    def __init__(self, base_url: str, limit: int) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"unsupported URL {base_url!r}: use http://host:port or https://host:port")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if u.scheme == "https" else None
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address goes in brackets
        self.host_header = f"{host}:{self.port}".encode()
        self.prefix = u.path.rstrip("/")
        self.idle: list[_Conn | _RawConn] = []
        self.sem = asyncio.Semaphore(limit)
        self.opened = 0
        self.offset = realtime_offset()
        self._addr: tuple | None = None

    def request_bytes(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        extra = b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
        return (b"POST " + (self.prefix + path).encode() + b" HTTP/1.1\r\nHost: " + self.host_header
                + b"\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)

    async def _connect(self) -> _Conn | _RawConn:
        loop = asyncio.get_running_loop()
        if self.ssl is not None:  # TLS: through the loop's transport (no kernel timestamps)
            _, conn = await loop.create_connection(_Conn, self.host, self.port, ssl=self.ssl)
            self.opened += 1
            return conn
        if self._addr is None:
            infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            self._addr = infos[0]
        family, kind, proto, _, addr = self._addr
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            pass
        try:
            await loop.sock_connect(sock, addr)
        except BaseException:
            sock.close()
            raise
        self.opened += 1
        return _RawConn(sock, loop, self.offset)

    async def prefill(self, n: int, timeout_s: float = PREFILL_CONNECT_S) -> None:
        """Open ``n`` connections before the clock starts, each within ``timeout_s`` (a connection not open by
        then is opened by the request that needs it, inside that request's own limit)."""
        need = max(0, n - len(self.idle))
        conns = await asyncio.gather(*(asyncio.wait_for(self._connect(), timeout_s) for _ in range(need)),
                                     return_exceptions=True)
        self.idle.extend(c for c in conns if isinstance(c, (_Conn, _RawConn)))

    async def request(self, raw: bytes, on_data: OnData, on_sent: Callable[[], None] | None = None) -> None:
        """Send ``raw`` and feed the 200 response body to ``on_data``; raise on any failure."""
        async with self.sem:
            for attempt in (0, 1):
                reused = bool(self.idle)
                conn = None
                while self.idle:
                    c = self.idle.pop()
                    if not c.lost:
                        conn = c
                        break
                if conn is None:
                    conn = await self._connect()
                    reused = False
                done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                resp = _Response(on_data, done)
                conn.response = resp
                if on_sent is not None:
                    on_sent()
                try:
                    await _write(conn, raw)
                    await done
                except HTTPStatusError:
                    conn.response = None
                    if resp.keep_alive and not conn.lost:
                        self.idle.append(conn)
                    else:
                        _close(conn)
                    raise
                except ConnectionLost:
                    # A kept-alive connection the server had already closed: nothing was answered,
                    # so send once more on a fresh connection.
                    if attempt == 0 and reused and not resp.got_bytes:
                        continue
                    raise
                except BaseException:
                    conn.response = None
                    _close(conn)
                    raise
                conn.response = None
                if resp.keep_alive and not conn.lost:
                    self.idle.append(conn)
                else:
                    _close(conn)
                return

    def close(self) -> None:
        for c in self.idle:
            _close(c)
        self.idle.clear()


async def _write(conn: _Conn | _RawConn, raw: bytes) -> None:
    if isinstance(conn, _RawConn):
        await conn.write(raw)
    else:
        assert conn.transport is not None
        conn.transport.write(raw)


def _close(conn: _Conn | _RawConn) -> None:
    if isinstance(conn, _RawConn):
        conn.close()
    elif conn.transport is not None:
        conn.transport.close()
