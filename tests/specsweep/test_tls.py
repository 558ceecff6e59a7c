"""Direct traffic to a server behind TLS (http_scheme https): the real simulator serving TLS with a
certificate made here, benchmarked by the real CLI; never a fallback to plain http."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError

from specsweep.hosts import HostConfig, SSHEndpoint
from tests.conftest import REPO
from tests.helpers.sim import running_sim


def self_signed(folder: Path, name: str = "localhost") -> tuple[Path, Path]:
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "2", "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}",
                    "-addext", f"subjectAltName=DNS:{name}"], check=True, capture_output=True)
    return key, cert


def wait_listening(port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


def bench(config: Path, port: int, results: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specsweep.cli", "bench", "--host-config", str(config), "--port",
                           str(port), "--concurrency", "2", "--num-prompts", "4", "--input-len", "16", "--output-len",
                           "8", "--warmup", "0", "--results", str(results)],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=env)


def test_https_direct_traffic_is_benchmarked_and_an_unknown_certificate_refused(tmp_path: Path) -> None:
    key, cert = self_signed(tmp_path)
    config = tmp_path / "host.json"
    config.write_text(json.dumps({"kind": "local", "traffic": "direct", "http_address": "localhost",
                                  "http_scheme": "https"}))
    with running_sim("--ssl-keyfile", str(key), "--ssl-certfile", str(cert), ready=False) as (url, _):
        wait_listening(int(url.rsplit(":", 1)[1]))
        port = int(url.rsplit(":", 1)[1])
        env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
        # The certificate is not one this machine trusts: refused, and no request went out in plain http.
        refused = bench(config, port, tmp_path / "refused", env)
        assert refused.returncode == 1, refused.stderr[-2000:]
        assert "no request completed at any level" in refused.stderr and "SSLCertVerificationError" in refused.stderr
        # Trusted through SSL_CERT_FILE: the level is measured over TLS and stored.
        ok = bench(config, port, tmp_path / "r", {**env, "SSL_CERT_FILE": str(cert)})
        assert ok.returncode == 0, ok.stderr[-2000:]
    runs = pd.read_parquet(next((tmp_path / "r").rglob("run.parquet")))
    assert runs["base_url"].iloc[0] == f"https://localhost:{port}"
    levels = pd.concat(pd.read_parquet(f) for f in (tmp_path / "r").glob("levels/*/*.parquet"))
    counted = levels[levels["disturbed"].isna()]  # a block a loaded machine disturbed is kept beside it
    assert counted["completed"].sum() == 4 and levels["failed"].sum() == 0


def test_the_scheme_and_an_ipv6_address_in_the_url() -> None:
    assert HostConfig(http_address="::1").http_url(8000) == "http://[::1]:8000"
    assert HostConfig(http_address="gpu.lab", http_scheme="https").http_url(443) == "https://gpu.lab:443"
    # TLS is for traffic that goes straight from this machine: through the tunnel the client talks to loopback.
    with pytest.raises(ValidationError, match="http_scheme"):
        HostConfig(kind="ssh", ssh=SSHEndpoint(hostname="gpu.lab"), traffic="tunnel", http_scheme="https")
