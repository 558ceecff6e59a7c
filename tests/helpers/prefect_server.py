"""A real Prefect server process (SQLite or PostgreSQL), started by the tests."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.helpers.processes import stop_process
from tests.helpers.sshd import free_port

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))


@contextmanager
def postgres(workdir: Path) -> Iterator[str]:
    """A throwaway PostgreSQL cluster on loopback; yields the SQLAlchemy URL of an empty database."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bins:
        raise RuntimeError("PostgreSQL is not installed: scripts/bootstrap.sh installs Debian's postgresql")
    bin_dir = Path(bins[-1])
    # The postgres user cannot enter pytest's private temporary folders: use a folder of its own.
    import tempfile

    workdir = Path(tempfile.mkdtemp(prefix="specsweep-pg-"))
    data = workdir / "pgdata"
    data.mkdir(parents=True)
    shutil.chown(workdir, "postgres")
    shutil.chown(data, "postgres")
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    init = subprocess.run([*as_pg, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
                          capture_output=True, text=True)
    if init.returncode:
        raise RuntimeError(f"initdb failed: {init.stderr or init.stdout}")
    port = free_port()
    subprocess.run([*as_pg, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(workdir / "pg.log"), "-w", "start",
                    "-o", f"-p {port} -k {workdir} -c listen_addresses=127.0.0.1"], check=True, capture_output=True)
    try:
        subprocess.run([*as_pg, str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                        "prefect"], check=True, capture_output=True)
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/prefect"
    finally:
        subprocess.run([*as_pg, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"], capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def prefect_server(home: Path, database_url: str | None = None) -> Iterator[dict[str, str]]:
    """``prefect server start`` on a free port; yields the environment that points clients at it."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PYTHONPATH": str(REPO),
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "5"}
    env.pop("PREFECT_API_DATABASE_CONNECTION_URL", None)
    if database_url:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    log = open(home / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError((home / "server.log").read_text()[-3000:])
            time.sleep(0.5)
        else:
            raise RuntimeError("the Prefect server did not start: " + (home / "server.log").read_text()[-3000:])
        yield env
    finally:
        stop_process(proc, 20)
        log.close()


def prefect_cli(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PREFECT, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
