"""The GPU-memory check after a kill looks at the GPUs that server used, not every GPU of the host.

This machine has no GPU: nvidia-smi here is a stand-in that prints output recorded from a real
8-GPU host (``nvidia-smi --query-gpu=index,uuid,memory.used --format=csv,noheader,nounits``),
with the memory figures read from a file the test sets.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specsweep.errors import KillError
from specsweep.hosts import LocalHost
from specsweep.server.gpus import parse_gpu_memory, visible_gpus
from specsweep.server.lifecycle import kill_server, start_server
from tests.conftest import MakeToy, wait_ready

# Recorded on an 8x RTX PRO 6000 host while another user's job held GPU 0 (MiB used).
RECORDED = """0, GPU-5f0c7d2e-91a4-3b6f-8e2d-4c1a9b7e6d50, 71324
1, GPU-a3e19c44-0b7d-5f21-9c6e-12d8f4b0a7c3, 0
2, GPU-0d6b2f18-7c3e-4a95-b1f0-8e4c2d9a6b71, 0
3, GPU-7b94e0a1-2f6c-4d38-a5e7-9c1b3f8d0e26, 0
4, GPU-c2f85a3d-6e10-4b7c-8d29-5a0e7f1c4b93, 0
5, GPU-19e4c7b0-a5d3-4f62-b8e1-0c7a9d2f5e48, 0
6, GPU-e8a0d3f6-4c27-49b1-9f5e-3d6b1a0c8f72, 0
7, GPU-4d7f1b9c-8e05-4a36-b2c8-7f0e5d3a1c69, 0
"""


# nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits on that host: the other user's job.
APPS = "48213, 71320\n"


def test_parser_reads_recorded_output() -> None:
    rows = parse_gpu_memory(RECORDED + "\n[N/A] garbage line\n")
    assert len(rows) == 8 and rows[0] == ("0", "GPU-5f0c7d2e-91a4-3b6f-8e2d-4c1a9b7e6d50", 71324)


@pytest.mark.parametrize(("visible", "indices"), [
    (None, ["0", "1", "2", "3", "4", "5", "6", "7"]),  # unset: every GPU
    ("", []),  # set empty: none
    ("1,3", ["1", "3"]),
    ("GPU-a3e19c44-0b7d-5f21-9c6e-12d8f4b0a7c3", ["1"]),  # a UUID
    ("GPU-a3e1,GPU-7b94", ["1", "3"]),  # unique prefixes, as CUDA takes them
    ("2,9,3", ["2"]),  # CUDA stops at the first entry that names no device
    ("GPU-,4", []),  # an ambiguous prefix names none
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(visible: str | None, indices: list[str]) -> None:
    assert [r[0] for r in visible_gpus(parse_gpu_memory(RECORDED), visible)] == indices


@pytest.fixture
def nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """nvidia-smi on PATH, answering the query with the memory figures in the returned file."""
    figures = tmp_path / "nvidia-smi.csv"
    figures.write_text(RECORDED)
    (tmp_path / "compute-apps.csv").write_text(APPS)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\ncase "$1" in --query-compute-apps*) cat {tmp_path}/compute-apps.csv;; *) cat {figures};; '
                    "esac\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return figures


async def test_another_users_busy_gpu_does_not_fail_the_kill(nvidia_smi: Path, make_toy: MakeToy,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # The login environment gives the server GPU 1 by UUID (the profile says nothing): the check reads
    # the server's own environment.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a3e19c44-0b7d-5f21-9c6e-12d8f4b0a7c3")
    host = LocalHost()
    profile = make_toy(gpu_memory_timeout_s=1.0)
    handle = start_server(host, profile)
    assert handle.cuda_visible_devices == "GPU-a3e19c44-0b7d-5f21-9c6e-12d8f4b0a7c3"
    await wait_ready(host, profile, handle)
    report = kill_server(host, profile, handle)
    assert report.gpu_memory_used_mib == [0]  # GPU 1 only; GPU 0's 71 GB are someone else's


async def test_another_users_job_on_the_servers_own_gpu_does_not_fail_the_kill(nvidia_smi: Path,
                                                                                make_toy: MakeToy) -> None:
    host = LocalHost()
    profile = make_toy(gpu_memory_timeout_s=1.0, env={"CUDA_VISIBLE_DEVICES": "0"})
    handle = start_server(host, profile)
    await wait_ready(host, profile, handle)
    report = kill_server(host, profile, handle)  # GPU 0 is full, but of pid 48213's memory, not the server's
    assert report.killed and report.gpu_memory_used_mib == [71324]


async def test_memory_the_killed_server_still_holds_fails_the_kill(nvidia_smi: Path, make_toy: MakeToy) -> None:
    host = LocalHost()
    profile = make_toy(gpu_memory_timeout_s=1.0, env={"CUDA_VISIBLE_DEVICES": "0"})
    handle = start_server(host, profile)
    await wait_ready(host, profile, handle)
    # As a CUDA context outliving its process for a while: nvidia-smi still lists the server's pid.
    (nvidia_smi.parent / "compute-apps.csv").write_text(APPS + f"{handle.pid}, 2200\n")
    with pytest.raises(KillError) as err:
        kill_server(host, profile, handle)
    assert f"processes [{handle.pid}]" in str(err.value) and "still hold 2200 MiB" in str(err.value)


def test_no_kill_no_gpu_check(nvidia_smi: Path, make_toy: MakeToy) -> None:
    """Nothing of specsweep's ran: other people's GPU memory is not this run's business."""
    report = kill_server(LocalHost(), make_toy(gpu_memory_timeout_s=1.0))
    assert report.killed == [] and report.gpu_memory_used_mib is None
