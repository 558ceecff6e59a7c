"""SSH hosts against a real OpenSSH server on loopback (started by the tests)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from specsweep.errors import HostError, HostKeyError
from specsweep.hosts import HostConfig, SSHEndpoint, SSHHost, SSHLogin, open_host
from specsweep.server.lifecycle import kill_server, start_server
from tests.conftest import TOY, pids_alive, toy_profile, wait_ready
from tests.helpers.sshd import SSHServer, start_sshd


def endpoint(server: SSHServer, key: Path, known: Path, **kw: object) -> SSHEndpoint:
    return SSHEndpoint(hostname=server.address, port=server.port, user=server.user, key_path=key,
                       known_hosts=known, use_agent=False, **kw)  # type: ignore[arg-type]


def test_run_returns_output_and_exit_code(ssh_host_config: HostConfig) -> None:
    with open_host(ssh_host_config) as host:
        r = host.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
        # (The login shell may print first on stderr: this machine's runs `pyenv rehash`, which complains
        # when other commands hold its lock. That is the host's, not the command's.)
        assert (r.exit_code, r.stdout, r.stderr.endswith("\nerr\n") or r.stderr == "err\n") == (3, "out\n", True), r
        big = host.run(["head", "-c", "300000", "/dev/zero"])
        assert len(big.stdout_bytes) == 300000


def test_key_given_as_secret_text(sshd: SSHServer, ssh_keys: tuple[Path, str], known_hosts: Path) -> None:
    text = ssh_keys[0].read_text()
    ep = SSHLogin(hostname=sshd.address, port=sshd.port, user=sshd.user, private_key=text,  # type: ignore[arg-type]
                     known_hosts=known_hosts, use_agent=False)
    assert text not in repr(ep) and text not in ep.model_dump_json()
    with SSHHost(ep) as host:
        assert host.run(["echo", "hi"]).stdout == "hi\n"


def test_argument_with_shell_metacharacters_arrives_literally(ssh_host_config: HostConfig, tmp_path: Path) -> None:
    hostile = "; touch /tmp/pwned-ssh $(touch /tmp/pwned-ssh) `touch /tmp/pwned-ssh` 'x' \"y\" \n z *"
    with open_host(ssh_host_config) as host:
        r = host.run([sys.executable, "-c", "import json,sys; print(json.dumps(sys.argv[1:]))", hostile, "$HOME"])
    assert json.loads(r.stdout) == [hostile, "$HOME"]
    assert not Path("/tmp/pwned-ssh").exists()


def test_unknown_host_key_is_refused(sshd: SSHServer, ssh_keys: tuple[Path, str], tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyError) as err:
        SSHHost(endpoint(sshd, ssh_keys[0], empty)).run(["true"])
    assert "is not in" in str(err.value) and "accept_unknown_host_key" in str(err.value)
    assert "SHA256:" in str(err.value)


def test_unknown_host_key_accepted_only_when_asked(sshd: SSHServer, ssh_keys: tuple[Path, str], tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with caplog.at_level(logging.WARNING), SSHHost(endpoint(sshd, ssh_keys[0], empty, accept_unknown_host_key=True)) as host:
        assert host.run(["true"]).ok
    assert any("trusting the unknown SSH host key" in m for m in caplog.messages)


def test_changed_host_key_is_refused_even_when_trusting(sshd: SSHServer, ssh_keys: tuple[Path, str], tmp_path: Path) -> None:
    from tests.helpers.sshd import keygen

    other = keygen(tmp_path / "other_host_key")
    kind, key = other.split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[{sshd.address}]:{sshd.port} {kind} {key}\n")
    with pytest.raises(HostKeyError, match="CHANGED"):
        SSHHost(endpoint(sshd, ssh_keys[0], known, accept_unknown_host_key=True)).run(["true"])


def test_wrong_key_is_a_clear_error(sshd: SSHServer, known_hosts: Path, tmp_path: Path) -> None:
    from tests.helpers.sshd import keygen

    keygen(tmp_path / "stranger")
    with pytest.raises(HostError, match="authentication failed"):
        SSHHost(endpoint(sshd, tmp_path / "stranger", known_hosts)).run(["true"])


def test_unresolvable_host_is_a_clear_error(ssh_keys: tuple[Path, str], known_hosts: Path) -> None:
    ep = SSHEndpoint(hostname="no-such-host.invalid", key_path=ssh_keys[0], known_hosts=known_hosts, use_agent=False)
    with pytest.raises(HostError, match="cannot resolve SSH host 'no-such-host.invalid'"):
        SSHHost(ep).run(["true"])


JumpPair = tuple[SSHServer, SSHServer, SSHServer, Path]  # target, bastion, bastion without forwarding, known_hosts


@pytest.fixture(scope="module")
def jump_pair(tmp_path_factory: pytest.TempPathFactory, ssh_keys: tuple[Path, str]) -> Iterator[JumpPair]:
    """A target that listens on 127.0.0.2 and a bastion; the bastion logs each forwarded channel."""
    target = start_sshd(tmp_path_factory.mktemp("target"), [ssh_keys[1]], address="127.0.0.2")
    bastion = start_sshd(tmp_path_factory.mktemp("bastion"), [ssh_keys[1]], log_level="DEBUG1")
    closed = start_sshd(tmp_path_factory.mktemp("closed"), [ssh_keys[1]], allow_forwarding=False)
    known = tmp_path_factory.mktemp("jkh") / "known_hosts"
    known.write_text("\n".join(s.known_hosts_line() for s in (target, bastion, closed)) + "\n")
    yield target, bastion, closed, known
    for s in (target, bastion, closed):
        s.stop()


def test_jump_host(jump_pair: JumpPair, ssh_keys: tuple[Path, str]) -> None:
    target, bastion, _, known = jump_pair
    cfg = HostConfig(kind="ssh", ssh=endpoint(target, ssh_keys[0], known), jump=endpoint(bastion, ssh_keys[0], known))
    with open_host(cfg) as host:
        assert host.run(["echo", "via bastion"]).stdout == "via bastion\n"
    time.sleep(0.2)
    assert f"127.0.0.2 port {target.port}" in bastion.log  # the bastion opened the tunnel to the target


def test_the_tunnel_takes_key_and_known_hosts_paths_with_percent_signs(jump_pair: JumpPair, ssh_keys: tuple[Path, str],
                                                                      tmp_path: Path) -> None:
    """OpenSSH expands %-tokens in IdentityFile and UserKnownHostsFile (and the jump hop's ProxyCommand once
    more): a path holding '%' reaches ssh escaped, through the bastion too."""
    import http.server
    import shutil
    import threading

    from specsweep.hosts.tunnel import open_tunnel

    target, bastion, _, known = jump_pair
    odd = tmp_path / "k%h%%ey"
    odd.mkdir()
    key, odd_known = odd / "id%d", odd / "known%u"
    shutil.copy(ssh_keys[0], key)
    key.chmod(0o600)
    shutil.copy(known, odd_known)
    cfg = HostConfig(kind="ssh", ssh=endpoint(target, key, odd_known), jump=endpoint(bastion, key, odd_known))
    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with open_host(cfg) as host:
            tunnel = open_tunnel(host, "127.0.0.2", server.server_address[1], expect_listening=True)
            try:
                assert httpx.get(tunnel.url + "/", timeout=10).status_code == 200
            finally:
                tunnel.close()
    finally:
        server.shutdown()


def test_option_like_or_shell_host_and_user_names_are_refused() -> None:
    for field, value in (("hostname", "-oProxyCommand=touch /tmp/x"), ("hostname", "gpu;id"),
                         ("hostname", "gpu-$(id).lab"), ("user", "-lroot"), ("user", "a b")):
        with pytest.raises(ValidationError, match=f"{field} .* must not start with '-' nor hold spaces"):
            SSHEndpoint(**{"hostname": "gpu.lab", field: value})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="key_path must not hold"):
        SSHEndpoint(hostname="gpu.lab", key_path=Path("${HOME}/key"))
    assert SSHEndpoint(hostname="fe80::1%eth0", user="ubuntu").hostname == "fe80::1%eth0"  # a zone, as ssh takes it


def test_jump_host_without_forwarding_is_a_clear_error(jump_pair: JumpPair,
                                                       ssh_keys: tuple[Path, str]) -> None:
    target, _, closed, known = jump_pair
    cfg = HostConfig(kind="ssh", ssh=endpoint(target, ssh_keys[0], known), jump=endpoint(closed, ssh_keys[0], known))
    with pytest.raises(HostError, match="could not open a tunnel"):
        open_host(cfg).run(["true"])


def test_reconnects_once_when_the_transport_drops(ssh_host_config: HostConfig, caplog: pytest.LogCaptureFixture) -> None:
    host = open_host(ssh_host_config)
    assert host.run(["true"]).ok
    host._client.get_transport().close()  # type: ignore[union-attr]  # the link drops between commands
    with caplog.at_level(logging.WARNING):
        assert host.run(["echo", "back"]).stdout == "back\n"
    assert host.connects == 2
    assert any("reconnecting once" in m for m in caplog.messages)
    host.close()


async def test_lifecycle_over_ssh(ssh_host_config: HostConfig, tmp_path: Path) -> None:
    profile = toy_profile(tmp_path, "--listen-after", "0.2", "--warmup", "0.3", "--spawn-grandchild",
                          "--api-key", "sk-over-ssh-123456", "--leave-tmp-files", private_tmp_env=["TMPDIR"])
    with open_host(ssh_host_config) as host:
        handle = start_server(host, profile)
        assert handle.host.endswith(f":{ssh_host_config.ssh.port}")  # type: ignore[union-attr]
        lines: list[str] = []
        report = await wait_ready(host, profile, handle, url=ssh_host_config.http_url(profile.port), on_log_line=lines.append)
        assert report.ready
        assert lines and all("sk-over-ssh-123456" not in line for line in lines)
        assert any("***" in line for line in lines)
        # What it left in its temporary folder is in the SSH login's ~/.specsweep/tmp, and goes with the kill.
        left = [Path(p) for p in host.tail(handle.log_path, 50).split("tmp files: ", 1)[1].split("\n")[0].split()]
        own = left[0].parent
        assert own.parent.parent == Path(host.run(["sh", "-c", "echo $HOME"]).stdout.strip()) / ".specsweep"
        assert own.name == f"{profile.port}-{handle.token[:12]}" and all(p.exists() for p in left)
        kill = kill_server(host, profile, handle)
    assert len(kill.killed) >= 3 and kill.port_free
    assert pids_alive([k.pid for k in kill.killed]) == []
    assert str(own) in kill.removed_tmp_dirs and not own.exists()  # (with any stale one of an earlier run)


async def test_server_survives_the_ssh_connection(ssh_host_config: HostConfig, tmp_path: Path) -> None:
    profile = toy_profile(tmp_path)
    with open_host(ssh_host_config) as host:
        handle = start_server(host, profile)
    time.sleep(0.5)  # the connection that started it is closed
    assert pids_alive([handle.pid]) == [handle.pid]
    with open_host(ssh_host_config) as host:
        await wait_ready(host, profile, handle)
        kill_server(host, profile, handle)
    assert TOY  # the toy server ran through the same path as locally


def test_an_accepted_host_key_is_pinned_for_the_rest_of_the_run(ssh_keys: tuple[Path, str], tmp_path: Path) -> None:
    """Trusted once, the key is the only one this run accepts: the same address offering another key on a
    reconnect (a reinstalled host, or someone in the middle) is refused as changed."""
    from tests.helpers.sshd import free_port

    port = free_port()
    first = start_sshd(tmp_path / "first", [ssh_keys[1]], port=port)
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = SSHHost(endpoint(first, ssh_keys[0], empty, accept_unknown_host_key=True))
    try:
        assert host.run(["true"]).ok
        assert host.accepted_host_keys() == [first.known_hosts_line()]
        first.stop()
        host.close()  # the connection goes; the next command connects again, as after a dropped link
        impostor = start_sshd(tmp_path / "impostor", [ssh_keys[1]], port=port)  # same address, another key
        try:
            with pytest.raises(HostKeyError, match="CHANGED"):
                host.run(["true"])
        finally:
            impostor.stop()
    finally:
        host.close()
        first.stop()


def test_jump_and_target_keys_are_pinned_apart(jump_pair: JumpPair, ssh_keys: tuple[Path, str], tmp_path: Path) -> None:
    target, bastion, _, _ = jump_pair
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    cfg = HostConfig(kind="ssh", ssh=endpoint(target, ssh_keys[0], empty, accept_unknown_host_key=True),
                     jump=endpoint(bastion, ssh_keys[0], empty, accept_unknown_host_key=True))
    with open_host(cfg) as host:
        assert host.run(["true"]).ok
        assert sorted(host.accepted_host_keys()) == sorted([target.known_hosts_line(), bastion.known_hosts_line()])


@pytest.mark.parametrize("given_as", ["text", "file"])
def test_a_key_with_a_passphrase_reaches_the_tunnel_through_its_own_agent(tmp_path: Path, given_as: str) -> None:
    """The OpenSSH tunnel takes a key with a passphrase through a private ssh-agent: the key is never
    written out in clear, the passphrase is on no command line, and the agent ends with the tunnel."""
    import http.server
    import threading

    from specsweep.hosts.tunnel import open_tunnel

    key = tmp_path / "locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "correct horse battery", "-C", "locked", "-f", str(key)],
                   check=True)
    sshd = start_sshd(tmp_path / "sshd", [key.with_suffix(".pub").read_text().strip()])
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(sshd.known_hosts_line() + "\n")
    source = {"private_key": key.read_text()} if given_as == "text" else {"key_path": key}
    ep = SSHLogin(hostname=sshd.address, port=sshd.port, user=sshd.user, known_hosts=known_hosts, use_agent=False,
                  passphrase="correct horse battery", **source)  # type: ignore[arg-type]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with SSHHost(ep) as host:
        tunnel = open_tunnel(host, "127.0.0.1", server.server_address[1], expect_listening=True)
        try:
            assert tunnel._agent is not None and tunnel._agent.poll() is None
            assert httpx.get(tunnel.url + "/", timeout=10).status_code == 200  # through ssh -L, authenticated
            cmdlines = [p.read_bytes() for p in Path("/proc").glob("[0-9]*/cmdline") if p.exists()]
            assert not any(b"correct horse battery" in c for c in cmdlines)
            private = [p for p in tunnel._dir.iterdir() if p.is_file() and b"PRIVATE KEY" in p.read_bytes()]
            assert private == []  # no key file in clear: the agent holds it
            agent = tunnel._agent
        finally:
            tunnel.close()
            server.shutdown()
            sshd.stop()
    assert agent.poll() is not None and not tunnel._dir.exists()


#: In front of a real sshd: the first DROP connections are closed as soon as they open (as an sshd past its
#: MaxStartups drops new ones), the rest are carried through to it. Prints its port, then serves.
DROPPING_FRONT = """
import socket, sys, threading
target, drop = (sys.argv[1], int(sys.argv[2])), int(sys.argv[3])
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
def pipe(a, b):
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
seen = 0
while True:
    conn, _ = listener.accept()
    seen += 1
    print("connection", seen, flush=True)
    if seen <= drop:
        conn.close()
        continue
    up = socket.create_connection(target)
    threading.Thread(target=pipe, args=(conn, up), daemon=True).start()
    threading.Thread(target=pipe, args=(up, conn), daemon=True).start()
