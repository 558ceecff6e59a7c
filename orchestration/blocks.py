"""Prefect blocks: SSH hosts and results locations saved once (keys and credentials as secrets) and
named by flows, and the Secret blocks flows read.

    prefect block register -m orchestration.blocks
    SSHHostBlock(hostname="gpu-01", user="bench", private_key=open("id_ed25519").read(),
                 known_hosts=open("known_hosts").read()).save("gpu-01")

Flows take the block's name (``host={"block": "gpu-01"}``), so no key ever travels as a flow
parameter or shows in the UI. API keys for the engine live in Prefect ``Secret`` blocks.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from prefect.blocks.core import Block as PrefectBlock  # a saved Prefect block; Block is a measurement block
from prefect.blocks.system import Secret
from pydantic import Field, SecretStr

from specsweep import policy
from specsweep.errors import ConfigError
from specsweep.hosts.config import HostConfig, SSHEndpoint, SSHLogin
from specsweep.hosts.tunnel import forward_target
from specsweep.profiles import ProfileParams, ServerProfile
from specsweep.results import ResultsLocation
from specsweep.results.location import ResultsFields

_known_files: dict[str, Path] = {}


def _known_hosts_file(text: str) -> Path:
    """known_hosts entries from a block, as a file paramiko and ssh can read: created exclusively
    (mkstemp, 0600) in a directory private to this process (0700, removed at exit), so no other user of
    the machine can plant the host keys a run trusts at a path they could predict."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    if digest not in _known_files:
        fd, name = tempfile.mkstemp(prefix=f"known-hosts-{digest}-", dir=_private_dir())
        with os.fdopen(fd, "w") as f:
            f.write(text if text.endswith("\n") else text + "\n")
        _known_files[digest] = Path(name)
    return _known_files[digest]


_private: list[Path] = []


def _private_dir() -> Path:
    if not _private:
        _private.append(Path(tempfile.mkdtemp(prefix="specsweep-")))
        atexit.register(shutil.rmtree, _private[0], True)
    return _private[0]


class SSHHostBlock(PrefectBlock):
    """A GPU host reached over SSH, optionally through a jump host."""

    _block_type_name = "SSH Host"
    _block_type_slug = "ssh-host"
    _description = "A machine specsweep runs servers on, reached over SSH (optionally through a jump host)."

    hostname: str = Field(description="DNS name or address of the host.")
    port: int = Field(22, ge=1, le=65535, description="SSH port.")
    user: str | None = Field(None, description="Login name.")
    private_key: SecretStr | None = Field(None, description="Private key (OpenSSH or PEM text); stored encrypted.")
    passphrase: SecretStr | None = Field(None, description="Passphrase of the private key, if any.")
    known_hosts: str | None = Field(None, description="known_hosts lines for the host (and jump host).")
    known_hosts_path: str | None = Field(None, description="Or: a known_hosts file on the machine running the flow.")
    accept_unknown_host_key: bool = Field(False, description="Trust a host key missing from known_hosts (logged).")
    jump_hostname: str | None = Field(None, description="Jump host (bastion) to go through, if any.")
    jump_port: int = Field(22, ge=1, le=65535, description="Jump host SSH port.")
    jump_user: str | None = Field(None, description="Login name on the jump host; default the same user.")
    http_address: str | None = Field(None, description="Address the benchmark client uses to reach the server port.")

    def _known_hosts(self) -> Path | None:
        """The block's known_hosts lines (and those of its known_hosts_path file) as one file."""
        if not self.known_hosts:
            return Path(self.known_hosts_path) if self.known_hosts_path else None
        text = self.known_hosts
        if self.known_hosts_path and Path(self.known_hosts_path).expanduser().is_file():
            text = Path(self.known_hosts_path).expanduser().read_text() + "\n" + text
        return _known_hosts_file(text)

    def host_config(self, named_by: HostConfig | None = None) -> HostConfig:
        """The host as a flow uses it (``named_by``: the parameter that named this block; how its
        traffic travels and where its load generator runs are kept, and its http_address if set)."""
        known = self._known_hosts()
        common = dict(private_key=self.private_key, passphrase=self.passphrase, known_hosts=known,
                      accept_unknown_host_key=self.accept_unknown_host_key, use_agent=self.private_key is None)
        target = SSHLogin(hostname=self.hostname, port=self.port, user=self.user, **common)
        jump = (SSHLogin(hostname=self.jump_hostname, port=self.jump_port, user=self.jump_user or self.user,
                            **common)
                if self.jump_hostname else None)
        address = named_by.http_address if named_by and named_by.http_address else self.http_address
        kept = named_by.model_dump(include={"traffic", "load_generator", "host_python", "http_scheme"}) \
            if named_by else {}
        return HostConfig(kind="ssh", ssh=target, jump=jump, http_address=address, **kept)


