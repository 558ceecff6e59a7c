"""Where the test suite's time and CPU go: the README's test command, with each test file's CPU counted.

    python3 benchmarks/suite_cpu.py [pytest arguments, e.g. -k NAME]

Runs ``bash scripts/test.sh`` with a pytest plugin (benchmarks/suite_cpu_plugin.py) that puts each worker, as it
starts a test file, into a cgroup of that file (cgroup v1 ``cpuacct``; root). Every process the file's tests start
afterwards (servers, Prefect servers, SSH, flow runs) is counted there, even after its parent is gone. A server
started for the whole session is counted in the file that started it. Prints, per file, its CPU seconds and its
tests' wall seconds; the ten slowest tests; how busy the two cores were while the suite ran (from /proc/stat), and
the whole command's time. Phase 1 of the suite is CPU-bound when the busy share is near 100 %: then only less CPU
work makes it shorter. Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def main() -> int:
    if not (CPUACCT / "cgroup.procs").exists() or os.geteuid() != 0:
        print("needs root and cgroup v1 cpuacct at /sys/fs/cgroup/cpuacct", file=sys.stderr)
        return 2
    group = CPUACCT / f"specsweep-suite-{os.getpid()}"
    group.mkdir()
    timings = Path(tempfile.mkdtemp(prefix="specsweep-suite-"))
    env = {**os.environ, "SPECSWEEP_SUITE_CGROUP": str(group), "SPECSWEEP_SUITE_TIMINGS": str(timings),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")]))}
    b0, t0_ticks = busy_ticks()
    t0 = time.monotonic()
    done = subprocess.run(["bash", "scripts/test.sh", "-p", "suite_cpu_plugin", *sys.argv[1:]], cwd=ROOT, env=env)
    wall = time.monotonic() - t0
    b1, t1_ticks = busy_ticks()

    cpu = {}
    for sub in sorted(p for p in group.iterdir() if p.is_dir()):
        cpu[sub.name] = int((sub / "cpuacct.usage").read_text()) / 1e9
    tests = [json.loads(line) for f in timings.glob("*.jsonl") for line in f.read_text().splitlines()]
    wall_by_file: dict[str, float] = {}
    for t in tests:
        wall_by_file[t["file"]] = wall_by_file.get(t["file"], 0.0) + t["wall_s"]
    print(f"{'CPU s':>8} {'tests s':>8}  file")
    for name, seconds in sorted(cpu.items(), key=lambda kv: -kv[1]):
        file = name.replace("__", "/")
        print(f"{seconds:8.1f} {wall_by_file.get(file, 0.0):8.1f}  {file}")
    print(f"{sum(cpu.values()):8.1f} {sum(wall_by_file.values()):8.1f}  all files")
    print("\nten slowest tests (wall s):")
    for t in sorted(tests, key=lambda t: -t["wall_s"])[:10]:
        print(f"{t['wall_s']:8.1f}  {t['id']}")
    share = (b1 - b0) / max(1, t1_ticks - t0_ticks)
    print(f"\nthe command: {wall / 60:.1f} min, exit {done.returncode}; the CPUs were busy {share:.0%} of the time")

    for sub in (p for p in group.iterdir() if p.is_dir()):
        try:
            sub.rmdir()
        except OSError:  # a process is still in it (a leftover): leave the group
            pass
    try:
        group.rmdir()
    except OSError:
        pass
    shutil.rmtree(timings, ignore_errors=True)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
