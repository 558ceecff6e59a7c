"""A vLLM profile that would measure something other than it claims is refused (or warned about) before any host
is touched, naming the rule. The rules come from vLLM's documentation and issue threads (docs/engines.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from specsweep import engines
from specsweep.engines.vllm import VLLMSettings, speculative
from specsweep.errors import ConfigError
from specsweep.hosts import HostConfig
from specsweep.parameters import BenchmarkSettings
from specsweep.profiles import ServerProfile


def _vllm(*extra: str, **spec: object) -> ServerProfile:
    return speculative("/m/target", "eagle3", draft_model="/m/eagle3", k=3, extra_args=list(extra),
                       speculative_extra=dict(spec))


def _rules(profile: ServerProfile) -> list[tuple[str, bool]]:
    return [(f.rule, f.refused) for f in engines.ENGINES["vllm"].check_launch(profile.argv)]


def test_a_batched_token_budget_under_max_num_seqs_times_k_plus_1_is_refused() -> None:
    tight = _vllm("--max-num-batched-tokens", "512", "--max-num-seqs", "256")  # 256 x 4 = 1024 needed
    with pytest.raises(ConfigError, match=r"profile \(vllm-eagle3\) is refused: \[batched-token-budget\].*"
                                          r"at least 1024, or lower --max-num-seqs to 128"):
        engines.check_launch(tight)
    assert _rules(_vllm("--max-num-batched-tokens", "1024", "--max-num-seqs", "256")) == []
    # max_num_seqs left to vLLM: its default is assumed, and said.
    with pytest.raises(ConfigError, match="vLLM's default max_num_seqs 256: check yours"):
        engines.check_launch(_vllm("--max-num-batched-tokens", "1000"))
    assert _rules(_vllm()) == []  # no budget given: vLLM sizes its own


def test_a_per_batch_table_under_data_parallelism_is_refused() -> None:
    table = {"num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, 4096, 0]]}
    assert _rules(_vllm("--data-parallel-size", "2", **table)) == [("per-batch-table-under-dp", True)]
    assert _rules(_vllm("--data-parallel-size", "1", **table)) == []
    assert _rules(_vllm("--data-parallel-size", "2")) == []  # a fixed K under DP is fine


def test_a_table_whose_effective_k_never_changes_is_warned_about() -> None:
    # K 5 above num_speculative_tokens 3 is capped to 3: both ranges run K=3.
    constant = _vllm(num_speculative_tokens_per_batch_size=[[1, 8, 3], [9, 4096, 5]])
    (finding,) = engines.check_launch(constant)
    assert (finding.rule, finding.refused) == ("constant-table", False) and "K=3 at every batch size" in finding.message


@pytest.mark.parametrize("method", ["fly", "synthetic"])
def test_a_lossy_verifier_is_warned_about_and_labelled(method: str) -> None:
    (finding,) = engines.check_launch(_vllm(rejection_sample_method=method))
    assert finding.rule == "lossy-verifier" and not finding.refused and "labelled lossy" in finding.message
    spec = engines.speculation_of(_vllm(rejection_sample_method=method).masked_command(), "vllm")
    assert spec is not None and spec.lossy_verifier == method
    assert engines.check_launch(_vllm(rejection_sample_method="strict")) == []


def test_the_settings_form_refuses_it_as_it_is_filled() -> None:
    with pytest.raises(ValidationError, match="batched-token-budget"):
        VLLMSettings(model="/m/t", method="ngram", extra_args=["--max-num-batched-tokens", "64", "--max-num-seqs", "64"])


async def test_a_run_is_refused_before_any_host_is_touched(tmp_path: Path) -> None:
    from orchestration.run import prepare_run

    results = tmp_path / "results"
    profile = _vllm("--max-num-batched-tokens", "512", "--max-num-seqs", "256")
    # An SSH host nobody could reach: refused before it is resolved, and the results root never written.
    host = HostConfig.model_validate({"kind": "ssh", "ssh": {"hostname": "host.invalid", "user": "u"}})
    with pytest.raises(ConfigError, match=r"profiles\[1\] \(vllm-eagle3\) is refused: \[batched-token-budget\]"):
        await prepare_run([_vllm(), profile], host, BenchmarkSettings(results=str(results)))
    assert not results.exists()
    assert json.loads(profile.argv[profile.argv.index("--speculative-config") + 1])["num_speculative_tokens"] == 3


def test_a_lossy_verifiers_comparison_is_labelled_in_its_report(tmp_path: Path) -> None:
    from specsweep.analysis.compare import compare_runs
    from specsweep.reports.markdown import comparison_markdown
    from tests.specsweep.analysis.test_compare import BASE, SPEC, store_pair

    comp = compare_runs(store_pair(tmp_path / "res", BASE, SPEC), "base1", "spec1")
    assert "Lossy verifier" not in comparison_markdown(comp)
    lossy = engines.speculation_of(_vllm(rejection_sample_method="fly").masked_command(), "vllm")
    text = comparison_markdown(comp.model_copy(update={"speculation": lossy}))
    assert "**Lossy verifier (fly)**: the speculative configuration does not keep the target model's outputs" in text


def test_a_lossy_verifier_fails_the_output_check_of_its_comparison_and_recommendation_json_says_so(
        tmp_path: Path) -> None:
    from specsweep.analysis.compare import compare_runs
    from specsweep.reports.folders import recommendation_json
    from specsweep.results.store import ResultsStore
    from tests.specsweep.analysis.test_compare import BASE, SPEC, store_pair

    store = store_pair(tmp_path / "res", BASE, SPEC)
    runs = ResultsStore(tmp_path / "res")
    # The stored speculative run as vLLM started with rejection_sample_method fly.
    row = runs.run("spec1").model_copy(update={"engine": "vllm", "command": _vllm(
        rejection_sample_method="fly").masked_command()})
    runs.write_run("spec1", row)
    comp = compare_runs(store, "base1", "spec1")
    assert comp.speculation is not None and comp.speculation.lossy_verifier == "fly"
    assert comp.traffic is not None and comp.traffic.lossy_verifier == "fly"
    check = recommendation_json(comp)["lossless_check"]
    assert check == {"result": "failed", "lossy_verifier": "fly", "levels": []}
