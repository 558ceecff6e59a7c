"""One answer from per-level verdicts."""

from __future__ import annotations

from specsweep.analysis.recommend import LevelVerdict, recommend, supported_thresholds
from specsweep.analysis.stats import Verdict

C = [1, 2, 4, 8]


def levels(verdicts: list[Verdict], base: list[float] | None = None, spec: list[float] | None = None,
           cs: list[int] = C) -> list[LevelVerdict]:
    base = base or [100.0 * c for c in cs]
    ratio = {"faster": 1.2, "slower": 0.8, "equivalent": 1.0, "no gain": 1.01, "undetermined": 1.01}
    spec = spec or [b * ratio[v] for b, v in zip(base, verdicts, strict=True)]
    return [LevelVerdict(concurrency=c, verdict=v, ratio=s / b, baseline_tokens_per_s=b, speculative_tokens_per_s=s)
            for c, v, b, s in zip(cs, verdicts, base, spec, strict=True)]


def test_the_published_shape_turns_it_off_from_two() -> None:
    rec = recommend(levels(["faster", "slower", "slower", "slower"]), 0.03)
    assert (rec.status, rec.speculation_off_from) == ("decided", 2)
    assert rec.reason.startswith("Speculation pays up to 1 concurrent request (faster at 1 (×1.20))")
    assert "turn it off from 2" in rec.reason
    pol = rec.projected_tokens_per_s
    assert pol["as_recommended"] >= max(pol["always_on"], pol["always_off"])


def test_pays_everywhere_keeps_it_on() -> None:
    # A tie between two levels where it pays does not break the answer.
    rec = recommend(levels(["faster", "faster", "equivalent", "faster"]), 0.03)
    assert (rec.status, rec.speculation_off_from) == ("decided", None)
    assert "Keep it on" in rec.reason and "within ±3% at 4" in rec.reason


def test_never_pays_turns_it_off_from_the_first_level() -> None:
    rec = recommend(levels(["slower", "slower", "equivalent", "slower"]), 0.03)
    assert (rec.status, rec.speculation_off_from) == ("decided", 1)
    assert "does not pay at any level" in rec.reason


def test_ties_everywhere_turn_it_off() -> None:
    # Kept only where it is shown to pay: a tie costs the drafting for nothing.
    rec = recommend(levels(["equivalent"] * 4), 0.03)
    assert (rec.status, rec.speculation_off_from) == ("decided", 1)
    assert "does not pay at any level measured: within ±3% at 1, 2, 4, 8" in rec.reason


def test_a_gain_ruled_out_is_off_and_a_gain_still_possible_is_open() -> None:
    # no gain: the interval lies below 1 + margin (a gain worth having is ruled out) though not below 1.
    rec = recommend(levels(["faster", "faster", "no gain", "slower"]), 0.03)
    assert (rec.status, rec.speculation_off_from) == ("decided", 4)
    assert "no gain beyond the margin at 4" in rec.reason
    rec = recommend(levels(["faster", "faster", "undetermined", "slower"]), 0.03)
    assert rec.status == "undetermined" and rec.between == (4, 8)


def test_a_tie_at_the_boundary_turns_it_off_at_the_tie() -> None:
    # faster, tie, slower: off from the tie (speculation there costs work for nothing).
    rec = recommend(levels(["faster", "equivalent", "slower", "slower"]), 0.03)
    assert (rec.status, rec.speculation_off_from) == ("decided", 2)


def test_an_undetermined_level_at_the_boundary_leaves_it_undetermined() -> None:
    rec = recommend(levels(["faster", "faster", "undetermined", "slower"]), 0.03)
    assert rec.status == "undetermined" and rec.speculation_off_from is None
    assert rec.between == (4, 8)
    assert rec.reason.startswith("undetermined between 4 and 8")
    assert 4 in rec.measure_next and 6 in rec.measure_next  # the open level, and the gap between 4 and 8


