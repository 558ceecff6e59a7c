"""Does the main job give consistent answers run after run? (Issue 43's test of the main job.)

    .venv/bin/python benchmarks/stability.py [--runs 3] [--results DIR] [-- extra arguments of the main job]

Runs the main job as a user does (`bash scripts/main.sh`: a real llama.cpp server on this CPU, a search, the
verify stage) N times in a row, each into the same results folder, and prints each run's decision line, verify
result and time. Then it checks what the issue asks of N runs in a row:

- no level is decided faster in one run and slower or no gain in another;
- each run's threshold lies within the others' stated bounds: under another run's intervals, the policy "off
  from t" (on at its levels below t, off from t) may lose no more than that run's own stated bound (its
  worst-case loss, or the margin if that is larger);
- every run ends with a setting, its bound and a verification result.

Nothing else should run on the machine meanwhile. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONTRADICTS = {"faster": {"slower", "no gain"}, "slower": {"faster"}, "no gain": {"faster"}}


def loss_under(answer: dict[str, Any], threshold: float | None) -> float:
    """The worst-case loss of "off from ``threshold``" (None: keep it on) under ``answer``'s intervals."""
    worst = 0.0
    for lv in answer["levels"]:
        if lv["interval"] is None:
            return math.inf
        low, high = lv["interval"]
        on = threshold is None or lv["concurrency"] < threshold
        worst = max(worst, max(0.0, 1 - low) if on else max(0.0, 1 - 1 / high))
    return worst


def stated_bound(answer: dict[str, Any]) -> float:
    bound = answer["worst_case_loss"]
    return max(answer["margin"], math.inf if bound is None else bound)


def check(answers: list[dict[str, Any]]) -> list[str]:
    """What the runs contradict each other in (empty: nothing)."""
    problems = []
    verdicts: dict[float, dict[int, str]] = {}
    for i, a in enumerate(answers):
        for lv in a["levels"]:
            verdicts.setdefault(lv["concurrency"], {})[i] = lv["verdict"]
    for c, by_run in sorted(verdicts.items()):
        for i, v in by_run.items():
            for j, w in by_run.items():
                if i < j and w in CONTRADICTS.get(v, set()):
                    problems.append(f"at {c:g}: run {i + 1} says {v}, run {j + 1} says {w}")
    for i, a in enumerate(answers):
        for j, b in enumerate(answers):
            if i != j and (lost := loss_under(b, a["speculation_off_from"])) > stated_bound(b) + 1e-9:
                problems.append(f"run {i + 1}'s threshold ({a['speculation_off_from']}) would lose up to {lost:.1%} "
                                f"under run {j + 1}'s intervals, beyond its stated bound ({stated_bound(b):.1%})")
    for i, a in enumerate(answers):
        if a["status"] not in ("decided", "best available", "refuted") or a["worst_case_loss"] is None:
            problems.append(f"run {i + 1} gave no bounded setting ({a['status']})")
        if a["verified"]["status"] == "not run":
            problems.append(f"run {i + 1} has no verification result")
    return problems


def newest_answer(results: Path, after: float) -> dict[str, Any]:
    found = [p for p in (results / "reports").glob("*/recommendation.json") if p.stat().st_mtime >= after]
    if not found:
        raise SystemExit(f"no recommendation.json written under {results / 'reports'} by the run")
    return json.loads(max(found, key=lambda p: p.stat().st_mtime).read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--results", default=str(ROOT / "data" / "results"))
    ap.add_argument("extra", nargs="*", help="further arguments of the main job")
    args = ap.parse_args()
    answers = []
    for i in range(args.runs):
        t0 = time.time()
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "main.sh"), "--results", args.results, *args.extra],
                              cwd=ROOT, capture_output=True, text=True)
        took = time.time() - t0
        if proc.returncode not in (0, 3):  # 3: a refuted setting, which is an answer too
            print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
            raise SystemExit(f"run {i + 1}: the main job exited {proc.returncode}")
        answer = newest_answer(Path(args.results), t0)
        answers.append(answer)
        levels = ", ".join(f"{lv['concurrency']}: {lv['verdict']} x{lv['ratio']:.2f}"
                           + (f" [{lv['interval'][0]:.2f}, {lv['interval'][1]:.2f}]" if lv["interval"] else " [-]")
                           + f" ({lv['blocks']['baseline']} rounds)" for lv in answer["levels"])
        print(f"run {i + 1}: {took:.0f} s, exit {proc.returncode}, {answer['status']}\n  {answer['decision']}\n"
              f"  levels: {levels}\n  verified: {answer['verified']['status']}", flush=True)
    problems = check(answers)
    print(f"\n{args.runs} runs in a row: " + ("CONSISTENT (no verdict contradicted, each threshold within the others' "
                                                "stated bounds, a setting and a verification from each)"
                                                if not problems else "INCONSISTENT:\n  " + "\n  ".join(problems)))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
