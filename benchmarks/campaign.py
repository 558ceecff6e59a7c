"""What a campaign buys: the comparisons of N hosts at once against the same comparisons one host after another.

    .venv/bin/python benchmarks/campaign.py [--hosts 3] [--levels 1,16] [--rounds 8]

N test hosts (tests/helpers/fleet.py: each a network namespace with its own sshd and its own processes), the
SGLang simulator (tiny-fast) on each, a temporary Prefect server. First the campaign over all of them (each host's
comparison a subflow of its own, all at once), then one campaign per host, one after another. Prints each wall time
and their ratio, and each host's answer. Every host here shares this machine's two cores: on a fleet each host's
comparison runs on its own machine, so there the ratio comes nearer the number of hosts. Needs root (namespaces).
Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prefect.settings import PREFECT_API_URL, temporary_settings  # noqa: E402

from flows.campaign import campaign  # noqa: E402
from specsweep.analysis.decision import DecisionConfig  # noqa: E402
from specsweep.bench.config import SweepConfig, WorkloadConfig  # noqa: E402
from specsweep.engines.sglang import SGLangSettings  # noqa: E402
from specsweep.parameters import BenchmarkSettings  # noqa: E402
from tests.helpers.fleet import fleet_hosts  # noqa: E402
from tests.helpers.prefect_server import prefect_server  # noqa: E402
from tests.helpers.sshd import keygen  # noqa: E402


async def timed(label: str, coro: object) -> float:
    t0 = time.monotonic()
    state = await coro  # type: ignore[misc]
    wall = time.monotonic() - t0
    result = await state.result()
    for h in result.hosts:
        print(f"  {label:<12} {h.host:<28} {h.error or h.decision}", flush=True)
    return wall


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--levels", default="1,16")
    ap.add_argument("--rounds", type=int, default=8, help="Rounds a level may take (both configurations).")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="specsweep-campaign-bench-"))
    # This worker's policy: the test hosts, the simulator on them, the results under the work folder.
    (work / "policy.toml").write_text("\n".join([
        'hosts = ["*"]', f"commands = {json.dumps([f'{sys.executable} -m specsweep.targets.sim'])}",
        'args = {sglang = ["*"]}', f"ssh_files = {json.dumps([str(work)])}", "accept_unknown_host_keys = true",
        'endpoints = ["http://127.0.0.1:*"]', f"results = {json.dumps([str(work)])}"]) + "\n")
    os.environ["SPECSWEEP_POLICY"] = str(work / "policy.toml")
    key = work / "id_ed25519"
    keys = (key, keygen(key))
    num_requests = 8
    settings = SGLangSettings(simulate=True, sim_profile="tiny-fast", port=30500, model_path="/models/kimi",
                              draft_model_path="/models/eagle3", python=sys.executable)
    benchmark = BenchmarkSettings(workload=WorkloadConfig(input_len=16, output_len=32), results=str(work / "results"),
                                  sweep=SweepConfig(concurrency=[int(c) for c in args.levels.split(",")],
                                                    num_requests=num_requests, warmup_requests=2))
    decision = DecisionConfig(design="alternate", alternate_by="side-by-side",
                              max_requests_per_level=num_requests * args.rounds)
    plan = [(f"h{i}", "NVIDIA H100 80GB HBM3", 8, "q", "") for i in range(args.hosts)]
    with fleet_hosts(work / "fleet", keys, plan) as hosts, prefect_server(work / "prefect") as env, \
            temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
        configs = [h.config for h in hosts]
        print(f"{args.hosts} hosts, levels {args.levels}, up to {args.rounds} rounds a level, blocks of "
              f"{num_requests}+ requests", flush=True)
        at_once = await timed("campaign", campaign(hosts=configs, settings=settings, benchmark=benchmark,
                                                   decision=decision, return_state=True))
        one_by_one = 0.0
        for c in configs:
            one_by_one += await timed("one by one", campaign(hosts=[c], settings=settings, benchmark=benchmark,
                                                              decision=decision, return_state=True))
    print(f"campaign (all at once): {at_once:6.1f} s")
    print(f"one host after another: {one_by_one:6.1f} s")
    print(f"ratio: {one_by_one / at_once:.2f}x faster at once")


if __name__ == "__main__":
    asyncio.run(main())
