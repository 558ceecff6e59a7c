"""A real HTTP server that misbehaves on purpose, for lifecycle tests.

It listens only after --listen-after seconds, answers /health with 503 during --warmup
seconds and 200 (empty body) after, can crash during startup, ignore SIGTERM, leave a
grandchild in a session of its own, leave a socket and a file in its temporary folder (as
vLLM does at every start), and record its argv so tests can check how arguments arrived.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--listen-after", type=float, default=0.0)
    ap.add_argument("--warmup", type=float, default=0.0)
    ap.add_argument("--crash-after", type=float, default=None)
    ap.add_argument("--ignore-sigterm", action="store_true")
    ap.add_argument("--spawn-grandchild", action="store_true")
    ap.add_argument("--argv-file", default=None)
    ap.add_argument("--health-status", type=int, default=200)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--print-env", default=None, metavar="VAR",
                    help="print VAR=value at start (as servers that echo their config)")
    ap.add_argument("--leave-tmp-files", action="store_true",
                    help="bind a Unix socket and write a file in the temporary folder, never removed (as vLLM's "
                    "ZeroMQ sockets and vllm_dist_ files)")
    ap.add_argument("rest", nargs="*")
    args = ap.parse_args()

    print(f"toy server pid {os.getpid()} starting: {' '.join(sys.argv)}", flush=True)
    if args.print_env:
        print(f"{args.print_env}={os.environ.get(args.print_env, '')}", flush=True)
    if args.leave_tmp_files:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(os.path.join(tempfile.gettempdir(), str(uuid.uuid4())))
        with open(os.path.join(tempfile.gettempdir(), f"toy_dist_{uuid.uuid4().hex}"), "w") as f:
            f.write("x")
        print(f"tmp files: {sock.getsockname()} {f.name}", flush=True)
    if args.argv_file:
        with open(args.argv_file, "w") as f:
            json.dump({"argv": sys.argv, "env_marker": os.environ.get("SPECSWEEP_SERVER_PORT")}, f)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
    if args.spawn_grandchild:
        # A child that starts a grandchild in a new session, then exits: the grandchild is
        # orphaned out of the server's process group and session, as SGLang schedulers are.
        code = "import os,subprocess,time;subprocess.Popen(['sleep','600'],start_new_session=True);time.sleep(600)"
        subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    start = time.monotonic()
    if args.crash_after is not None:
        time.sleep(args.crash_after)
        print(f"FATAL: CUDA out of memory while loading weights (simulated) exit_at_monotonic={time.monotonic()}", flush=True)
        sys.exit(3)
    time.sleep(args.listen_after)
    ready_at = start + args.listen_after + args.warmup
    print(f"ready_at_monotonic={ready_at}", flush=True)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path.startswith("/health"):
                status = 503 if time.monotonic() < ready_at else args.health_status
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            body = b'{"choices":[{"text":"x"}]}'
            self.send_response(200 if time.monotonic() >= ready_at else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *a: object) -> None:
            print(fmt % a, flush=True)

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"listening on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