"""


@pytest.mark.parametrize(("dropped", "connects"), [(2, True), (3, False)])
def test_a_handshake_the_server_drops_is_tried_again(sshd: SSHServer, ssh_keys: tuple[Path, str], tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture, dropped: int,
                                                     connects: bool) -> None:
    """A connection dropped before the SSH banner (a busy sshd, a loaded machine) is tried again, three tries in
    all; a third drop is said with the server's address and the number of tries."""
    from specsweep.hosts.ssh import HANDSHAKE_TRIES

    front = subprocess.Popen([sys.executable, "-c", DROPPING_FRONT, sshd.address, str(sshd.port), str(dropped)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert front.stdout is not None
        port = int(front.stdout.readline())
        known = tmp_path / "known_hosts"
        known.write_text(sshd.known_hosts_line().replace(f"]:{sshd.port} ", f"]:{port} ", 1) + "\n")
        ep = SSHEndpoint(hostname="127.0.0.1", port=port, user=sshd.user, key_path=ssh_keys[0], known_hosts=known,
                         use_agent=False, connect_timeout_s=5)
        caplog.set_level(logging.WARNING)
        t0 = time.monotonic()
        if connects:
            with SSHHost(ep) as host:
                assert host.run(["echo", "through"]).stdout == "through\n"
        else:
            with pytest.raises(HostError, match=rf"cannot connect to SSH server .*:{port}: .*\(tried {HANDSHAKE_TRIES} times\)"):
                SSHHost(ep).run(["true"])
        took = time.monotonic() - t0
    finally:
        front.kill()
    out = front.communicate()[0]
    assert out.count("connection") == (dropped + 1 if connects else HANDSHAKE_TRIES)
    assert len([r for r in caplog.records if "trying again in" in r.getMessage()]) == min(dropped, HANDSHAKE_TRIES - 1)
    assert took < 3 + 20  # the pauses (1 s, then 2 s); each drop is seen at once
