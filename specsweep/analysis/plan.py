"""What a comparison will cost, said before it starts: server starts, levels and rounds, minutes.

Start times and round times come from earlier runs of the same configurations in the results store (a
configuration's name and launch command), else they are assumed, and the plan says which. The rounds a level
needs: at least enough for its distribution-free interval to be bounded at the answer's confidence
(``stats.min_rounds``), at most its budget (``DecisionConfig.max_blocks``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from pydantic import BaseModel, Field

from specsweep.analysis.decision import DecisionConfig
from specsweep.analysis.search import STEER_ROUNDS, max_levels
from specsweep.analysis.stats import min_rounds
from specsweep.bench.config import SweepConfig
from specsweep.results import ResultsStore

#: What a start and a block are taken to last when no earlier run of the configuration says.
ASSUMED_START_S = 60.0
ASSUMED_BLOCK_S = 30.0


class Estimate(BaseModel):
    seconds: float
    known_from: int = Field(description="Earlier runs it comes from (0: assumed).")

    def words(self) -> str:
        source = f"from {self.known_from} earlier run(s)" if self.known_from else "assumed: no earlier run"
        return f"{self.seconds:.0f} s ({source})"


class Plan(BaseModel):
    starts: int
    start: Estimate
    levels: int = Field(description="Levels measured (a search's: the most it may measure).")
    levels_words: str
    rounds_low: int = Field(description="Rounds a level needs at least for a bounded interval.")
    rounds_high: int = Field(description="Rounds a level may take at most (its budget).")
    round: Estimate = Field(description="One round: a block of each configuration.")
    minutes_low: float
    minutes_high: float
    budget_minutes: float | None = None

    def words(self) -> str:
        budget = f"; budget {self.budget_minutes:g} minutes (the search stops within it)" if self.budget_minutes \
            else ""
        return (f"{self.starts} server start(s) x {self.start.words()}, {self.levels_words} of {self.rounds_low}-"
                f"{self.rounds_high} rounds, a round {self.round.words()}: about {self.minutes_low:.0f}-"
                f"{self.minutes_high:.0f} minutes{budget}")


def _earlier(store: ResultsStore, names: Sequence[str], commands: Sequence[str | None],
             exclude: Sequence[str]) -> tuple[list[float], list[float]]:
    """Start times and round times (block durations of each configuration, summed) of earlier completed runs of
    these configurations."""
    runs = store.runs()
    if runs.empty:
        return [], []
    starts: list[float] = []
    blocks: dict[str, list[float]] = {}
    for name, command in zip(names, commands, strict=True):
        same = runs[(runs["config_name"] == name) & (runs["status"] == "completed") & ~runs["run_id"].isin(exclude)]
        if command is not None and "command" in same:
            same = same[same["command"] == command]
        starts += [float(x) for x in same["time_to_ready_s"].dropna()]
        if not same.empty:
            levels = store.levels(list(same["run_id"]))
            if not levels.empty:
                blocks[name] = [float(x) for x in levels["duration_s"].dropna() if x > 0]
    rounds = [statistics.median(v) for v in blocks.values() if v]
    return starts, ([sum(rounds)] if len(rounds) == len(names) else [])


def plan(store: ResultsStore, names: Sequence[str], commands: Sequence[str | None], sweep: SweepConfig,
         decision: DecisionConfig, *, exclude: Sequence[str] = (), restart: bool = False) -> Plan:
    """The plan of a comparison of the configurations ``names`` (their launch commands, masked)."""
    starts, rounds = _earlier(store, names, commands, exclude)
    start = Estimate(seconds=statistics.median(starts), known_from=len(starts)) if starts else \
        Estimate(seconds=ASSUMED_START_S, known_from=0)
    round_ = Estimate(seconds=rounds[0], known_from=1) if rounds else \
        Estimate(seconds=ASSUMED_BLOCK_S * len(names), known_from=0)
    if sweep.search is not None:
        levels = max_levels(sweep.search.min, sweep.search.max)
        words = f"up to {levels} levels (a search over {sweep.search.min}..{sweep.search.max})"
    else:
        levels = len(sweep.levels())
        words = f"{levels} level(s)"
    confidence = decision.interval_confidence(sweep.num_requests, levels)
    low = max(decision.min_blocks, min_rounds(confidence))
    high = max(low, decision.max_blocks(sweep.num_requests))
    # A search settles the two levels around its crossing; the others steer it.
    settled = 2 if sweep.search is not None else levels
    steered = levels - settled
    # Restarted for each block: a start per block, as many as the rounds the plan counts at least.
    n_starts = len(names) * ((settled * low + steered * STEER_ROUNDS) if restart else 1)
    fixed = len(names) * start.seconds
    least = fixed + round_.seconds * (settled * low + steered * STEER_ROUNDS)
    most = fixed + round_.seconds * (settled * high + steered * STEER_ROUNDS)
    if restart:
        least += start.seconds * len(names) * (settled * low + steered * STEER_ROUNDS)
        most += start.seconds * len(names) * (settled * high + steered * STEER_ROUNDS)
    return Plan(starts=n_starts, start=start, levels=levels, levels_words=words,
                rounds_low=low, rounds_high=high, round=round_, minutes_low=least / 60, minutes_high=most / 60,
                budget_minutes=decision.budget_minutes)
