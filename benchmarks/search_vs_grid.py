"""A search against the power-of-two grid, through the product's own designs and decision code (issue 43, section 3).

    .venv/bin/python benchmarks/search_vs_grid.py [--runs 20] [--noise 0.03]

Speedups shaped like EAGLE-1's in SGLang (arXiv 2503.01840, Table 3), with the crossover placed between 16 and 24
(x1.10 and x0.90 there); blocks hold max(8, 2C) requests of 64 tokens and last as long as they take at a baseline of
100 x C tok/s, with seeded noise of +-``noise`` per block. For each seed it runs ``designs.search`` over 1..64 and
``designs.alternate`` over the grid 1, 2, 4, ..., 64 (same decision settings) on arms that stand in for the servers,
and prints each one's bracket (the last level with speculation on, the threshold), status and measured seconds.
Arithmetic only: seconds of CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specsweep import designs  # noqa: E402
from specsweep.analysis.compare import compare_levels  # noqa: E402
from specsweep.analysis.decision import DecisionConfig  # noqa: E402
from specsweep.analysis.search import max_levels  # noqa: E402
from specsweep.bench.config import SearchRange, SweepConfig  # noqa: E402
from specsweep.records import Block, BlockRow  # noqa: E402
from specsweep.sweep import sweep_levels  # noqa: E402
from specsweep.targets.sim.model import speedup_at  # noqa: E402

SPEEDUPS = {1: 1.40, 4: 1.40, 8: 1.23, 16: 1.10, 24: 0.90, 32: 0.88, 64: 0.88}


def speedup(c: int) -> float:
    return speedup_at(SPEEDUPS, c)


class Arm:
    """A configuration standing in for a server: a block's throughput is known, up to seeded noise."""

    def __init__(self, name: str, ratio: Callable[[int], float], seed: int, noise: float) -> None:
        self.name, self.ratio, self.rng, self.noise = name, ratio, random.Random(seed), noise

    def finished(self) -> list[BlockRow] | None:
        return None

    @contextmanager
    def recording(self) -> Iterator[object]:
        yield self

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[Arm]:
        yield self

    async def measure(self, level: Block) -> BlockRow:
        c = int(level.value)
        speed = 100.0 * c * self.ratio(c) * self.rng.uniform(1 - self.noise, 1 + self.noise)
        requests = max(8, 2 * c)
        return BlockRow(config_name=self.name, level_index=level.index, mode="concurrency", concurrency=c,
                        repeat=level.repeat, requests=requests, completed=requests, duration_s=requests * 64 / speed,
                        output_tokens_per_s=speed, steady_output_tokens_per_s=speed, reached_concurrency=True)

    async def check(self, when: str) -> None: ...

    async def on_block(self, row: BlockRow, done: int, total: int) -> None: ...

    def on_saturation(self) -> None: ...

    async def set_aside(self, row: BlockRow) -> None: ...


def bracket(comp: object) -> str:
    rec = comp.recommendation  # type: ignore[attr-defined]
    measured = sorted(lv.concurrency for lv in comp.levels)  # type: ignore[attr-defined]
    t = rec.speculation_off_from
    below = max((c for c in measured if t is None or c < t), default=None)
    return f"({below}, {t}]" if t is not None else f"on to {below}"


async def one(seed: int, noise: float, decision: DecisionConfig) -> tuple[str, str, float, str, str, float, bool]:
    base, spec = Arm("base", lambda c: 1.0, 2 * seed, noise), Arm("spec", speedup, 2 * seed + 1, noise)
    rows = await designs.search(base, spec, SearchRange(min=1, max=64), decision, 8, restart=False)
    found = compare_levels(*rows, decision=decision, paired=True, num_requests=8, answer_levels=max_levels(1, 64),
                           search=True)
    base, spec = Arm("base", lambda c: 1.0, 2 * seed, noise), Arm("spec", speedup, 2 * seed + 1, noise)
    grid_rows = await designs.alternate(base, spec, sweep_levels(SweepConfig(concurrency=[1, 2, 4, 8, 16, 32, 64])),
                                        decision, 8, restart=False)
    grid = compare_levels(*grid_rows, decision=decision, paired=True, num_requests=8)
    t = found.recommendation.speculation_off_from
    below = max((lv.concurrency for lv in found.levels if t is not None and lv.concurrency < t), default=0)
    inside = t is not None and below >= 16 and t <= 24
    return (bracket(found), found.recommendation.status, sum(r.duration_s for rs in rows for r in rs),
            bracket(grid), grid.recommendation.status, sum(r.duration_s for rs in grid_rows for r in rs), inside)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--noise", type=float, default=0.03)
    args = ap.parse_args()
    decision = DecisionConfig(min_blocks=4, max_requests_per_level=8 * 24)
    print(f"search over 1..64 against the grid 1, 2, 4, ..., 64; crossover between 16 and 24; noise +-{args.noise:.0%}")
    print(f"{'seed':>4}  {'search bracket':>15} {'status':>15} {'measured s':>10}   {'grid bracket':>13} {'status':>15} "
          f"{'measured s':>10}  {'ratio':>5}")
    ratios, within = [], 0
    for seed in range(args.runs):
        sb, ss, st, gb, gs, gt, inside = asyncio.run(one(seed, args.noise, decision))
        ratios.append(st / gt)
        within += inside
        print(f"{seed:>4}  {sb:>15} {ss:>15} {st:>10.0f}   {gb:>13} {gs:>15} {gt:>10.0f}  {st / gt:>5.2f}")
    print(f"\nsearch brackets the crossover within [16, 24] in {within}/{args.runs} runs; its measured time is "
          f"{statistics.median(ratios):.2f} of the grid's (median; {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
