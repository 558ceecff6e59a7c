"""When the machine, not the server under test, shaped a block: the rules that set a block aside.

A block is set aside as disturbed (kept, measured again) only on evidence independent of the throughput being
compared: requests failed, or the client's own event loop stalled (the load generator, not the engine, held
the requests back). Nothing is set aside for its own throughput or ratio: a rule that judges a block by the
value being estimated, and measures it again, biases the estimate and inflates false decisions (at a true
ratio of 1.00 with 11 % noise, false "faster" went from 1.5 % to 3.5 %). A stall of an engine under test (no
token for a while) is that engine's performance and counts: setting it aside would favour the configuration
that stalls. The intervals (``specsweep.analysis.stats``) are distribution-free, so an occasional shift of
the machine inside a round needs no rule.

Failed requests or a client lag met again when the level is measured again are how the level runs here (a
server that fails a share of its requests does so every time; a client that lags at every block is the
machine's limit): from then on such a block counts (``THE_SERVERS_WHEN_MET_AGAIN``), unless none of its
requests completed."""

from __future__ import annotations

import re
from typing import Any

from specsweep.records import BlockRow, BlockRun

#: The client's event loop held up this long at once: the machine, not the server, shaped the block.
LAG_DISTURBED_MS = 200.0

#: The block's own disturbances (``disturbance``), by how their reasons start.
OWN_CAUSES = {"failed": re.compile(r"\d+ request\(s\) failed"), "client": re.compile("the client's event loop")}

#: Those that, met again in a block measured again at the same level, are how this level runs here, not a passing
#: disturbance: that block counts. A server that fails a share of its requests does so every time; a client
#: whose event loop lags at every block is this machine's limit at that level (the row says client-bound).
THE_SERVERS_WHEN_MET_AGAIN = frozenset({"failed", "client"})

#: Failures that are what the server sent (its bytes broke HTTP or SSE framing, its events were not JSON), not
#: what the machine did: a block where every request met the same one is the server's answer, not a disturbance.
THE_SERVERS_ANSWER = frozenset({"ProtocolError", "MalformedSSE"})


def servers_answer(row: BlockRow) -> str | None:
    """The one failure of THE_SERVERS_ANSWER that every request of the block met (none completed); else None."""
    kind = row.errors.split(":", 1)[0]
    return kind if row.requests and not row.completed and kind in THE_SERVERS_ANSWER \
        and row.errors == f"{kind}: {row.failed}" else None


def own_cause(reason: str | None) -> str | None:
    """The kind of a block's own disturbance; None for none (or a block set aside beside another)."""
    return next((kind for kind, start in OWN_CAUSES.items() if reason and start.match(reason)), None)


def disturbance(run: BlockRun, figures: dict[str, Any]) -> str | None:
    """Why the machine, not the server under test, shaped this block; None when nothing did."""
    if figures["failed"]:  # none completed: what the server said is the whole story, so it is quoted
        said = next((r.error_message for r in run.records if not r.warmup and r.error_message), None)
        return f"{figures['failed']} request(s) failed ({figures['errors']})" + \
            (f": {said[:300]}" if said and not figures["completed"] else "")
    lag_ms = run.loop_lag_max_ms or 0.0
    if lag_ms >= LAG_DISTURBED_MS:
        return f"the client's event loop stalled for {lag_ms:.0f} ms"
    return None
