"""The comparison: crossover, recommendation, engine settings, noise and refusal of unlike runs."""

from __future__ import annotations

import pandas as pd
import pytest

from specsweep.compare import check_fingerprints, compare_levels, comparison_markdown, speculative_tokens_from_command
from specsweep.errors import ConfigError
from specsweep.records import RunRow


def levels(values: dict[int, list[float]]) -> pd.DataFrame:
    rows = []
    for c, tps in values.items():
        for rep, t in enumerate(tps):
            rows.append({"mode": "concurrency", "concurrency": c, "repeat": rep, "output_tokens_per_s": t,
                         "ttft_ms_median": 10.0 * c, "itl_ms_median": 5.0, "spec_accept_length": None,
                         "spec_acceptance_rate": None})
    return pd.DataFrame(rows)


def test_published_shape_gives_crossover_at_two() -> None:
    base = levels({1: [92.6, 92.0, 93.1], 2: [181, 180, 182], 8: [537, 530, 540], 64: [767, 770, 765]})
    spec = levels({1: [96.1, 96.5, 95.8], 2: [173, 172, 174], 8: [318, 320, 317], 64: [346, 345, 347]})
    comp = compare_levels(base, spec, num_speculative_tokens=3)
    assert comp.crossover == 2
    assert comp.recommendation == "Speculation pays up to 1 concurrent request; disable it at 2 and above."
    assert comp.vllm_num_speculative_tokens_per_batch_size == {"1-1": 3, "2-4096": 0}
    assert comp.router["speculative_below_concurrency"] == 2
    assert [lv.verdict for lv in comp.levels] == ["speculation faster", "baseline faster", "baseline faster", "baseline faster"]
    pol = comp.policy_mean_tokens_per_s
    assert pol["switch_per_level"] >= pol["always_off"] > pol["always_on"]
    assert pol["switch_per_level"] == pytest.approx((96.1 + 181 + 537 + 767) / 4)
    md = comparison_markdown(comp)
    assert "disable it at 2 and above" in md and '"2-4096": 0' in md


def test_single_samples_are_labelled() -> None:
    comp = compare_levels(levels({1: [100.0], 4: [300.0]}), levels({1: [150.0], 4: [200.0]}))
    assert [lv.verdict for lv in comp.levels] == ["single sample: speculation faster", "single sample: baseline faster"]
    assert comp.levels[0].ratio_low is None
    assert any("single sample" in n for n in comp.notes)


def test_overlapping_repeats_are_within_noise() -> None:
    comp = compare_levels(levels({1: [100, 120, 80]}), levels({1: [105, 85, 125]}))
    assert comp.levels[0].verdict == "within noise"
    assert comp.levels[0].ratio_low < 1 < comp.levels[0].ratio_high


def test_never_and_always() -> None:
    always = compare_levels(levels({1: [100.0], 8: [300.0]}), levels({1: [200.0], 8: [400.0]}))
    assert always.crossover is None and "pays at every level measured" in always.recommendation
    assert always.vllm_num_speculative_tokens_per_batch_size == {"1-4096": 3}
    never = compare_levels(levels({1: [200.0], 8: [400.0]}), levels({1: [100.0], 8: [300.0]}))
    assert never.crossover == 1 and "does not pay at any level" in never.recommendation
    assert never.vllm_num_speculative_tokens_per_batch_size == {"1-4096": 0}


def test_no_common_levels_is_an_error() -> None:
    with pytest.raises(ConfigError, match="share no concurrency level"):
        compare_levels(levels({1: [1.0]}), levels({2: [1.0]}))


def test_unlike_environments_are_refused_unless_allowed() -> None:
    a = RunRow(config_name="a", gpu="NVIDIA RTX PRO 6000", gpu_count=8, driver="580.1", engine_version="sglang 0.5.4",
               model="kimi")
    b = a.model_copy(update={"driver": "575.0"})
    with pytest.raises(ConfigError, match="driver: '580.1' vs '575.0'"):
        check_fingerprints(a, b, allow_mismatch=False)
    assert check_fingerprints(a, b, allow_mismatch=True) == ["driver: '580.1' vs '575.0'"]
    unknown = a.model_copy(update={"gpu": None})
    assert check_fingerprints(a, unknown, allow_mismatch=False) == []  # unknown is not a difference


def test_speculative_tokens_from_command() -> None:
    assert speculative_tokens_from_command("python -m sglang.launch_server --speculative-num-steps 5") == 5
    assert speculative_tokens_from_command("llama-server -md d --spec-draft-n-max 4") == 4
    assert speculative_tokens_from_command(None) == 3


def test_within_noise_is_not_paying() -> None:
    # As a tiny CPU model gives: C=1 and C=8 a few percent either way, C=4 baseline clearly faster.
    base = levels({1: [389.9, 380.0, 395.0], 2: [449.2, 440.0, 455.0], 4: [462.9, 465.0, 461.0], 8: [571.9, 540.0, 600.0]})
    spec = levels({1: [405.5, 370.0, 430.0], 2: [449.3, 430.0, 468.0], 4: [441.4, 439.0, 443.0], 8: [587.7, 550.0, 610.0]})
    comp = compare_levels(base, spec)
    assert [lv.verdict for lv in comp.levels] == ["within noise", "within noise", "baseline faster", "within noise"]
    assert comp.crossover == 1
    assert "does not pay at any level" in comp.recommendation and "every level" not in comp.recommendation
    assert any("Within the noise at concurrency 1, 2, 8" in n for n in comp.notes)
    all_noise = compare_levels(levels({1: [100, 120, 80], 4: [300, 330, 270]}), levels({1: [105, 85, 125], 4: [310, 280, 320]}))
    assert all_noise.crossover == 1 and "no difference beyond the noise" in all_noise.recommendation


def test_wins_that_are_not_monotonic_give_no_threshold() -> None:
    comp = compare_levels(levels({1: [100.0], 4: [300.0], 8: [400.0]}), levels({1: [90.0], 4: [330.0], 8: [420.0]}))
    assert comp.crossover is None
    assert comp.recommendation.startswith("Speculation pays at 4, 8 concurrent requests but not at every level below")
    assert any("not monotonic" in n for n in comp.notes)


def test_switching_follows_the_recommendation() -> None:
    # Speculation a little ahead everywhere, but never beyond the noise: the advice is "off",
    # and the projected throughput of following it is the baseline's.
    comp = compare_levels(levels({1: [100, 120, 80], 4: [300, 330, 270]}), levels({1: [105, 125, 85], 4: [310, 340, 280]}))
    assert comp.vllm_num_speculative_tokens_per_batch_size == {"1-4096": 0}
    assert comp.policy_mean_tokens_per_s["switch_per_level"] == comp.policy_mean_tokens_per_s["always_off"]
