"""Profiles validate before any host is touched; secrets never show."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from specsweep.engines.sglang import baseline as sglang_baseline
from specsweep.engines.sglang import eagle3 as sglang_eagle3
from specsweep.errors import ConfigError
from specsweep.profiles import load_profile
from specsweep.redact import RedactingLogger, Redactor, mask_argv, mask_env


def test_mask_argv_hides_values_of_secret_flags() -> None:
    argv = ["srv", "--api-key", "abcd1234", "--hf-token=hf_xyz123", "--port", "80", "--model", "m"]
    assert mask_argv(argv) == ["srv", "--api-key", "***", "--hf-token=***", "--port", "80", "--model", "m"]
    counts = ["srv", "--speculative-num-draft-tokens", "4096", "--max-num-batched-tokens=8192"]
    assert mask_argv(counts) == counts  # a count of tokens is not a token


def test_mask_env_by_name() -> None:
    env = {"HF_TOKEN": "x1234", "OPENAI_API_KEY": "y1234", "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_P2P_LEVEL": "NVL"}
    assert mask_env(env) == {"HF_TOKEN": "***", "OPENAI_API_KEY": "***", "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_P2P_LEVEL": "NVL"}


def test_redacting_logger_masks_every_line(caplog: pytest.LogCaptureFixture) -> None:
    logger = RedactingLogger(logging.getLogger("t"), Redactor(["hunter2-secret"]))
    with caplog.at_level(logging.INFO, logger="t"):
        logger.info("server said %s", "key=hunter2-secret!")
    assert caplog.messages == ["server said key=***!"]


def test_profile_placeholders_and_json_braces(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({
        "name": "v", "engine": "vllm", "port": 8000,
        "argv": ["vllm", "serve", "m", "--port", "{port}", "--speculative-config", '{"1-16": 3, "17-4096": 0}',
                 "--api-key", "{api_key}"],
        "api_key": "sk-abcdef123456",
    }))
    profile = load_profile(path, port=9001)
    argv = profile.launch_argv()
    assert argv[4] == "9001" and argv[6] == '{"1-16": 3, "17-4096": 0}' and argv[-1] == "sk-abcdef123456"
    assert "sk-abcdef123456" not in profile.masked_command()
    assert "sk-abcdef123456" not in repr(profile) and "sk-abcdef123456" not in profile.model_dump_json()


def test_profile_toml(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('name = "t"\nargv = ["srv", "--port", "{port}"]\nport = 8100\n[env]\nCUDA_VISIBLE_DEVICES = "0"\n')
    assert load_profile(path).env == {"CUDA_VISIBLE_DEVICES": "0"}


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"name": "x", "argv": ["s"], "port": 70000}, "port: Input should be less than or equal to 65535 (got 70000)"),
        ({"name": "x", "argv": ["s"], "prot": 1}, "prot: unknown field"),
        ({"name": "x"}, "argv: required field is missing"),
        ({"name": "x", "argv": ["s"], "startup_timeout_s": -1}, "startup_timeout_s: Input should be greater than 0"),
        ({"name": "x y", "argv": ["s"]}, "name: String should match pattern"),
        ({"name": "x", "argv": ["A=1", "s"]}, "put environment variables in env"),
        ({"name": "x", "argv": ["s"], "env": {"BAD-NAME": "1"}}, "env: Value error, environment variable name 'BAD-NAME'"),
        ({"name": "x", "argv": ["s"], "cleanup_patterns": ["("]}, "not a valid regular expression"),
        ({"name": "x", "argv": ["s"], "cleanup_patterns": ["sglang::", "."]}, "cleanup_patterns: Value error, "
         "cleanup pattern '.' matches any command line"),
        ({"name": "x", "argv": ["s"], "cleanup_patterns": [".*"]}, "cleanup pattern '.*' matches any command line"),
        ({"name": "x", "argv": ["s"], "cleanup_patterns": ["\\S"]}, "matches any command line"),
        # Patterns run on the worker, where re has no timeout and holds the GIL: none may be slow.
        ({"name": "x", "argv": ["s"], "cleanup_patterns": ["(a+)+$"]}, "cleanup pattern '(a+)+$' could take too "
         "long to match a long command line: it repeats a group"),
        ({"name": "x", "argv": ["s"], "cleanup_patterns": ["(a|ab)*c"]}, "it repeats a group"),
        ({"name": "x", "argv": ["s"], "cleanup_patterns": ["x*x*="]}, "more than one repeat"),
        ({"name": "x", "argv": ["s"], "cleanup_patterns": ["a" * 201]}, "cleanup pattern 1 is 201 characters long: "
         "at most 200"),
        ({"name": "x", "argv": ["s"], "cleanup_patterns": [f"srv{i}::" for i in range(17)]}, "17 cleanup patterns "
         "given: at most 16"),
        ({"name": "x", "argv": ["s"], "log_path": "~/.bashrc"}, "log_path is not taken: each start logs to a fresh "
         "file"),
        ({"name": "x", "argv": ["s"], "env": {"SPECSWEEP_START": "t"}}, "SPECSWEEP_START is set by specsweep itself"),
        ({"name": "x", "argv": ["s"], "health_path": "health"}, "must start with '/'"),
    ],
)
def test_bad_profiles_name_the_field(tmp_path: Path, data: dict, needle: str) -> None:  # type: ignore[type-arg]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        load_profile(path)
    assert needle in str(err.value)


def test_bad_files(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_profile(tmp_path / "a.json")
    with pytest.raises(ConfigError, match="does not exist"):
        load_profile(tmp_path / "missing.json")
    (tmp_path / "b.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_profile(tmp_path / "b.json")


def test_sglang_presets() -> None:
    base = sglang_baseline("/models/kimi", tp=8)
    assert base.launch_argv()[:5] == ["python", "-m", "sglang.launch_server", "--model-path", "/models/kimi"]
    assert "--speculative-algorithm" not in base.argv
    eagle = sglang_eagle3("/models/kimi", "/models/eagle3", num_steps=3, eagle_topk=1)
    argv = eagle.launch_argv()
    assert argv[argv.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert argv[argv.index("--speculative-draft-model-path") + 1] == "/models/eagle3"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"
    assert argv[argv.index("--tp") + 1] == "8"
    assert "sglang::" in eagle.cleanup_patterns
    with pytest.raises(ConfigError, match="num_draft_tokens"):
        sglang_eagle3("/m", "/d", num_steps=3, eagle_topk=1, num_draft_tokens=8)
    with pytest.raises(ConfigError, match="draft_model_path"):
        sglang_eagle3("/m", "")
    assert "--enable-metrics" in base.argv and base.host == "127.0.0.1"  # loopback, as SGLang's own default


def test_sglang_settings_take_its_tuning_flags() -> None:
    from specsweep.engines.sglang import SGLangSettings

    s = SGLangSettings(num_steps=5, eagle_topk=1, cuda_graph_max_bs=32, max_running_requests=64)
    argv = s.profile("speculative").launch_argv()
    for flag, value in (("--speculative-num-steps", "5"), ("--speculative-eagle-topk", "1"),
                        ("--speculative-num-draft-tokens", "6"), ("--cuda-graph-max-bs", "32"),
                        ("--max-running-requests", "64")):
        assert argv[argv.index(flag) + 1] == value, flag
    assert "--cuda-graph-max-bs" in s.profile("baseline").argv and "--speculative-num-steps" not in s.profile("baseline").argv


def test_vllm_presets_run_the_api_server_module_with_the_given_python() -> None:
    from specsweep.engines import preset as by_name

    draft = by_name("vllm-draft", model_path="/m/llama", draft_model_path="/m/draft", python="/opt/vllm/bin/python")
    argv = draft.launch_argv()
    assert argv[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "draft_model", "model": "/m/draft", "num_speculative_tokens": 3}
    assert draft.host == "127.0.0.1" and draft.health_path == "/health" and draft.api_key_env == "VLLM_API_KEY"
    assert "--api-key" not in argv  # the key travels in the environment, never on the command line
    ngram = json.loads(by_name("vllm-ngram", model_path="/m/llama").argv[-1])
    assert ngram["method"] == "ngram" and "model" not in ngram
    assert "--speculative-config" not in by_name("vllm-baseline", model_path="/m/llama").argv
    with pytest.raises(ConfigError, match="draft_model is required for eagle3"):
        by_name("vllm-eagle3", model_path="/m/llama")
    with pytest.raises(ConfigError, match="unknown preset 'vllm-medusa': choose one of"):
        by_name("vllm-medusa", model_path="/m/llama")
