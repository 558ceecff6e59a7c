"""How often the answer is right, and how often it is decided: simulated comparisons with known ratios through
the product's own decision code (``tests/helpers/known_answer.py``; the test is tests/specsweep/analysis/test_known_answer.py).

    .venv/bin/python benchmarks/known_answer.py [--runs 2000] [--seed 43] [--budget-rounds 24]

Prints per scenario: runs, the share decided, the mean worst-case bound, how often a verdict was wrong anywhere,
how often the intervals covered every true ratio together, how often the setting's true loss lay beyond its
bound, and the mean rounds per level.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specsweep.analysis.decision import DecisionConfig  # noqa: E402
from tests.helpers.known_answer import NUM_REQUESTS, Outcome, simulate  # noqa: E402


def row(name: str, got: list[Outcome]) -> str:
    recs = [o.comparison.recommendation for o in got]
    bounds = [r.worst_case_loss for r in recs if r.worst_case_loss is not None]
    rounds = [min(lv.blocks) for o in got for lv in o.comparison.levels]
    cells = [f"{len(got)}", f"{sum(r.status == 'decided' for r in recs) / len(got):.1%}",
             f"{statistics.fmean(bounds):.1%}" if bounds else "-", f"{len(bounds) / len(got):.0%}",
             f"{sum(bool(o.wrong_verdicts) for o in got) / len(got):.2%}", f"{sum(o.covered for o in got) / len(got):.3f}",
             f"{sum(o.beyond_bound for o in got) / len(got):.2%}", f"{statistics.fmean(rounds):.1f}"]
    return f"| {name} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=43)
    parser.add_argument("--budget-rounds", type=int, default=24)
    args = parser.parse_args()
    decision = DecisionConfig(design="alternate", max_requests_per_level=NUM_REQUESTS * args.budget_rounds,
                              max_seconds_per_level=86400)
    t0 = time.monotonic()
    outcomes = simulate(args.runs, seed=args.seed, decision=decision)
    by: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by[o.scenario if not o.scenario.startswith("random") else "random crossovers, 4-8 levels"].append(o)
    print(f"{args.runs} comparisons, alpha {decision.alpha}, margin {decision.margin:.0%}, budget {args.budget_rounds} "
          f"rounds per level, {time.monotonic() - t0:.1f} s\n")
    print("| scenario | runs | decided | mean worst-case bound | bounded | wrong verdict anywhere | simultaneous coverage "
          "| true loss beyond bound | rounds per level |")
    print("|---" * 9 + "|")
    for name, got in by.items():
        print(row(name, got))
    print(row("all", outcomes))


if __name__ == "__main__":
    main()
