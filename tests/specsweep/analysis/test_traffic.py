"""The answer per category of prompt, paired by prompt, and the lossless check: from request records as
the store keeps them."""

from __future__ import annotations

import random
from typing import Any

from specsweep.analysis.traffic import LOSSLESS_MIN_SHARE, MIX, traffic_view
from specsweep.records import BlockRow
from specsweep.reports.markdown import traffic_markdown


def level(c: int, repeat: int = 0, **fields: Any) -> BlockRow:
    return BlockRow.model_validate({"config_name": "x", "level_index": {1: 0, 8: 1}[c], "mode": "concurrency",
                                    "concurrency": c, "repeat": repeat, "prompt_source": "mt-bench",
                                    "temperature": 0.0, **fields})


ROUNDS = 8  # the median's distribution-free interval needs 6 rounds at 95 % (issue 43; 4 were enough for t)


def rows(*, rounds: int = ROUNDS, **fields: Any) -> list[BlockRow]:
    return [level(c, r, **fields) for c in (1, 8) for r in range(rounds)]


def requests(speed: dict[tuple[str, int], float], *, seed: int, digest: str = "same", steps: float | None = None,
             n: int = 12, rounds: int = ROUNDS, shift: tuple[float, ...] = ()) -> list[dict[str, Any]]:
    """``n`` prompts per category at C=1 and C=8, spread over ``rounds`` blocks, each request's speed its
    category's at that level with a little noise (and ``shift[r]`` times that in round r: the machine)."""
    rng = random.Random(seed)
    out = []
    for c in (1, 8):
        categories = sorted({k[0] for k in speed})
        for i, cat in enumerate(categories * n):
            tokens = 100 + (i * 7) % 50
            rnd = (i // len(categories)) % rounds  # every category in every round
            rate = speed[(cat, c)] * rng.uniform(0.97, 1.03) * (shift[rnd] if shift else 1.0)
            out.append({"mode": "concurrency", "level_value": float(c), "repeat": rnd, "warmup": False,
                        "prompt_index": i,
                        "category": cat, "output_tokens": tokens, "e2e_ms": tokens / rate * 1000, "error_type": None,
                        "spec_verify_ct": round(tokens / steps) if steps else None,
                        "output_digest": f"{digest}-{c}-{i}", "finish_reason": "stop"})
    return out


def test_categories_get_their_own_answer_and_the_mix_its_own() -> None:
    # Coding pays at both loads; writing pays at one stream and loses at eight.
    base = {("coding", 1): 50.0, ("coding", 8): 30.0, ("writing", 1): 50.0, ("writing", 8): 30.0}
    spec = {("coding", 1): 80.0, ("coding", 8): 36.0, ("writing", 1): 60.0, ("writing", 8): 21.0}
    view = traffic_view(requests(base, seed=1), requests(spec, seed=2, steps=2.5), rows(), rows(), margin=0.03)
    cells = {(lv.category, lv.concurrency): lv for lv in view.levels}
    assert cells[("coding", 1)].verdict == "faster" and cells[("coding", 8)].verdict == "faster"
    assert cells[("writing", 1)].verdict == "faster" and cells[("writing", 8)].verdict == "slower"
    assert abs(cells[("writing", 8)].ratio - 0.7) < 0.03 and cells[("coding", 1)].pairs == 12
    assert abs(cells[("coding", 1)].accept_length - 2.5) < 0.1
    assert view.recommendations["writing"].speculation_off_from == 8
    assert view.recommendations["coding"].speculation_off_from is None
    assert MIX in view.categories and cells[(MIX, 1)].pairs == 24
    # The same outputs: nothing flagged; output lengths per configuration and level.
    assert [(lv.concurrency, lv.share) for lv in view.lossless] == [(1, 1.0), (8, 1.0)]
    assert not any("Not like for like" in n for n in view.notes)
    assert {(o.config, o.concurrency) for o in view.lengths} == {(n, c) for n in ("baseline", "speculative")
                                                                   for c in (1, 8)}
    assert all(o.stop_share == 1.0 and 100 <= o.p10 <= o.p50 <= o.p90 < 150 for o in view.lengths)


def test_each_category_states_its_switch_in_the_running_batch_the_level_measured() -> None:
    speed = {("writing", 1): 50.0, ("writing", 8): 30.0}
    spec = {("writing", 1): 60.0, ("writing", 8): 21.0}
    view = traffic_view(requests(speed, seed=1), requests(spec, seed=2), rows(), rows(), margin=0.03,
                        batch={1: (1.0, 1.0), 8: (6.2, 7.0)})
    rec = view.recommendations["writing"]
    assert rec.speculation_off_from == 8 and rec.batch_measured and rec.off_from_batch == 2
    assert "was not measured" not in rec.reason and "ran batches of up to 1 at 1" in rec.reason
    # Without the gauge, the category's answer says that the batch is taken as the concurrency.
    blind = traffic_view(requests(speed, seed=1), requests(spec, seed=2), rows(), rows(), margin=0.03)
    assert not blind.recommendations["writing"].batch_measured
    assert "running batch was not measured" in blind.recommendations["writing"].reason


def test_an_engine_that_counts_drafted_and_accepted_tokens_per_request_gets_its_acceptance_per_category() -> None:
    # llama.cpp's answer says per request how many tokens it drafted and how many the target accepted.
    speed = {("coding", 1): 50.0, ("coding", 8): 30.0, ("writing", 1): 50.0, ("writing", 8): 30.0}
    spec = requests(speed, seed=2)
    for r in spec:
        r["spec_draft_tokens"] = 40
        r["spec_accepted_tokens"] = 36 if r["category"] == "coding" else 24
    view = traffic_view(requests(speed, seed=1), spec, rows(), rows(), margin=0.03)
    cells = {(lv.category, lv.concurrency): lv for lv in view.levels}
    assert cells[("coding", 8)].acceptance_rate == 0.9 and cells[("writing", 1)].acceptance_rate == 0.6
    assert cells[(MIX, 1)].acceptance_rate == 0.75 and cells[("coding", 1)].accept_length is None
    assert "x1.00 [" in traffic_markdown(view)[1] and "accepted 90%" in traffic_markdown(view)[1]


def test_a_speculative_server_that_changes_greedy_outputs_is_flagged() -> None:
    speed = {("coding", 1): 50.0, ("coding", 8): 30.0}
    spec = requests(speed, seed=2)
    for rec in spec[::2]:  # half the outputs differ
        rec["output_digest"] = "other"
    view = traffic_view(requests(speed, seed=1), spec, rows(), rows(), margin=0.03)
    assert all(lv.share == 0.5 < LOSSLESS_MIN_SHARE for lv in view.lossless)
    assert any("Not like for like" in n and "6 of 12 prompts at C=1" in n for n in view.notes)
    # At a temperature above 0 outputs are samples: nothing to compare.
    warm = rows(temperature=0.7)
    assert traffic_view(requests(speed, seed=1), spec, warm, warm, margin=0.03).lossless == []


def test_a_shift_of_the_machine_in_a_round_is_one_unit_of_noise_not_one_per_request() -> None:
    # The two configurations are alike, but the machine moved each round's requests together (x1.10, x0.92, ...).
    # Counted per request, 48 pairs would look like a decided "equivalent" ([0.98, 1.02]); 8 rounds cannot rule
    # out a gain.
    speed = {("coding", 1): 50.0, ("coding", 8): 30.0, ("writing", 1): 50.0, ("writing", 8): 30.0}
    shift = (1.07, 0.94, 1.05, 0.95, 1.06, 0.93, 1.04, 0.96)
    view = traffic_view(requests(speed, seed=1, n=24), requests(speed, seed=2, n=24, shift=shift), rows(), rows(),
                        margin=0.03)
    mix = next(lv for lv in view.levels if lv.category == MIX and lv.concurrency == 8)
    assert mix.pairs == 48 and mix.rounds == ROUNDS
    assert mix.verdict == "undetermined" and mix.ratio_high is not None and mix.ratio_high > 1.03
    # One round alone gives no interval and no verdict, however many pairs it holds.
    one = traffic_view(requests(speed, seed=1, rounds=1), requests(speed, seed=2, rounds=1), rows(rounds=1),
                       rows(rounds=1), margin=0.03)
    assert all(lv.verdict == "undetermined" and lv.ratio_low is None for lv in one.levels)


def test_only_prompts_both_configurations_measured_in_counted_blocks_pair_up() -> None:
    speed = {("coding", 1): 50.0, ("coding", 8): 30.0}
    base_rows = [level(c, r, disturbed="the client's event loop stalled for 900 ms" if c == 8 else None)
                 for c in (1, 8) for r in range(ROUNDS)]
    spec_rows = rows()
    base, spec = requests(speed, seed=1), requests(speed, seed=2)
    spec[0]["error_type"] = "Timeout"
    view = traffic_view(base, spec, base_rows, spec_rows, margin=0.03)
    assert {lv.concurrency for lv in view.levels} == {1}  # C=8's baseline block was set aside
    assert next(lv for lv in view.levels if lv.category == "coding").pairs == 11  # a failed request pairs with nothing


def test_synthetic_text_is_said_not_to_represent_real_traffic() -> None:
    speed = {("(none)", 1): 50.0, ("(none)", 8): 30.0}
    synthetic = rows(prompt_source="synthetic", ignore_eos=True)
    view = traffic_view(requests(speed, seed=1), requests(speed, seed=2), synthetic, synthetic, margin=0.03)
    assert any(n.startswith("Measured on synthetic text") for n in view.notes)


def test_a_lossy_verifier_fails_the_output_check_even_where_its_greedy_outputs_matched() -> None:
    speed = {("coding", 1): 50.0, ("coding", 8): 30.0}
    kept = traffic_view(requests(speed, seed=1), requests(speed, seed=2), rows(), rows(), margin=0.03)
    assert kept.lossless_check == "passed" and kept.lossy_verifier is None
    # vLLM's rejection_sample_method fly: every greedy output happened to match here, yet it promises none.
    view = traffic_view(requests(speed, seed=1), requests(speed, seed=2), rows(), rows(), margin=0.03,
                        lossy_verifier="fly")
    assert all(lv.share == 1.0 for lv in view.lossless)
    assert view.lossless_check == "failed" and view.lossy_verifier == "fly"
    assert any("lossy by its settings (fly)" in n and "12 of 12 at C=1" in n for n in view.notes)
    text = "\n\n".join(traffic_markdown(view))
    assert "**Output check at temperature 0: failed (lossy verifier: fly).**" in text
    # Outputs that differ fail it too, lossy or not; at a temperature above 0 there is nothing to check.
    spec = requests(speed, seed=2)
    for rec in spec[::2]:
        rec["output_digest"] = "other"
    assert traffic_view(requests(speed, seed=1), spec, rows(), rows(), margin=0.03).lossless_check == "failed"
    warm = rows(temperature=0.7)
    assert traffic_view(requests(speed, seed=1), spec, warm, warm, margin=0.03,
                        lossy_verifier="fly").lossless_check == "not run"