def check_allowed(host: HostConfig, profiles: list[ServerProfile]) -> None:
    """Before anything runs: the worker's policy (``specsweep.policy``, read on the worker) allows the host (and
    its jump host), every profile's command, environment names and working directory, and the on-host load
    generator's interpreter."""
    rules = policy.load()
    rules.check_host("local" if host.kind == "local" or host.ssh is None else host.ssh.hostname, "host")
    if host.jump is not None:
        rules.check_host(host.jump.hostname, "host.jump")
    for i, profile in enumerate(profiles):
        field = f"profiles[{i}]" if len(profiles) > 1 else "profile"
        rules.check_launch(profile.argv, profile.env_names(), profile.cwd, field)
        rules.check_target(forward_target(profile.host), f"{field}.host")
    if host.traffic_mode == "direct" and not (host.ssh is not None and host.address == host.ssh.hostname):
        rules.check_target(host.address, "host.http_address")
    if host.load_generator == "host":
        rules.check_launch([host.host_python, "-I", "-m", "specsweep.bench.remote"], {}, None, "host",
                           argv_field="host.host_python")


def check_trust(host: HostConfig, block: SSHHostBlock | None = None) -> None:
    """The SSH trust a run's parameters (or an ssh-host block, which anyone with API access can edit) ask for,
    before anything connects: key and known_hosts files and trusting unknown host keys, as the policy allows."""
    rules = policy.load()
    for side in ("ssh", "jump"):
        if (ep := getattr(host, side)) is not None:
            rules.check_ssh_trust(key_path=ep.key_path, known_hosts=ep.known_hosts,
                                  accept_unknown=ep.accept_unknown_host_key, what=f"host.{side}")
    if block is not None:
        rules.check_ssh_trust(key_path=None, known_hosts=block.known_hosts_path,
                              accept_unknown=block.accept_unknown_host_key, what=f"ssh-host block {host.block!r}")


def resolve_host(host: HostConfig) -> HostConfig:
    """The host a flow runs on: the saved ssh-host block it names, else the host as given, its key and
    passphrase read from the Secret blocks it names."""
    if host.block:
        return _ssh_block(SSHHostBlock.load(host.block), host.block).host_config(host)
    return _with_secrets(host, {name: _secret_value(_load_secret(name, field), name, field)
                                for name, field in _secret_names(host)})


async def aresolve_host(host: HostConfig) -> HostConfig:
    """``resolve_host`` for flows, with the SSH trust it asks for checked against the worker's policy."""
    if host.block:
        block = _ssh_block(await SSHHostBlock.aload(host.block), host.block)
        check_trust(host, block)
        return block.host_config(host)
    check_trust(host)
    return _with_secrets(host, {name: await aresolve_secret(name, field) or "" for name, field in _secret_names(host)})


def _secret_names(host: HostConfig) -> list[tuple[str, str]]:
    return [(name, f"host.{side}.{field}") for side in ("ssh", "jump") if (ep := getattr(host, side)) is not None
            for field in ("private_key_secret", "passphrase_secret") if (name := getattr(ep, field))]


