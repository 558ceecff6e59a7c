"""One answer per kind of host from each host's comparison: the pooled ratio and interval, the spread between hosts
against the effect, and a host whose interval leaves its kind's others out named as the outlier."""

from __future__ import annotations

from specsweep.analysis.campaign import HostAnswer, HostLevel, campaign_markdown, kind_answers

H100 = "8x NVIDIA H100, driver 550 · sglang 0.5.4 · kimi"
H200 = "8x NVIDIA H200, driver 560 · sglang 0.5.4 · kimi"


def host(name: str, kind: str, levels: dict[int, tuple[float, float, float]], off_from: int | None = 16) -> HostAnswer:
    return HostAnswer(host=name, kind=kind, status="decided", off_from=off_from, worst_case_loss=0.02,
                      levels=[HostLevel(concurrency=c, ratio=r, low=lo, high=hi) for c, (r, lo, hi) in levels.items()])


def test_hosts_of_a_kind_that_agree_give_one_answer_and_a_kind_of_its_own_another() -> None:
    answers = [host("gpu-01", H100, {1: (1.5, 1.4, 1.6), 16: (0.7, 0.65, 0.75)}),
               host("gpu-02", H100, {1: (1.45, 1.38, 1.55), 16: (0.72, 0.66, 0.78)}),
               host("gpu-03", H200, {1: (1.6, 1.5, 1.7), 16: (1.2, 1.1, 1.3)}, off_from=None),
               HostAnswer(host="gpu-04", error="unreachable: connection refused")]
    kinds = {k.kind: k for k in kind_answers(answers, margin=0.05)}
    h100, h200 = kinds[H100], kinds[H200]
    assert h100.hosts == ["gpu-01", "gpu-02"] and not h100.flagged and h100.outliers == []
    assert h100.recommendation.speculation_off_from == 16 and h100.recommendation.status == "decided"
    assert (h100.levels[0].low, h100.levels[0].high) == (1.38, 1.6)  # over every host's interval
    assert 1.0 < h100.levels[0].spread < 1.04 and h100.levels[0].effect > 1.4  # the spread is small against the effect
    assert h200.recommendation.speculation_off_from is None  # its own answer: keep it on
    report = campaign_markdown(answers, list(kinds.values()))
    assert "gpu-04 | - | no answer: unreachable" in report and "hosts disagree" not in report


def test_a_host_that_differs_from_its_kind_beyond_the_intervals_is_flagged_and_named() -> None:
    answers = [host("gpu-01", H100, {1: (1.5, 1.4, 1.6), 16: (0.7, 0.65, 0.75)}),
               host("gpu-02", H100, {1: (1.52, 1.41, 1.62), 16: (0.71, 0.66, 0.77)}),
               host("gpu-05", H100, {1: (1.48, 1.39, 1.58), 16: (1.1, 1.02, 1.2)}, off_from=None)]
    (h100,) = kind_answers(answers, margin=0.05)
    assert h100.flagged and h100.outliers == ["gpu-05"]
    at16 = h100.levels[1]
    assert at16.disagree and at16.outliers == ["gpu-05"] and at16.spread > 1.5
    assert "hosts disagree** (outlier: gpu-05)" in campaign_markdown(answers, [h100])
    assert "x1.10 (outlier)" in campaign_markdown(answers, [h100])
