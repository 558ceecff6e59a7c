"""Where a server runs: this machine, or a machine reached over SSH (maybe through a jump host).

These models are flow parameters: they hold no secret in clear text (keys are
``SecretStr``) and every field is described, so the Prefect UI shows them as forms.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator


class SSHEndpoint(BaseModel):
    """How to log in to one SSH server, as a flow parameter: a private key or passphrase is refused
    here (a parameter shows in the Prefect UI and the API); they come from Secret blocks named in
    ``private_key_secret``/``passphrase_secret``, or from an ssh-host block. ``SSHLogin`` is the
    same login with those secrets read."""

    model_config = ConfigDict(extra="forbid")

    hostname: str = Field(description="DNS name or address of the SSH server.", min_length=1)
    port: int = Field(22, ge=1, le=65535, description="SSH port.")
    user: str | None = Field(None, description="Login name; defaults to the local user name.")
    key_path: Path | None = Field(None, description="Private key file on the machine running specsweep.")
    private_key: SecretStr | None = Field(
        None, description="Private key text (OpenSSH or PEM). Prefer a Prefect Secret or ssh-host block."
    )
    passphrase: SecretStr | None = Field(None, description="Passphrase of the private key, if it has one.")
    private_key_secret: str | None = Field(
        None, description="Name of a Prefect Secret block holding the private key text (read when the run starts).")
    passphrase_secret: str | None = Field(
        None, description="Name of a Prefect Secret block holding the key's passphrase.")
    use_agent: bool = Field(True, description="Also try keys offered by a running ssh-agent.")
    known_hosts: Path | None = Field(
        None, description="known_hosts file to check the host key against; default ~/.ssh/known_hosts."
    )
    accept_unknown_host_key: bool = Field(
        False,
        description="Trust a host key that is not in known_hosts yet (logged as a warning). "
        "A changed key is refused regardless.",
    )
    connect_timeout_s: float = Field(10.0, gt=0, le=600, description="TCP connect and SSH handshake timeout.")
    keepalive_s: int = Field(15, ge=0, le=3600, description="Send an SSH keepalive this often (0: never).")

    @field_validator("hostname", "user")
    @classmethod
    def _no_option_or_shell(cls, value: str | None, info: ValidationInfo) -> str | None:
        # As OpenSSH 9.6 checks them (older ssh passes a ProxyCommand's %h to a shell as it is).
        if value is not None and (value.startswith("-") or any(
                c.isspace() or ord(c) < 32 or c in "'\"`$\\;&<>|(){}" for c in value)):
            raise ValueError(f"{info.field_name} {value!r} must not start with '-' nor hold spaces, control "
                             "characters or any of '\"`$\\;&<>|(){}: give the host's DNS name or address and the "
                             "login name as they are")
        return value

    @field_validator("key_path", "known_hosts")
    @classmethod
    def _no_ssh_variable(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None and "${" in str(value):
            raise ValueError(f"{info.field_name} must not hold '${{': OpenSSH would read it as an environment "
                             "variable; give the path itself")
        return value

    @model_validator(mode="before")
    @classmethod
    def _no_secret_in_parameters(cls, data: Any) -> Any:
        if cls is not SSHEndpoint or not isinstance(data, dict):
            return data
        for field in ("private_key", "passphrase"):
            if data.get(field):
                raise ValueError(
                    f"{field} is not accepted in a flow's host parameters: a parameter shows in the Prefect UI and "
                    f"API. Save the host as an ssh-host block and name it in host.block, or store the {field} in a "
                    f"Secret block and give its name in {field}_secret (or use key_path, a file on the worker)"
                )
        return {k: v for k, v in data.items() if k not in ("private_key", "passphrase")}

    @model_validator(mode="after")
    def _key_sources(self) -> SSHEndpoint:
        if sum(x is not None for x in (self.key_path, self.private_key, self.private_key_secret)) > 1:
            raise ValueError("give one of key_path, private_key_secret (or a block's private_key), not several")
        return self


class SSHLogin(SSHEndpoint):
    """An SSH login with its secrets read (from an ssh-host block or Secret blocks): never a flow
    parameter, only built by the run from one."""


class HostConfig(BaseModel):
    """The machine the server runs on."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["local", "ssh"] = Field("local", description="local: this machine; ssh: a remote machine.")
    ssh: SSHEndpoint | None = Field(None, description="Login details, required when kind is ssh.")
    jump: SSHEndpoint | None = Field(
        None, description="Optional bastion to reach the host through (like ssh -J)."
    )
    block: str | None = Field(
        None,
        description="Name of a saved ssh-host block: the host's login details and key come from it (kept in "
        "Prefect, out of the run's parameters). Leave the other fields empty when you name one.",
    )
    traffic: Literal["tunnel", "direct"] | None = Field(
        None,
        description="How the client's HTTP reaches the server: tunnel, a port forward over SSH (through the jump "
        "host), to the server's address on the host (the default for SSH hosts: servers on the host's 127.0.0.1 "
        "are reachable); direct, to http_address (for hosts the client can route to; the default for local ones).",
    )
    http_address: str | None = Field(
        None,
        description="Address the benchmark client uses to reach the server's port when traffic is direct; "
        "default 127.0.0.1 for local hosts. Giving one for an SSH host makes its traffic direct.",
    )
    http_scheme: Literal["http", "https"] = Field(
        "http", description="Scheme of direct traffic: https for a server behind a TLS endpoint (its certificate "
        "checked against this machine's CAs, or SSL_CERT_FILE, for the http_address name). Tunnelled traffic is "
        "http on this machine's loopback.")
    load_generator: Literal["client", "host"] = Field(
        "client", description="Where the load generator runs: client, on the machine running specsweep (its "
        "requests through the tunnel); host, on the SSH host itself against the server's own address, its records "
        "brought back (for fast servers at high concurrency, where a tunnel would set the pace). host needs "
        "specsweep installed there (host_python).")
    host_python: str = Field(
        "python3", min_length=1, description="Interpreter on the SSH host with specsweep installed (load_generator "
        "host), e.g. /opt/specsweep/bin/python.")
    @model_validator(mode="after")
    def _ssh_needs_endpoint(self) -> HostConfig:
        if self.kind == "ssh" and self.ssh is None:
            raise ValueError("kind is 'ssh' but no 'ssh' login details were given: add ssh.hostname (and user, key)")
        if self.block is not None and (self.kind != "local" or self.ssh is not None or self.jump is not None):
            raise ValueError(f"block {self.block!r} names the host's settings: leave kind, ssh and jump empty")
        if self.kind == "ssh" and self.traffic == "direct" and not self.http_address:
            raise ValueError("traffic is 'direct' for an SSH host but http_address is empty: give the address the "
                             "client reaches the server at, or use traffic 'tunnel'")
        if self.load_generator == "host" and self.kind != "ssh" and self.block is None:
            raise ValueError("load_generator is 'host' but the host is local (the client already runs there): "
                             "use load_generator 'client'")
        if self.http_scheme == "https" and (self.traffic_mode != "direct" or self.load_generator == "host"):
            raise ValueError("http_scheme is 'https' but the traffic is not direct from this machine: set traffic "
                             "'direct' with an http_address the server's certificate names, and load_generator "
                             "'client' (or leave http_scheme 'http')")
        if self.kind == "local" and (self.ssh is not None or self.jump is not None):
            raise ValueError("ssh/jump settings were given but kind is 'local': set kind to 'ssh' or drop them")
        return self

    @property
    def traffic_mode(self) -> Literal["tunnel", "direct"]:
        if self.traffic is not None:
            return self.traffic
        return "direct" if self.kind == "local" or self.http_address else "tunnel"

    @property
    def address(self) -> str:
        """Where direct traffic goes."""
        if self.http_address:
            return self.http_address
        return self.ssh.hostname if self.kind == "ssh" and self.ssh else "127.0.0.1"

    def http_url(self, port: int) -> str:
        """Where direct traffic reaches a server listening on ``port`` of this host."""
        host = self.address
        if ":" in host and not host.startswith("["):  # an IPv6 address
            host = f"[{host}]"
        return f"{self.http_scheme}://{host}:{port}"

    @property
    def label(self) -> str:
        if self.block:
            return f"ssh-host block {self.block}"
        if self.kind == "local" or self.ssh is None:
            return "local"
        user = f"{self.ssh.user}@" if self.ssh.user else ""
        return f"{user}{self.ssh.hostname}:{self.ssh.port}"