def test_an_undetermined_level_far_from_the_boundary_may_still_matter() -> None:
    # If level 1 were slower, the verdicts would not be monotonic: that matters too.
    rec = recommend(levels(["undetermined", "faster", "slower", "slower"]), 0.03)
    assert rec.status == "undetermined" and 1 in rec.measure_next


def test_an_undetermined_level_among_ties_still_decides_between_on_and_off() -> None:
    # Faster there: off from 8 (the tie above it); no gain there: off from 2. Undetermined between them.
    rec = recommend(levels(["faster", "equivalent", "undetermined", "equivalent"]), 0.03)
    assert rec.status == "undetermined" and rec.between == (2, 8) and 4 in rec.measure_next


def test_an_undetermined_level_that_cannot_change_the_answer_does_not_block_it() -> None:
    # Slower everywhere else: whichever way level 1 goes, speculation is off from 1 or 2 ... which
    # differ, so it is undetermined; but at the top, slower or equivalent, the answer is the same.
    rec = recommend(levels(["faster", "slower", "slower", "slower"]), 0.03)
    top = recommend(levels(["faster", "slower", "slower", "equivalent"]), 0.03)
    assert rec.speculation_off_from == top.speculation_off_from == 2


def test_verdicts_that_are_not_monotonic_give_no_threshold() -> None:
    rec = recommend(levels(["faster", "slower", "faster", "slower"]), 0.03)
    assert rec.status == "undetermined" and rec.speculation_off_from is None
    assert rec.reason.startswith("no single threshold fits")
    assert rec.measure_next == [2, 4]


def test_ties_that_lean_towards_speculation_are_still_ties() -> None:
    # faster at 1 (small), slower at 2 by 4 %, and within the margin at 4 and 8 but +2.9 % each, at
    # large throughputs: off from 2. Leaving it on would project a little more, by less than the margin:
    # no advice loses more than the margin to a fixed choice on its own numbers.
    base = [100.0, 200.0, 4000.0, 8000.0]
    spec = [120.0, 192.0, 4116.0, 8232.0]
    rec = recommend(levels(["faster", "slower", "equivalent", "equivalent"], base, spec), 0.03)
    assert (rec.status, rec.speculation_off_from) == ("decided", 2)
    pol = rec.projected_tokens_per_s
    assert pol["as_recommended"] >= max(pol["always_on"], pol["always_off"]) * (1 - 0.03)
    assert supported_thresholds(["faster", "slower", "equivalent", "equivalent"]) == [1]


def test_the_old_report_that_said_disable_at_8_now_says_undetermined() -> None:
    # 1.51x faster at 8 with an interval of [0.91, 3.40]: that interval decides nothing.
    rec = recommend(levels(["faster", "faster", "faster", "undetermined"]), 0.03)
    assert rec.status == "undetermined" and rec.between == (8, None)


def test_a_level_with_no_block_counted_is_open_not_skipped() -> None:
    """Block 1 measured, every block of it set aside as disturbed: the answer stays open there, as for an
    undetermined level, rather than deciding from 2 on as if 1 had never been asked for."""
    import math

    answered = levels(["faster", "slower", "slower"], cs=[2, 4, 8])
    assert recommend(answered, 0.03).status == "decided"  # without level 1: off from 4
    rec = recommend(answered, 0.03, unanswered=[1])
    assert rec.status == "undetermined" and 1 in rec.measure_next
    assert "1 (no block counted)" in rec.reason
    assert all(math.isfinite(v) for v in rec.projected_tokens_per_s.values())  # over the levels answered
    nothing = recommend([], 0.03, unanswered=[1, 4])
    assert nothing.status == "undetermined" and nothing.measure_next == [1, 4] and "set aside" in nothing.reason


def test_a_level_with_no_block_counted_is_measured_again_even_outside_the_open_range() -> None:
    rec = recommend(levels(["faster", "undetermined", "slower"], cs=[1, 2, 4]), 0.03, unanswered=[8])
    assert rec.status == "undetermined" and rec.unanswered == [8] and {2, 8} <= set(rec.measure_next)
    assert "Measure 2 with more requests" in rec.reason and "measure 8 again" in rec.reason
