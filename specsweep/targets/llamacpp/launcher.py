"""``llama-server`` for machines without the binary: the same flags, over the xllamacpp wheel.

    python -m specsweep.targets.llamacpp.launcher -m target.gguf --host 127.0.0.1 --port 8081 \
        -np 8 -c 8192 -t 2 --metrics [-md draft.gguf --spec-type draft-simple --draft-max 8]

Like llama-server: the port refuses connections for a moment, /health answers 503
"Loading model" while the model loads, then 200 {"status":"ok"}. SIGTERM exits cleanly.
Unknown llama-server flags are an error, so a typo never passes silently. ``-md``
alone loads a draft model without speculating, as in llama-server: speculation needs
``--spec-type draft-simple``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import Any

SPEC_TYPES = {
    "none": "COMMON_SPECULATIVE_TYPE_NONE",
    "draft-simple": "COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE",
    "ngram-simple": "COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE",
    "ngram-mod": "COMMON_SPECULATIVE_TYPE_NGRAM_MOD",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="specsweep-llama-server", description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True, help="target model (GGUF)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("-np", "--parallel", type=int, default=1, help="number of slots (concurrent sequences)")
    ap.add_argument("-c", "--ctx-size", type=int, default=4096, help="total context, shared by the slots")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-tb", "--threads-batch", type=int, default=None)
    ap.add_argument("-b", "--batch-size", type=int, default=None)
    ap.add_argument("--poll", type=int, default=50, choices=range(0, 101), metavar="0..100",
                    help="how long threads poll for work before they sleep (0: never poll; llama-server's default 50)")
    ap.add_argument("-md", "--model-draft", default=None, help="draft model (GGUF)")
    ap.add_argument("--spec-type", choices=sorted(SPEC_TYPES), default="none")
    # llama-server's names for these, old and new.
    ap.add_argument("--spec-draft-n-max", "--draft-max", "--draft", "--draft-n", dest="spec_draft_n_max", type=int,
                    default=16, help="most tokens drafted per step")
    ap.add_argument("--spec-draft-n-min", "--draft-min", "--draft-n-min", dest="spec_draft_n_min", type=int, default=0,
                    help="fewest tokens drafted per step")
    ap.add_argument("--spec-draft-p-min", "--draft-p-min", dest="spec_draft_p_min", type=float, default=None,
                    help="least probability of a drafted token (greedy)")
    ap.add_argument("--metrics", action="store_true", help="serve Prometheus metrics at /metrics")
    ap.add_argument("--api-key", default=os.environ.get("LLAMA_API_KEY") or None,
                    help="API key (default: $LLAMA_API_KEY, as llama-server reads it)")
    ap.add_argument("--alias", default=None, help="model name reported by /v1/models")
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="accepted for compatibility; CPU only")
    return ap.parse_args(argv)


def build_params(args: argparse.Namespace) -> Any:  # an xllamacpp.CommonParams (the wheel has no type stubs)
    import xllamacpp

    p = xllamacpp.CommonParams()
    p.model.path = args.model
    p.hostnames = [args.host]
    p.port = args.port
    p.n_parallel = args.parallel
    p.n_ctx = args.ctx_size
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads_batch or args.threads
    p.cpuparams.poll = p.cpuparams_batch.poll = args.poll
    if args.batch_size:
        p.n_batch = args.batch_size
    p.cont_batching = True
    p.endpoint_metrics = bool(args.metrics)
    if args.alias:
        p.model_alias = args.alias
    if args.api_key:
        p.api_keys = [args.api_key]
    if args.model_draft:
        p.speculative.draft.mparams.path = args.model_draft
        p.speculative.draft.cpuparams.n_threads = args.threads
        p.speculative.draft.cpuparams_batch.n_threads = args.threads_batch or args.threads
        p.speculative.draft.cpuparams.poll = p.speculative.draft.cpuparams_batch.poll = args.poll
    # How many tokens a step drafts, whatever drafts them (a draft model, or n-grams of the text so far).
    p.speculative.draft.n_max = args.spec_draft_n_max
    p.speculative.draft.n_min = args.spec_draft_n_min
    if args.spec_draft_p_min is not None:
        p.speculative.draft.p_min = args.spec_draft_p_min
    if args.spec_type != "none":
        if args.spec_type == "draft-simple" and not args.model_draft:
            raise SystemExit("--spec-type draft-simple needs a draft model: add -md DRAFT.gguf")
        p.speculative.types = [getattr(xllamacpp.common_speculative_type, SPEC_TYPES[args.spec_type])]
    return p


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for path in filter(None, [args.model, args.model_draft]):
        if not os.path.isfile(path):
            print(f"error: model file {path} does not exist", file=sys.stderr, flush=True)
            sys.exit(1)
    stop = threading.Event()

    def on_term(signum: int, _frame: object) -> None:
        print(f"received signal {signum}: shutting down", flush=True)
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    import xllamacpp

    print(
        f"specsweep llama.cpp launcher (xllamacpp {xllamacpp.__version__}): model {args.model}, "
        f"draft {args.model_draft or '-'}, spec-type {args.spec_type}, slots {args.parallel}, "
        f"ctx {args.ctx_size}, threads {args.threads}, listening on {args.host}:{args.port}",
        flush=True,
    )
    start = time.monotonic()
    server = xllamacpp.Server(build_params(args))  # returns once the model is loaded
    print(f"model loaded in {time.monotonic() - start:.2f} s; serving", flush=True)
    while not stop.wait(0.5):
        pass
    del server
    # The server's threads do not join on their own; exit without waiting for them.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
