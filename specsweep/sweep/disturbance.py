"""When the machine, not the server under test, shaped a block: the rules that set a block aside.

A block is set aside as disturbed (kept, measured again) when requests failed, the client's event loop stalled,
or no token arrived for far longer than the level's own pace explains (``disturbance``); or, judged against its
level's other blocks, its throughput lies far outside theirs (``outlier``), or its round's paired ratio outside
the other rounds' (``outlier_round``). Failed requests or a client lag met again when the level is measured again
are how the level runs here (a server that fails a share of its requests does so every time; a client that lags
at every block is the machine's limit): from then on such a block counts (``THE_SERVERS_WHEN_MET_AGAIN``), unless
none of its requests completed."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from specsweep.records import BlockRun, RequestRecord

#: A level's own pace: no token from any request for longer than this many of its median gaps between
#: arrivals (and than twice its TTFT p90, and STALL_FLOOR_S) is a stall of the server, not its pace.
STALL_FACTOR = 10.0

STALL_FLOOR_S = 0.25

#: The client's event loop held up this long at once: the machine, not the server, shaped the block.
LAG_DISTURBED_MS = 200.0

#: A request's prompt is read in at most this many times the level's median time per prompt token (its TTFT over
#: its prompt's tokens): a gap its reading fills is the engine's pace on long prompts, not a stall.
PREFILL_FACTOR = 2.0

def longest_gap(records: Sequence[RequestRecord]) -> tuple[float, float]:
    """(longest gap not explained by a prompt being read, median gap) in seconds between arrivals of tokens from
    any request of the level. A gap is explained, up to PREFILL_FACTOR times the level's median time per prompt
    token times its prompt's length, by a request that waited for its first token through it (real prompt sets
    mix short and long prompts: reading a long one holds every stream of an engine that reads and decodes in
    turn, and at one request in flight nothing streams while it is read)."""
    times = sorted(t for r in records for t in r.chunk_times_s)
    gaps = [(a, b) for a, b in zip(times, times[1:], strict=False)]
    if not gaps:
        return 0.0, 0.0
    reading = [(r.sent_s, r.first_token_s, r.prompt_tokens) for r in records
               if r.sent_s is not None and r.first_token_s is not None and r.prompt_tokens]
    rates = [(first - sent) / n for sent, first, n in reading]
    per_token = float(np.median(rates)) if rates else 0.0

    def unexplained(a: float, b: float) -> float:
        explained = max((min(b - max(a, sent), PREFILL_FACTOR * per_token * n)
                         for sent, first, n in reading if sent < b <= first + 1e-9), default=0.0)
        return (b - a) - max(0.0, explained)

    # Longest first: a gap no longer than the longest unexplained one so far cannot beat it (a level of 2,048
    # requests has half a million gaps; only the few longest are looked at against the requests).
    longest = 0.0
    for a, b in sorted(gaps, key=lambda g: g[0] - g[1]):
        if b - a <= longest:
            break
        longest = max(longest, unexplained(a, b))
    return longest, float(np.median([b - a for a, b in gaps]))

#: The block's own disturbances (``disturbance``), by how their reasons start.
OWN_CAUSES = {"failed": re.compile(r"\d+ request\(s\) failed"), "client": re.compile("the client's event loop"),
              "stall": re.compile("no token arrived")}

#: Those that, met again in a block measured again at the same level, are how this level runs here, not a passing
#: disturbance: that block counts. A server that fails a share of its requests does so every time; a client
#: whose event loop lags at every block is this machine's limit at that level (the row says client-bound). A
#: stall stays a disturbance however often it comes back (a busy machine starves a server's threads).
THE_SERVERS_WHEN_MET_AGAIN = frozenset({"failed", "client"})

def own_cause(reason: str | None) -> str | None:
    """The kind of a block's own disturbance; None for none, or for a judgement against other blocks."""
    return next((kind for kind, start in OWN_CAUSES.items() if reason and start.match(reason)), None)

def disturbance(run: BlockRun, figures: dict[str, Any]) -> str | None:
    """Why the machine, not the server under test, shaped this block; None when nothing did."""
    if figures["failed"]:
        return f"{figures['failed']} request(s) failed ({figures['errors']})"
    measured = [r for r in run.records if not r.warmup]
    gap, median = longest_gap(measured)
    ttft_p90 = (figures.get("ttft_ms_p90") or 0.0) / 1000
    limit = max(STALL_FLOOR_S, STALL_FACTOR * median, 2 * ttft_p90)
    lag_s = (run.loop_lag_max_ms or 0.0) / 1000
    stall = f"no token arrived for {gap:.2f} s (the level's pace: a token every {median * 1000:.1f} ms)"
    if gap - lag_s > limit:  # longer than the client's own lag explains: the server stalled
        return stall
    if lag_s * 1000 >= LAG_DISTURBED_MS:
        return f"the client's event loop stalled for {lag_s * 1000:.0f} ms"
    return stall if gap > limit else None

#: Against its level's other blocks (at least OUTLIER_MIN_OTHERS of them): a throughput further from their
#: median than OUTLIER_MADS robust standard deviations, and than OUTLIER_FLOOR (as a factor).
OUTLIER_MIN_OTHERS = 3

OUTLIER_MADS = 5.0

OUTLIER_FLOOR = 1.5

def outlier(value: float, others: Sequence[float]) -> str | None:
    """Why a block's throughput lies far outside its level's other blocks; None when it does not."""
    if len(others) < OUTLIER_MIN_OTHERS or value <= 0 or any(x <= 0 for x in others):
        return None
    logs = np.log(np.asarray(others, dtype=float))
    median = float(np.median(logs))
    spread = 1.4826 * float(np.median(np.abs(logs - median)))
    distance = abs(math.log(value) - median)
    if distance > max(OUTLIER_MADS * spread, math.log(OUTLIER_FLOOR)):
        return (f"its throughput ({value:,.1f} tok/s) lies {math.exp(distance):.2f}x from its level's other "
                f"blocks' ({math.exp(median):,.1f})")
    return None

#: A round of blocks in turn whose paired ratio lies this far (at least) from its level's other rounds' is set aside:
#: well past ordinary noise between rounds here (8 % or so), as far as the shifts seen on this machine (a fifth).
ROUND_FLOOR = 1.20

def outlier_round(ratios: Sequence[float]) -> tuple[int, str] | None:
    """The round (index) whose paired ratio lies far outside its level's other rounds', and why; None when none
    does. Each round is held against all the others (at least three), so a round measured early is judged too:
    more than max(5 MADs, 20 %) from their median is a shift of the machine inside the round, which pairing
    cannot cancel. Only the farthest round is named."""
    if len(ratios) < OUTLIER_MIN_OTHERS + 1 or any(x <= 0 for x in ratios):
        return None
    logs = np.log(np.asarray(ratios, dtype=float))
    worst: tuple[float, int, float] | None = None
    for i in range(len(logs)):
        others = np.delete(logs, i)
        median = float(np.median(others))
        spread = 1.4826 * float(np.median(np.abs(others - median)))
        distance = abs(float(logs[i]) - median)
        if distance > max(OUTLIER_MADS * spread, math.log(ROUND_FLOOR)) and (worst is None or distance > worst[0]):
            worst = (distance, i, median)
    if worst is None:
        return None
    _, i, median = worst
    return i, (f"the ratio of its round ({ratios[i]:.3f}) lies {math.exp(abs(math.log(ratios[i]) - median)):.2f}x "
               f"from its level's other rounds' ({math.exp(median):.3f}): the machine shifted inside the round")
