"""Everything specsweep reads from ``nvidia-smi`` on a server's host: the one module that runs it.

    describe_gpus(host)       GPU model, count and driver, for the run's fingerprint
    memory_used(host, ...)    memory the server's GPUs hold, for the check after a kill
    GpuWatch(host, visible)   async with it around a level: ``nvidia-smi`` every ``interval_s``, each
                              call bounded by ``timeout_s``, only the GPUs the server was given
    parse_gpu_samples(text)   ``nvidia-smi --query-gpu=... --format=csv`` (header read, units or not)
    level_gpu_figures(...)    a level's figures, as stored in its row

Over SSH each reading is one short command on the connection the run already holds; the watch
gives up after three failed readings in a row (a host whose nvidia-smi hangs or fails costs a
level at most three timeouts, never its figures). The GPUs are the server's own
(``CUDA_VISIBLE_DEVICES`` as its start reported it, read as CUDA reads it): on a shared host
another user's job on another GPU does not count.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from specsweep.errors import HostError
from specsweep.hosts.base import Host
from specsweep.server.periodic import Periodic

FIELDS = ("index", "uuid", "utilization.gpu", "memory.used", "memory.total", "power.draw")
QUERY = ["nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,nounits"]


def visible_gpus(rows: list[tuple[str, str, int]], visible: str | None) -> list[tuple[str, str, int]]:
    """The GPUs (index, uuid, MiB used) that ``CUDA_VISIBLE_DEVICES`` selects, as CUDA reads it:
    indices or (prefixes of) UUIDs, in order, up to the first entry that names no device; unset
    means every GPU, empty means none."""
    if visible is None:
        return rows
    chosen: list[tuple[str, str, int]] = []
    for entry in (e.strip() for e in visible.split(",")):
        match = [r for r in rows if (entry.isdigit() and r[0] == entry) or (
            not entry.isdigit() and entry and r[1].startswith(entry))]
        if len(match) != 1:
            break
        if match[0] not in chosen:
            chosen.append(match[0])
    return chosen


def parse_gpu_memory(text: str) -> list[tuple[str, str, int]]:
    """``nvidia-smi --query-gpu=index,uuid,memory.used --format=csv,noheader,nounits`` output."""
    rows = []
    for line in text.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit() and parts[2].isdigit():
            rows.append((parts[0], parts[1], int(parts[2])))
    return rows


def memory_used(host: Host, visible: str | None) -> list[int] | None:
    """MiB used on each GPU the server could use; None without nvidia-smi."""
    if host.which("nvidia-smi") is None:
        return None
    argv = ["nvidia-smi", "--query-gpu=index,uuid,memory.used", "--format=csv,noheader,nounits"]
    result = host.run(argv, timeout=60)
    if not result.ok:
        return None
    return [used for _, _, used in visible_gpus(parse_gpu_memory(result.stdout), visible)]


def parse_compute_apps(text: str) -> dict[int, int]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`` output: MiB by pid."""
    held: dict[int, int] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            held[int(parts[0])] = held.get(int(parts[0]), 0) + int(parts[1])
    return held


def memory_held_by(host: Host, pids: set[int]) -> dict[int, int] | None:
    """MiB of GPU memory each of ``pids`` still holds (only those that hold some); None without nvidia-smi.
    Other processes on the same GPUs (another user's job) are not counted."""
    if host.which("nvidia-smi") is None:
        return None
    result = host.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                      timeout=60)
    if not result.ok:
        return None
    return {pid: mib for pid, mib in parse_compute_apps(result.stdout).items() if pid in pids and mib > 0}


def describe_gpus(host: Host) -> dict[str, Any]:
    """GPU model, count and driver (or the CPU, on a host without nvidia-smi), for the run's fingerprint."""
    if host.which("nvidia-smi") is None:
        fp: dict[str, Any] = {"gpu": "none (CPU)", "gpu_count": 0}
        cpu = host.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], timeout=30).stdout.strip()
        if cpu:
            fp["cpu"] = cpu
        return fp
    result = host.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], timeout=60)
    rows = [line.split(",") for line in result.stdout.splitlines() if "," in line]
    if not rows:
        return {}
    return {"gpu": rows[0][0].strip(), "gpu_count": len(rows), "driver": rows[0][1].strip()}


@dataclass(frozen=True)
class GpuSample:
    index: str
    uuid: str
    utilization_pct: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    power_w: float | None


