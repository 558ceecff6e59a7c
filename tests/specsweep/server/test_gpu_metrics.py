"""GPU utilisation, memory and power while a level runs: the parser on recorded real nvidia-smi output,
the server's own GPUs only, the figures by hand, and the watch against a real process on PATH (this
machine has no GPU: the nvidia-smi there replays recorded rows, or hangs on purpose)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from specsweep.hosts import LocalHost
from specsweep.server.gpus import GpuSample, GpuWatch, level_gpu_figures, parse_gpu_samples, server_gpus

#: Timing bounds and busy servers: these run when no other test does (scripts/test.sh).
pytestmark = pytest.mark.solo

# Verbatim rows recorded by `nvidia-smi --query-gpu=... --format=csv` on an H100 host during a serving
# benchmark (published as test data of a public benchmarking repository): other columns, and units.
RECORDED_H100 = """timestamp, index, uuid, name, utilization.gpu [%], utilization.memory [%], memory.used [MiB], memory.total [MiB], temperature.gpu, power.draw [W]
2026/09/12 06:17:26.305, 2, GPU-107f0d10-2c02-7c73-7b9f-680acd29b484, NVIDIA H100 80GB HBM3, 100 %, 1 %, 29089 MiB, 81559 MiB, 35, 154.88 W
2026/09/12 06:17:26.305, 3, GPU-8c958eaa-b244-64cb-6283-d37792aac963, NVIDIA H100 80GB HBM3, 100 %, 3 %, 29089 MiB, 81559 MiB, 29, 158.86 W
2026/09/12 06:17:28.306, 3, GPU-8c958eaa-b244-64cb-6283-d37792aac963, NVIDIA H100 80GB HBM3, 100 %, 0 %, 36227 MiB, 81559 MiB, 29, 162.00 W
2026/09/12 06:17:29.306, 2, GPU-107f0d10-2c02-7c73-7b9f-680acd29b484, NVIDIA H100 80GB HBM3, 100 %, 0 %, 36227 MiB, 81559 MiB, 36, 150.74 W
"""  # noqa: E501

# specsweep's own query (--format=csv,nounits): the header keeps its units, the cells lose theirs; a GPU
# without power readings says [N/A], as consumer and some virtualised GPUs do.
OWN_QUERY = """index, uuid, utilization.gpu [%], memory.used [MiB], memory.total [MiB], power.draw [W]
0, GPU-107f0d10-2c02-7c73-7b9f-680acd29b484, 87, 71324, 81559, 412.35
1, GPU-8c958eaa-b244-64cb-6283-d37792aac963, 91, 70110, 81559, [N/A]
2, GPU-5f0c7d2e-91a4-3b6f-8e2d-4c1a9b7e6d50, 3, 1024, 81559, 71.20
"""


def test_recorded_h100_rows_are_read_by_their_header() -> None:
    rows = parse_gpu_samples(RECORDED_H100)
    assert [(r.index, r.utilization_pct, r.memory_used_mib, r.memory_total_mib, r.power_w) for r in rows] == [
        ("2", 100.0, 29089.0, 81559.0, 154.88), ("3", 100.0, 29089.0, 81559.0, 158.86),
        ("3", 100.0, 36227.0, 81559.0, 162.0), ("2", 100.0, 36227.0, 81559.0, 150.74)]
    assert rows[0].uuid == "GPU-107f0d10-2c02-7c73-7b9f-680acd29b484"


def test_own_query_without_units_and_a_missing_power_reading() -> None:
    rows = parse_gpu_samples("WARNING: infoROM is corrupted at gpu 0000:3B:00.0\n" + OWN_QUERY + "2, GPU-5f0c, 9")
    assert [(r.index, r.utilization_pct, r.power_w) for r in rows] == [("0", 87.0, 412.35), ("1", 91.0, None),
                                                                       ("2", 3.0, 71.2)]
    assert parse_gpu_samples("") == [] and parse_gpu_samples("No devices were found\n") == []


@pytest.mark.parametrize(("visible", "indices"), [
    (None, ["0", "1", "2"]), ("0,1", ["0", "1"]), ("GPU-8c95", ["1"]), ("", [])])
def test_only_the_servers_gpus_count(visible: str | None, indices: list[str]) -> None:
    assert [s.index for s in server_gpus(parse_gpu_samples(OWN_QUERY), visible)] == indices


def test_level_figures_by_hand() -> None:
    def g(i: str, util: float, mem: float, power: float | None) -> GpuSample:
        return GpuSample(i, f"GPU-{i}", util, mem, 81559.0, power)

    readings = [[g("0", 80, 70000, 400.0), g("1", 60, 69000, 380.0)],
                [g("0", 100, 71000, 420.0), g("1", 90, 70500, None)]]
    figures = level_gpu_figures(readings)
    assert figures == {"gpu_samples": 2, "gpu_count": 2, "gpu_utilization_mean_pct": 82.5,
                       "gpu_utilization_max_pct": 100.0, "gpu_memory_used_max_mib": 141500.0,
                       "gpu_power_mean_w": 600.0}  # (780 + 420) / 2: a GPU without a reading adds nothing
    assert level_gpu_figures([]) == {"gpu_samples": None, "gpu_count": None, "gpu_utilization_mean_pct": None,
                                     "gpu_utilization_max_pct": None, "gpu_memory_used_max_mib": None,
                                     "gpu_power_mean_w": None}


def _tool(tmp_path: Path, body: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(0o755)
    os.environ["PATH"] = f"{bin_dir}:{os.environ['PATH']}"


async def test_the_watch_reads_the_servers_gpus_while_a_level_runs(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.environ["PATH"])
    rows = tmp_path / "rows.csv"
    rows.write_text(OWN_QUERY)
    _tool(tmp_path, f'[ "$1" = "--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total,power.draw" ] '
                    f'|| exit 9\ncat {rows}\n')
    host = LocalHost()
    assert host.which("nvidia-smi")
    t0 = time.time()
    async with GpuWatch(host, "0,1", interval_s=0.1) as watch:
        await asyncio.sleep(0.55)
    readings = watch.within(t0, time.time())
    assert 3 <= len(readings) <= 7 and not watch.errors
    assert all([s.index for s in r] == ["0", "1"] for r in readings)  # GPU 2 is not the server's
    figures = level_gpu_figures(readings)
    assert figures["gpu_utilization_mean_pct"] == 89.0 and figures["gpu_power_mean_w"] == 412.35
    assert watch.fresh().readings == [] and watch.fresh().visible == "0,1"


async def test_a_hung_nvidia_smi_costs_three_bounded_tries_then_nothing(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.environ["PATH"])
    _tool(tmp_path, "exec sleep 30\n")
    t0 = time.monotonic()
    async with GpuWatch(LocalHost(), None, interval_s=0.1, timeout_s=0.3) as watch:
        await asyncio.sleep(2.5)
    assert len(watch.errors) == 3 and watch.readings == []  # it gave up after three timeouts
    assert time.monotonic() - t0 < 4


@pytest.mark.ssh
async def test_the_watch_reads_over_ssh_and_a_hung_nvidia_smi_there_is_bounded(
        tmp_path: Path, ssh_keys: tuple[Path, str]) -> None:
    """A real OpenSSH server whose logins find nvidia-smi on PATH (here a stand-in replaying recorded rows,
    then one that hangs): the readings come over the run's own connection, each bounded by its timeout."""
    from specsweep.hosts import HostConfig, SSHEndpoint, open_host
    from tests.helpers.sshd import start_sshd

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    rows, tool = tmp_path / "rows.csv", bin_dir / "nvidia-smi"
    rows.write_text(OWN_QUERY)
    tool.write_text(f"#!/bin/sh\n[ -e {tmp_path}/hang ] && exec sleep 30\ncat {rows}\n")
    tool.chmod(0o755)
    server = start_sshd(tmp_path / "sshd", [ssh_keys[1]], set_env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    try:
        known = tmp_path / "known_hosts"
        known.write_text(server.known_hosts_line() + "\n")
        config = HostConfig(kind="ssh", ssh=SSHEndpoint(hostname=server.address, port=server.port, user=server.user,
                                                        key_path=ssh_keys[0], known_hosts=known, use_agent=False))
        with open_host(config) as host:
            assert host.which("nvidia-smi") == str(tool)
            t0 = time.time()
            async with GpuWatch(host, "GPU-5f0c", interval_s=0.2) as watch:
                await asyncio.sleep(1.0)
            readings = watch.within(t0, time.time())
            assert len(readings) >= 2 and not watch.errors
            assert all([s.index for s in r] == ["2"] for r in readings)  # only the server's GPU, by UUID prefix
            assert level_gpu_figures(readings)["gpu_power_mean_w"] == 71.2

            (tmp_path / "hang").touch()
            t1 = time.monotonic()
            async with GpuWatch(host, None, interval_s=0.1, timeout_s=0.5) as hung:
                await asyncio.sleep(3.0)
            assert len(hung.errors) == 3 and hung.readings == [] and "did not finish within 0.5 s" in hung.errors[0]
            assert time.monotonic() - t1 < 5
            assert host.run(["echo", "still usable"]).stdout == "still usable\n"
    finally:
        server.stop()
