"""Each engine's own knowledge: the forms of the recommendation it loads, checked against its rules, and what
its launch commands say they speculate."""

from __future__ import annotations

import pytest

from specsweep import engines
from specsweep.analysis.compare import off_starts
from specsweep.engines import sglang, vllm

SGLANG = ("python -m sglang.launch_server --model-path /m/kimi --tp 8 --speculative-algorithm EAGLE3 "
          "--speculative-draft-model-path /m/eagle3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
          "--speculative-num-draft-tokens 4")


@pytest.mark.parametrize(("off", "schedule"), [(None, [[1, 4096, 3]]), (1, [[1, 4096, 0]]),
                                                (2, [[1, 1, 3], [2, 4096, 0]]), (16, [[1, 15, 3], [16, 4096, 0]])])
def test_vllm_config_is_a_list_vllm_accepts(off: int | None, schedule: list[list[int]]) -> None:
    spec = engines.speculation_of(SGLANG)
    assert spec is not None and spec.engine == "sglang"
    cfg = vllm.schedule_config(spec, off_starts(3, off), 3)
    assert cfg == {"method": "eagle3", "model": "/m/eagle3", "num_speculative_tokens": 3,
                   "num_speculative_tokens_per_batch_size": schedule}
    vllm.check_speculative_config(cfg)