def _number(cell: str) -> float | None:
    """A cell with or without its unit ("87 %", "71324 MiB", "412.35 W", "87"); None for [N/A] and the like."""
    head = cell.strip().split(" ")[0] if cell.strip() else ""
    try:
        return float(head)
    except ValueError:
        return None


def parse_gpu_samples(text: str) -> list[GpuSample]:
    """``nvidia-smi --query-gpu=... --format=csv[,nounits]`` output, its columns found by the header
    (``memory.used [MiB]``), so extra columns and another order read the same. Lines that are not
    rows of the table (a warning, a cut-off line) are skipped."""
    columns: dict[str, int] | None = None
    out: list[GpuSample] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if columns is None:
            names = [c.split(" [")[0].strip() for c in cells]
            if "index" in names and "memory.used" in names:
                columns = {n: i for i, n in enumerate(names)}
            continue
        if len(cells) != len(columns) or not cells[columns["index"]].isdigit():
            continue
        row = {name: cells[i] for name, i in columns.items()}
        out.append(GpuSample(index=row["index"], uuid=row.get("uuid", ""),
                             utilization_pct=_number(row.get("utilization.gpu", "")),
                             memory_used_mib=_number(row["memory.used"]),
                             memory_total_mib=_number(row.get("memory.total", "")),
                             power_w=_number(row.get("power.draw", ""))))
    return out


def server_gpus(samples: list[GpuSample], visible: str | None) -> list[GpuSample]:
    """The samples of the GPUs a server with this ``CUDA_VISIBLE_DEVICES`` uses (None: every GPU), chosen
    as the kill's GPU-memory check chooses them."""
    rows = [(s.index, s.uuid, 0) for s in samples]
    chosen = {index for index, _, _ in visible_gpus(rows, visible)}
    return [s for s in samples if s.index in chosen]


@dataclass
class GpuWatch(Periodic):
    """Reads ``nvidia-smi`` on ``host`` every ``interval_s`` while a level runs (``async with``)."""

    host: Host
    visible: str | None = None
    interval_s: float = 1.0
    timeout_s: float = 10.0
    readings: list[tuple[float, list[GpuSample]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def _read(self) -> list[GpuSample]:
        result = self.host.run(QUERY, timeout=self.timeout_s)
        if not result.ok:
            raise HostError(f"nvidia-smi exited {result.exit_code}: {result.stderr.strip()[:200]}")
        return server_gpus(parse_gpu_samples(result.stdout), self.visible)

    async def _loop(self) -> None:
        misses = 0
        while misses < 3:
            t0 = time.monotonic()
            try:
                samples = await asyncio.wait_for(asyncio.to_thread(self._read), self.timeout_s + 5)
            except (HostError, OSError, TimeoutError) as exc:
                misses += 1
                self.errors.append(f"{type(exc).__name__}: {exc}")
            else:
                misses = 0
                if samples:
                    self.readings.append((time.time(), samples))
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def fresh(self) -> GpuWatch:
        """A watch for the next level: the same host and GPUs, no readings."""
        return GpuWatch(self.host, self.visible, self.interval_s, self.timeout_s)

    def within(self, start: float, end: float) -> list[list[GpuSample]]:
        return [s for t, s in self.readings if start <= t <= end]


def level_gpu_figures(readings: list[list[GpuSample]]) -> dict[str, Any]:
    """A level's GPU figures from the readings taken while it ran (each reading: the server's GPUs):
    utilisation as the mean over GPUs and readings and the highest single GPU's; memory as the most the
    server's GPUs held together; power as the mean of their sum. None where no reading fell inside it."""
    def values(get: Any) -> list[list[float]]:
        return [[v for s in reading if (v := get(s)) is not None] for reading in readings]

    util = [v for reading in values(lambda s: s.utilization_pct) for v in reading]
    memory = [sum(r) for r in values(lambda s: s.memory_used_mib) if r]
    power = [sum(r) for r in values(lambda s: s.power_w) if r]
    return {
        "gpu_samples": len(readings) or None,
        "gpu_count": max((len(r) for r in readings), default=None) or None,
        "gpu_utilization_mean_pct": round(statistics.fmean(util), 2) if util else None,
        "gpu_utilization_max_pct": max(util) if util else None,
        "gpu_memory_used_max_mib": max(memory) if memory else None,
        "gpu_power_mean_w": round(statistics.fmean(power), 2) if power else None,
    }
