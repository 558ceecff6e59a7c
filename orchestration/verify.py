"""The verify stage: the engine started with the setting the comparison recommends, measured at the
compared levels in turn with always off and always on (``specsweep.analysis.verify`` judges it).

The recommended setting is the speculative profile with the engine's own per-batch flags
(``specsweep.engines.base.with_setting``); a file the engine loads (SGLang's adaptive file) is written
first to a private file on the host. An engine without a per-batch switch runs it as ``specsweep route``
in front of the two fixed policies' servers (so the three arms are up side by side). Each arm is a run of
its own in the store (``verifies`` names the comparison, ``verify_arm`` the arm), so the comparison's runs
stay as they were, and a retried flow run keeps what the stage finished.

Where the engine has its own speculation controller (``Engine.controller``; ``decision.verify_controller``), a
fourth arm runs the speculative profile with it (``engines.controller_setting``: SGLang's
``--speculative-adaptive``, vLLM's adaptive verification), its config file written on the host as the
recommendation's is.
"""

from __future__ import annotations

import asyncio
import json
import sys

from prefect import get_run_logger

from orchestration.arms import ServerArm
from orchestration.blocks import check_allowed
from orchestration.run import Configuration, Run
from specsweep import designs, engines
from specsweep.analysis import verify
from specsweep.analysis.compare import Comparison
from specsweep.analysis.decision import DecisionConfig
from specsweep.analysis.recommend import level_words
from specsweep.engines.base import AS_RECOMMENDED, OWN_CONTROLLER, PerBatchSetting, split_command, with_setting
from specsweep.errors import ConfigError
from specsweep.hosts import Host
from specsweep.profiles import ServerProfile
from specsweep.records import BlockRow
from specsweep.route import MODULE as ROUTER
from specsweep.sweep import Level


def verifiable(comparison: Comparison) -> str | None:
    """Why the recommendation cannot be run by the engine, or None when it can (decided or the best available:
    every comparison names a setting)."""
    setting = comparison.setting
    if setting is None:
        return "the speculative configuration's launch command does not say how it speculates"
    if not setting.flags and setting.route_off_from is None:
        return " ".join(setting.notes) or f"{setting.engine} has no per-batch speculation switch"
    return None


def route_profile(base: ServerProfile, spec: ServerProfile, off_from: int, python: str, port: int) -> ServerProfile:
    """``specsweep route`` in front of the baseline's and the speculative configuration's servers, as a server of its
    own (started, waited for and killed as any other): the recommendation of an engine without a per-batch switch."""
    def upstream(p: ServerProfile) -> str:  # the router runs on the servers' host: their loopback reaches them
        return f"http://127.0.0.1:{p.port}"

    argv = [python, "-m", ROUTER, "--host", "{host}", "--port", "{port}", "--speculative", upstream(spec),
            "--baseline", upstream(base), "--off-from", str(off_from)]
    return spec.model_copy(update={"name": spec.name + AS_RECOMMENDED, "argv": argv, "port": port, "env": {},
                                   "env_secrets": {}, "private_tmp_env": [], "cwd": None, "cleanup_patterns": [],
                                   "readiness_probe": False, "kill_grace_s": 5.0})


def schedule_profile(spec: ServerProfile, comparison: Comparison, host: Host, run_id: str) -> ServerProfile:
    """The speculative profile started with the recommendation (its file written on the host first)."""
    setting = comparison.setting
    assert setting is not None and setting.flags is not None
    return setting_profile(spec, setting, host, run_id)


def setting_profile(spec: ServerProfile, setting: PerBatchSetting, host: Host, run_id: str,
                    suffix: str = AS_RECOMMENDED) -> ServerProfile:
    """The speculative profile started with a setting's flags (its file written on the host first)."""
    assert setting.flags is not None
    path = None
    if setting.file_name and setting.file_name in split_command(setting.flags):
        path = host.write_private_file(f"{run_id}-{setting.file_name}", json.dumps(setting.content).encode())
    return with_setting(spec, setting, path, suffix)


async def verify_recommendation(run: Run, host: Host, base: Configuration, spec: Configuration, comparison: Comparison,
                                decision: DecisionConfig, budget: designs.Budget | None = None) -> bool:
    """Measure the recommendation against both fixed policies. False (and a warning saying why) when the
    recommendation is not one an engine can run."""
    logger = get_run_logger()
    if (why := verifiable(comparison)) is not None:
        logger.warning("verify: not run: %s", why)
        return False
    if budget is not None and not budget.fits(0.0):
        logger.warning("verify: not run: the time budget (%.0f min) is spent", (budget.seconds or 0) / 60)
        return False
    setting = comparison.setting
    assert setting is not None
    restart = decision.alternate_by == "restart"
    port = max(base.profile.port, spec.profile.port) + 1
    if setting.route_off_from is not None:
        if restart:
            logger.info("verify: the router needs both servers up: the three arms run side by side")
            restart = False
        if base.profile.port == spec.profile.port:
            raise ConfigError("verify: the router needs the baseline and the speculative server up at once: give them "
                              "different ports (decision.alternate_by side-by-side does)")
        python = sys.executable if run.host.kind == "local" else run.host.host_python
        schedule = route_profile(base.profile, spec.profile, setting.route_off_from, python, port)
    else:
        schedule = await asyncio.to_thread(schedule_profile, spec.profile, comparison, host, spec.job.run_id)
        if not restart:  # three servers side by side
            schedule = schedule.model_copy(update={"port": port})
    profiles = [base.profile, spec.profile, schedule]
    names = list(verify.ARMS)
    if (own := engines.controller_setting(spec.profile, decision)) is not None:
        controller = await asyncio.to_thread(setting_profile, spec.profile, own, host, spec.job.run_id, OWN_CONTROLLER)
        engines.check_launch(controller, "decision.controller_config")
        if not restart:  # side by side with the others
            controller = controller.model_copy(update={"port": port + 1})
        profiles.append(controller)
        names.append(verify.CONTROLLER)
        logger.info("verify: the engine's own controller as a fourth arm: %s (%s)", controller.name, own.flags)
    check_allowed(run.host, profiles[2:])
    key = f"{base.job.run_id}--{spec.job.run_id}"
    logger.info("verify: %s (%s) against always off and always on, at %s", schedule.name,
                setting.flags or f"specsweep route --off-from {setting.route_off_from}",
                ", ".join(level_words(lv.concurrency) for lv in comparison.levels))
    # The router sends to the fixed policies' own servers: its prompts carry a mark of their own, or it would read
    # what they left in those servers' caches.
    routed = setting.route_off_from is not None
    arms = [ServerArm(run, host, await run.configuration(profile, host.label, verifies=(key, arm),
                                                         own_prompts=routed and arm == "schedule"))
            for profile, arm in zip(profiles, names, strict=True)]
    # The levels the answer rests on (a search's steering levels are not among them), in their own order.
    levels = sorted({lv.concurrency for lv in comparison.levels} - set(comparison.steering))
    points = [Level(i, comparison.mode, float(c)) for i, c in enumerate(levels)]  # its levels, in its mode
    settle = verify.needs_more(decision, run.settings.sweep.num_requests, comparison.recommendation.speculation_off_from)

    def more(clean: list[list[BlockRow]]) -> bool:
        if budget is not None and not budget.fits(0.0):
            logger.info("verify: the time budget is spent: the check stands as measured")
            return False
        return settle(clean)

    if restart:  # one server at a time: in turns of several blocks, a start per arm and round
        await designs.in_turns(arms, points, more)
    else:
        await designs.in_turn(arms, points, more, restart=False)
    return True
