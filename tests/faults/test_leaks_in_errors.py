"""What a refusal says names the file or the place and the fix, never what the file holds or the credentials a URL
carries (a flow run's error message and logs are readable by anyone who can reach the Prefect API)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsweep import policy
from specsweep.bench.config import WorkloadConfig
from specsweep.bench.workload import check_source, local_tokenizer
from specsweep.errors import ConfigError
from specsweep.results.location import Location, ResultsLocation
from tests.helpers.tokenizer import make_tokenizer

CANARY = "SECRET-CANARY-7f3a"


@pytest.mark.parametrize("how", ["added_tokens", "merges"])
def test_a_bad_tokenizer_file_is_named_never_quoted(tmp_path: Path, how: str) -> None:
    data = json.loads(make_tokenizer(tmp_path).read_text())
    if how == "added_tokens":
        data["added_tokens"] = CANARY  # the reader says which value it did not expect
    else:
        data["model"]["merges"].insert(0, f"{CANARY} zz")  # ... or which token it does not know
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        local_tokenizer(bad)
    assert str(bad) in str(err.value) and "line " in str(err.value) and "column " in str(err.value)
    assert CANARY not in str(err.value)


def test_a_bad_parquet_prompts_file_is_named_never_quoted(tmp_path: Path) -> None:
    bad = tmp_path / "prompts.parquet"
    bad.write_bytes(b"PAR1" + CANARY.encode() * 4 + b"PAR1")
    with pytest.raises(ConfigError) as err:
        check_source(WorkloadConfig(source="file", prompts_file=bad))
    assert str(bad) in str(err.value) and CANARY not in str(err.value)


def test_credentials_in_a_results_url_are_never_shown() -> None:
    # pyarrow takes user:password@ as the store's keys; the location shown (links, artifacts, errors) drops them.
    where = Location.open(ResultsLocation(url=f"s3://AKIA:{CANARY}@bench-results/runs?region=eu-west-1"))
    assert where.url == "s3://bench-results/runs"
    with pytest.raises(ConfigError) as err:  # a scheme nothing can open: pyarrow's and fsspec's messages quote it
        Location.open(ResultsLocation(url=f"nosuchfs://user:{CANARY}@host/results"))
    assert "nosuchfs://host/results" in str(err.value) and CANARY not in str(err.value)


@pytest.mark.parametrize("url", [f"s3://AKIA:{CANARY}@bench-results/x",
                                 f"s3://bench-results/x?endpoint_override=http://elsewhere:9000&k={CANARY}"])
def test_a_results_root_with_credentials_or_options_is_refused_without_repeating_them(url: str) -> None:
    rules = policy.Policy(results=["s3://bench-results"])
    with pytest.raises(ConfigError) as err:
        rules.check_results(url)
    assert "carries credentials or options" in str(err.value) and "s3://bench-results/x" in str(err.value)
    assert CANARY not in str(err.value) and "elsewhere" not in str(err.value)