@pytest.mark.parametrize(("schedule", "needle"), [
    ({"1-7": 3, "8-4096": 0}, "vLLM refuses a dict"),  # what the old report printed
    ([[2, 7, 3]], "must start at 1"),
    ([[1, 8, 3], [8, 4096, 0]], "must not overlap"),
    ([[1, 7, 3], [9, 4096, -1]], ">= 0"),
    ([[1, 0, 3]], "not empty"),
])
def test_vllm_rules_refuse_what_vllm_refuses(schedule: object, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        vllm.check_speculative_config({"num_speculative_tokens_per_batch_size": schedule})


@pytest.mark.parametrize(("off", "want"), [(None, {"1": {"candidate_steps": [3]}}), (1, {"1": {"candidate_steps": [0]}}),
                                            (8, {"1": {"candidate_steps": [3]}, "8": {"candidate_steps": [0]}})])
def test_sglang_adaptive_file(off: int | None, want: dict[str, object]) -> None:
    assert sglang.adaptive_config(off_starts(3, off)) == want


@pytest.mark.parametrize(("cfg", "needle"), [({"small": {"candidate_steps": [3]}}, "not a batch size"),
                                              ({"1": {"candidate_steps": [-1]}}, "integers >= 0"),
                                              ({"1": {"candidate_steps": 3}}, "list"),
                                              ({"8": {"candidate_steps": [0]}}, "smallest key must be 1")])
def test_sglang_rules_refuse_what_sglang_refuses(cfg: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        sglang.check_adaptive_config(cfg)


def test_speculation_read_from_each_engines_command() -> None:
    llama = engines.speculation_of("python -m specsweep.targets.llamacpp.launcher -m t.gguf -md /m/draft.gguf "
                                     "--spec-type draft-simple --spec-draft-n-max 4 --port 8081")
    assert llama is not None and (llama.method, llama.model, llama.num_speculative_tokens) == ("draft_model", "/m/draft.gguf", 4)
    vllm = engines.speculation_of("python -m vllm.entrypoints.openai.api_server --model M --speculative-config "
                                    """'{"method": "draft_model", "model": "D", "num_speculative_tokens": 5}'""")
    assert vllm is not None and (vllm.method, vllm.model, vllm.num_speculative_tokens) == ("draft_model", "D", 5)
    assert engines.speculation_of("python -m sglang.launch_server --model-path M") is None


def test_each_engine_knows_its_own_and_only_the_registry_names_them() -> None:
    """Adding an engine is one module: outside specsweep/engines/, no core module names one (the local targets,
    servers that stand in for engines on this machine, and the command that runs them, are named for theirs)."""
    import re
    from pathlib import Path

    core = Path(__file__).resolve().parents[2] / "specsweep"
    names = re.compile("|".join(re.escape(e.name) for e in engines.ENGINES.values())
                       + "|" + "|".join(re.escape(e.label) for e in engines.ENGINES.values()), re.IGNORECASE)
    found = [f"{p.relative_to(core)}:{n}" for p in core.rglob("*.py") if "engines" not in p.parts and "targets" not in p.parts
                     and p != core / "cli" / "targets.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if names.search(line)]
    assert found == []


def test_the_registry_reads_each_engines_own_fields() -> None:
    from specsweep.records import RequestRecord
    from specsweep.server.engine_metrics import snapshot

    rec = RequestRecord(index=0, scheduled_s=0.0)
    engines.EventReader("llamacpp")({"timings": {"draft_n": 12, "draft_n_accepted": 9}}, rec)
    assert (rec.spec_draft_tokens, rec.spec_accepted_tokens) == (12, 9)
    sglang_event = {"sglext": {"spec_tokens_details": {"spec_verify_ct": 4, "spec_num_proposed_drafts": 12,
                                                       "spec_num_correct_drafts": 8}}}
    only_vllm = RequestRecord(index=0, scheduled_s=0.0)
    engines.EventReader("vllm")(sglang_event, only_vllm)  # vLLM's answers carry none: nothing is read
    assert only_vllm.spec_draft_tokens is None
    custom = RequestRecord(index=0, scheduled_s=0.0)
    engines.EventReader(engines.CUSTOM)(sglang_event, custom)  # a server of unknown kind: every engine's fields
    assert (custom.spec_verify_ct, custom.spec_draft_tokens, custom.spec_accepted_tokens) == (4, 12, 8)
    assert engines.request_fields("sglang") == {"return_spec_tokens_details": True}
    assert engines.request_fields("vllm") == {} and engines.request_fields(engines.CUSTOM) == {}
    # One vocabulary over every engine's /metrics names, each engine's page read into it.
    for page in ("vllm:num_requests_running 3\n", "sglang:num_running_reqs 3\n", "llamacpp:requests_processing 3\n"):
        assert snapshot(page) == {"running": 3.0}, page
    assert len(set(engines.preset_names())) == len(engines.preset_names())
    with pytest.raises(Exception, match="not an engine specsweep knows"):
        engines.check_name("tgi", "profile.engine")


def test_engine_settings_are_keyed_on_engine_through_the_registry_as_it_is_when_a_value_arrives() -> None:
    from pydantic import TypeAdapter, ValidationError

    from tests.helpers.toy_engine import ToySettings, toy_engine

    adapter = TypeAdapter(engines.EngineSettingsParam)  # made before the toy engine is registered
    schema = adapter.json_schema()
    assert set(schema["discriminator"]["mapping"]) == set(engines.ENGINES) == {"sglang", "vllm", "llamacpp"}
    assert schema["discriminator"]["propertyName"] == "engine"
    assert isinstance(adapter.validate_python({"engine": "vllm", "model": "/m", "method": "ngram"}), vllm.VLLMSettings)
    with pytest.raises(ValidationError, match="'toy' is not an engine specsweep knows: choose one of sglang"):
        adapter.validate_python({"engine": "toy", "port": 9})
    with toy_engine():
        assert isinstance(adapter.validate_python({"engine": "toy", "port": 9}), ToySettings)
        assert "toy" in TypeAdapter(engines.EngineSettingsParam).json_schema()["discriminator"]["mapping"]
    with pytest.raises(ValidationError, match="engine is missing: name the engine these settings are for"):
        adapter.validate_python({"model_path": "/m"})
    with pytest.raises(ValidationError) as err:
        adapter.validate_python({"engine": "sglang", "tp": 0})
    assert err.value.errors()[0]["loc"] == ("tp",)  # the field inside the engine's form


def test_an_engine_must_name_itself_in_its_form_and_once() -> None:
    from pydantic import Field

    from specsweep.engines.base import EngineSettings
    from specsweep.errors import ConfigError
    from tests.helpers.toy_engine import Toy

    class Unnamed(EngineSettings):
        engine: str = Field("something-else", description="Not the engine's own name.")

    class BadToy(Toy):
        settings = Unnamed

    with pytest.raises(ConfigError, match="Unnamed.engine must default to the engine's name 'toy'"):
        engines.register(BadToy())

    class OtherSGLang(Toy):
        name = "sglang"
        settings = sglang.SGLangSettings

    with pytest.raises(ConfigError, match="an engine named 'sglang' is known already"):
        engines.register(OtherSGLang())
    assert engines.register(engines.ENGINES["sglang"]) is engines.ENGINES["sglang"]  # the same one again: no change