def _with_secrets(host: HostConfig, values: dict[str, str]) -> HostConfig:
    if not values:
        return host

    def login(ep: SSHEndpoint | None) -> SSHEndpoint | None:
        if ep is None or not (ep.private_key_secret or ep.passphrase_secret):
            return ep
        data = ep.model_dump(exclude={"private_key", "passphrase"})
        key = values.get(ep.private_key_secret or "")
        phrase = values.get(ep.passphrase_secret or "")
        return SSHLogin.model_validate({**data, "private_key_secret": None, "passphrase_secret": None,
                                        "private_key": SecretStr(key) if key else ep.private_key,
                                        "passphrase": SecretStr(phrase) if phrase else ep.passphrase})

    return host.model_copy(update={"ssh": login(host.ssh), "jump": login(host.jump)})


def _load_secret(name: str, field: str) -> object:
    try:
        return Secret.load(name)
    except ValueError as exc:
        raise ConfigError(f"{field}: there is no Prefect Secret block named {name!r} ({exc})") from None


def _ssh_block(block: object, name: str) -> SSHHostBlock:
    if not isinstance(block, SSHHostBlock):
        raise ConfigError(f"host.block {name!r} is a {type(block).__name__} block, not an ssh-host block")
    return block


async def aresolve_secret(name: str | None, field: str = "api_key_secret") -> str | None:
    """The value of a Prefect Secret block, or None when no name is given."""
    if not name:
        return None
    try:
        secret = await Secret.aload(name)
    except ValueError as exc:
        raise ConfigError(
            f"{field}: there is no Prefect Secret block named {name!r} ({exc}). Create it in the UI (Blocks → "
            "Secret) or with Secret(value=...).save(name), or fix the name."
        ) from None
    return _secret_value(secret, name, field)


def _secret_value(secret: object, name: str, field: str) -> str:
    if not isinstance(secret, Secret):
        raise ConfigError(f"{field}: the block {name!r} is a {type(secret).__name__}, not a Secret")
    return str(secret.get())


async def aresolve_profile(profile: ProfileParams, field: str = "profile") -> ServerProfile:
    """The profile with its API key and secret environment read from the Secret blocks it names."""
    key = await aresolve_secret(profile.api_key_secret, f"{field}.api_key_secret")
    data = profile.model_dump()
    if key:
        data["api_key"] = SecretStr(key)
    for var, block in profile.env_secrets.items():
        data["env"][var] = await aresolve_secret(block, f"{field}.env_secrets.{var}")
    return ServerProfile.model_validate(data)


class ResultsBlock(PrefectBlock, ResultsFields):
    """A results root (local folder or filesystem URL) with the credentials it needs.

        ResultsBlock(url="s3://bench-results/specsweep", endpoint_url="http://minio:9000",
                     access_key_id="...", secret_access_key="...").save("shared-results")
        # then, in a run's parameters: benchmark.results_block = "shared-results"
    """

    _block_type_name = "specsweep results"
    _block_type_slug = "specsweep-results"
    _description = "Where specsweep keeps its Parquet results and reports."

    def location(self) -> ResultsLocation:
        return ResultsLocation.model_validate(self.model_dump(include=set(ResultsFields.model_fields)))


async def aresolve_results(results: str, results_block: str | None) -> ResultsLocation:
    """The results location of a run: the named block's, else the path or URL parameter (inside a root the
    worker's policy names)."""
    if not results_block:
        policy.load().check_results(results, "benchmark.results")
        return ResultsLocation(url=results)
    try:
        block: object = await ResultsBlock.aload(results_block)
    except ValueError as exc:
        raise ConfigError(
            f"benchmark.results_block: there is no specsweep-results block named {results_block!r} ({exc}). "
            "Create it (ResultsBlock(url=...).save(name)) or fix the name."
        ) from None
    if not isinstance(block, ResultsBlock):
        raise ConfigError(f"benchmark.results_block {results_block!r} is a {type(block).__name__}, not a "
                          "specsweep-results block")
    # A block is no more trusted than a parameter (anyone who can reach a Prefect OSS server can write one): its
    # endpoint is where the worker's keys sign requests and its results go, so it is checked as its URL is.
    rules = policy.load()
    rules.check_results(block.url, f"benchmark.results_block {results_block!r}")
    if block.endpoint_url:
        rules.check_endpoint(block.endpoint_url, f"benchmark.results_block {results_block!r}.endpoint_url")
    return block.location()
