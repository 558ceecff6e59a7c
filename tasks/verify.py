"""The verify stage: the engine started with the setting the comparison recommends, measured at the
compared levels in turn with always off and always on (``specsweep.analysis.verify`` judges it).

The recommended setting is the speculative profile with the engine's own per-batch flags
(``specsweep.engines.base.with_setting``); a file the engine loads (SGLang's adaptive file) is written
first to a private file on the host. Each arm is a run of its own in the store (``verifies`` names the
comparison, ``verify_arm`` the arm), so the comparison's runs stay as they were, and a retried flow
run keeps what the stage finished.
"""

from __future__ import annotations

import asyncio
import json

from prefect import get_run_logger

from specsweep import designs
from specsweep.analysis import verify
from specsweep.analysis.compare import Comparison
from specsweep.analysis.decision import DecisionConfig
from specsweep.engines.base import split_command, with_setting
from specsweep.hosts import Host
from specsweep.profiles import ServerProfile
from tasks.arms import ServerArm
from tasks.blocks import check_allowed
from tasks.run import Configuration, Run


def verifiable(comparison: Comparison) -> str | None:
    """Why the recommendation cannot be run by the engine, or None when it can."""
    if comparison.recommendation.status != "decided":
        return "the answer is undetermined: there is no recommendation to run"
    setting = comparison.setting
    if setting is None:
        return "the speculative configuration's launch command does not say how it speculates"
    if not setting.flags:
        return " ".join(setting.notes) or f"{setting.engine} has no per-batch speculation switch"
    return None


def schedule_profile(spec: ServerProfile, comparison: Comparison, host: Host, run_id: str) -> ServerProfile:
    """The speculative profile started with the recommendation (its file written on the host first)."""
    setting = comparison.setting
    assert setting is not None and setting.flags
    path = None
    if setting.file_name and setting.file_name in split_command(setting.flags):
        path = host.write_private_file(f"{run_id}-{setting.file_name}", json.dumps(setting.content).encode())
    return with_setting(spec, setting, path)


async def verify_recommendation(run: Run, host: Host, base: Configuration, spec: Configuration, comparison: Comparison,
                                decision: DecisionConfig) -> bool:
    """Measure the recommendation against both fixed policies. False (and a warning saying why) when the
    recommendation is not one an engine can run."""
    logger = get_run_logger()
    if (why := verifiable(comparison)) is not None:
        logger.warning("verify: not run: %s", why)
        return False
    schedule = await asyncio.to_thread(schedule_profile, spec.profile, comparison, host, spec.job.run_id)
    restart = decision.alternate_by == "restart"
    if not restart:  # three servers side by side
        schedule = schedule.model_copy(update={"port": max(base.profile.port, spec.profile.port) + 1})
    check_allowed(run.host, [schedule])
    key = f"{base.job.run_id}--{spec.job.run_id}"
    logger.info("verify: %s (%s) against always off and always on, at %s", schedule.name,
                comparison.setting.flags if comparison.setting else "", ", ".join(str(lv.concurrency)
                                                                                for lv in comparison.levels))
    arms = [ServerArm(run, host, await run.configuration(profile, host.label, verifies=(key, arm)))
            for profile, arm in zip((base.profile, spec.profile, schedule), verify.ARMS, strict=True)]
    levels = {lv.concurrency for lv in comparison.levels}
    points = [p for p in run.levels if p.mode == "concurrency" and int(p.value) in levels]
    more = verify.needs_more(decision, run.settings.sweep.num_requests, comparison.recommendation.speculation_off_from)
    await designs.in_turn(arms, points, more, restart=restart)
    return True
