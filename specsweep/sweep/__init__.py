"""The sweep: levels measured in blocks, each block stored as it ends.

    job          where requests go (BenchTarget), the run and its store (SweepJob), the levels in order
    prompts      a level's prompts, built once per workload, marked per block, and the warm-up prompts
    measure      one block: prompts → load → records → figures → store
    warmup       a fresh server warmed up until its TTFT settles
    levels       the loop: blocks until enough count, each judged as it ends; the stop at saturation
    disturbance  when the machine, not the server, shaped a block

The CLI hands ``run_levels`` the plain ``measure_level``; the flows hand it their Prefect task and their crash
check. ``specsweep.designs`` drives it for comparisons and grids.
"""

from specsweep.sweep.job import BenchTarget, Level, SweepJob, new_run_row, sweep_levels
from specsweep.sweep.levels import MAX_SET_ASIDE, PAIRED_WITH_DISTURBED, More, merge_repeats, repeats, run_levels, saturated
from specsweep.sweep.measure import measure_level, set_aside, stored_level
from specsweep.sweep.prompts import request_for, server_tokenizer, warmup_workload
from specsweep.sweep.warmup import WarmUp, settle

__all__ = ["MAX_SET_ASIDE", "PAIRED_WITH_DISTURBED", "BenchTarget", "More", "Level", "SweepJob", "WarmUp", "measure_level",
           "merge_repeats", "new_run_row", "repeats", "request_for", "run_levels", "saturated", "server_tokenizer",
           "set_aside", "settle", "stored_level", "warmup_workload"]
