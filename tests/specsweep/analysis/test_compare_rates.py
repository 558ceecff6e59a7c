"""Request-rate comparisons (a trace replayed at its recorded gaps, scaled, or Poisson arrivals): at a rate both
configurations deliver what is sent while they keep up, so the comparison counts the speed a request saw; the
answer is "off from R requests/s", carried to the engine's per-batch setting by the batch the engine ran."""

from __future__ import annotations

import pytest

from specsweep.analysis.compare import compare_levels, with_engine_setting
from specsweep.analysis.decision import DecisionConfig
from specsweep.engines import speculation_of
from specsweep.errors import ConfigError
from specsweep.metrics import request_speed
from specsweep.records import BlockRow, RequestRecord
from specsweep.reports.markdown import comparison_markdown
from tests.specsweep.analysis.test_compare import SGLANG_SPEC, rows, steady


def rate_rows(name: str, speeds: dict[float, list[float]], delivered: float,
              batch: dict[float, tuple[float, float]] | None = None) -> list[BlockRow]:
    """Open-loop blocks: each delivers the same output tok/s (what was sent), at the given per-request speeds."""
    out = []
    for i, (rate, xs) in enumerate(speeds.items()):
        mean, high = (batch or {}).get(rate, (None, None))
        for rep, x in enumerate(xs):
            out.append(BlockRow(config_name=name, level_index=i, mode="rate", request_rate_per_s=rate, repeat=rep,
                                output_tokens_per_s=delivered * rate, request_speed_tokens_per_s=x, requests=16,
                                completed=16, duration_s=2.0, engine_running_mean=mean, engine_running_max=high))
    return out


# Speculation decodes faster while the server keeps up (x1.3 at 2/s, x1.1 at 8/s), and queues past its capacity at
# 32/s (x0.4): at every rate both servers delivered the same output tok/s, which says nothing.
BASE = {2.0: steady(60.0), 8.0: steady(55.0), 32.0: steady(40.0)}
SPEC = {2.0: steady(78.0)[::-1], 8.0: steady(60.5)[::-1], 32.0: steady(16.0)[::-1]}
BATCH = {2.0: (0.6, 2.0), 8.0: (2.1, 5.0), 32.0: (7.5, 8.0)}


def test_a_rate_comparison_counts_the_speed_a_request_saw_and_answers_in_requests_a_second() -> None:
    comp = compare_levels(rate_rows("b", BASE, 24.0), rate_rows("s", SPEC, 24.0, BATCH), decision=DecisionConfig(),
                          paired=True, num_requests=16)
    assert comp.mode == "rate" and [lv.concurrency for lv in comp.levels] == [2.0, 8.0, 32.0]
    # The throughputs compared are the speeds (the delivered tok/s are equal at every rate).
    assert [round(lv.ratio, 2) for lv in comp.levels] == [1.3, 1.1, 0.4]
    assert [lv.verdict for lv in comp.levels] == ["faster", "faster", "slower"]
    rec = comp.recommendation
    assert rec.status == "decided" and rec.speculation_off_from == 32.0
    assert rec.decision.startswith("Off from 32 requests/s.")
    # In batch sizes: the engine ran batches of up to 5 at 8/s, the last rate where it stays on.
    assert rec.off_from_batch == 6 and rec.batch_measured
    comp = with_engine_setting(comp, speculation_of(SGLANG_SPEC, "sglang"))
    assert comp.setting is not None and comp.setting.flags
    report = comparison_markdown(comp)
    assert "| requests/s |" in report and "baseline tok/s per request" in report
    assert "Speculation off from: 32 requests/s" in report and "the speed a request saw" in report
    # A router counts requests in flight: the engine's batch threshold, not the rate.
    assert "route to the baseline deployment once 6 or more requests are in flight" in report


def test_a_rate_threshold_without_the_engines_batch_gives_no_per_batch_setting() -> None:
    comp = compare_levels(rate_rows("b", BASE, 24.0), rate_rows("s", SPEC, 24.0), decision=DecisionConfig(),
                          paired=True, num_requests=16)
    rec = comp.recommendation
    assert rec.speculation_off_from == 32.0 and rec.off_from_batch is None
    assert "a request rate is no batch size" in rec.reason
    # Not "keep it on" in the engine's file: no file at all, and the report says why.
    comp = with_engine_setting(comp, speculation_of(SGLANG_SPEC, "sglang"))
    assert comp.setting is None
    assert "No per-batch setting and no router threshold: a request rate is no batch size" in comparison_markdown(comp)


def test_rate_runs_stored_without_the_speed_a_request_saw_are_refused_not_read_as_equal() -> None:
    old = [r.model_copy(update={"request_speed_tokens_per_s": None}) for r in rate_rows("s", SPEC, 24.0)]
    with pytest.raises(ConfigError, match="measured before specsweep stored the speed a request saw"):
        compare_levels(rate_rows("b", BASE, 24.0), old, decision=DecisionConfig(), paired=True, num_requests=16)


def test_a_rate_run_is_not_compared_with_a_concurrency_run() -> None:
    with pytest.raises(ConfigError, match="share no concurrency level.*request_rate list|share no"):
        compare_levels(rate_rows("b", BASE, 24.0), rows("s", {1: steady(90.0)}), decision=DecisionConfig(),
                       paired=True, num_requests=16)


def test_the_speed_a_request_saw_counts_a_failed_requests_time() -> None:
    ok = [RequestRecord(index=i, scheduled_s=0.0, end_s=1.0, output_tokens=50) for i in range(3)]
    failed = RequestRecord(index=3, scheduled_s=0.0, end_s=3.0, output_tokens=0, error_type="ReadError")
    assert request_speed(ok) == 50.0
    assert request_speed([*ok, failed]) == 150.0 / 6.0  # its 3 s spent, nothing delivered
    assert request_speed([]) is None
