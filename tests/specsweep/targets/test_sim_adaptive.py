"""The simulator's model of SGLang's documented adaptive controller (a model of the engine, not evidence about it)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from specsweep.targets.sim.adaptive import controller_from, unbounded_accepted
from tests.helpers.sim import running_sim


def test_the_documented_defaults_give_three_bands_starting_at_the_launch_steps() -> None:
    c = controller_from({}, initial_steps=3)
    assert [(b.lo, b.hi, b.steps) for b in c.bands] == [(1, 64, [1, 3, 7]), (64, 128, [1, 2, 5]),
                                                        (128, float("inf"), [1, 2, 6])]
    assert [c.steps_for(b) for b in (1, 63, 64, 127, 128, 4096)] == [3, 3, 2, 2, 2, 2]
    assert (c.ema_alpha, c.update_interval, c.warmup_batches, c.down_hysteresis, c.up_hysteresis) == (
        0.2, 5, 10, -0.25, 0.0)


def test_no_decision_before_warm_up_then_one_tier_per_interval() -> None:
    c = controller_from({}, initial_steps=3)
    for _ in range(9):  # nine batches where every draft is accepted: still warming up
        c.observe(8, 3, 3.0)
    assert c.steps_for(8) == 3
    c.observe(8, 3, 3.0)  # the tenth: the first decision
    assert c.steps_for(8) == 7
    for _ in range(4):  # low acceptance at 7, but the next decision is five batches on
        c.observe(8, 7, 0.1)
    assert c.steps_for(8) == 7
    c.observe(8, 7, 0.1)
    assert c.steps_for(8) == 3  # one tier at a time
    assert c.steps_for(100) == 2  # the other band did not move: its own average and tier


def test_hysteresis_holds_a_tier_on_steady_middling_acceptance() -> None:
    """p = 0.5 at 3 drafts accepts 0.875 per step: unbounded it would accept 1, neither above 3 nor under
    1 - 0.25, so the controller stays at 3 however long it runs."""
    assert unbounded_accepted(0.875, 3) == pytest.approx(1.0, abs=1e-6)
    c = controller_from({}, initial_steps=3)
    for _ in range(200):
        c.observe(4, 3, 0.875)
    assert c.steps_for(4) == 3 and c.changes == 0


@pytest.mark.parametrize(("config", "words"), [
    ({"ema_alpha": 0}, "ema_alpha must be a number in (0, 1]"),
    ({"candidate_steps": [0, 3]}, "candidate_steps must be a non-empty list of integers >= 1"),
    ({"batch_size_bands": [[1, 64, [1, 3]], [32, None, [1]]]}, "bands must be increasing and adjoining"),
    ({"ema_alpha": 0.2, "speed": 3}, "unknown adaptive config keys ['speed']"),
])
def test_a_bad_controller_config_is_refused_naming_the_key(config: dict, words: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        controller_from(config, initial_steps=3)


def _burst(url: str, prompt: str, n: int = 4) -> int:
    """``n`` requests at once, then the active tier the server reports."""
    def one(_: int) -> int:
        return httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 150, "ignore_eos": True},
                          timeout=30).status_code

    with ThreadPoolExecutor(n) as pool:
        assert list(pool.map(one, range(n))) == [200] * n
    return int(httpx.get(url + "/server_info").json()["internal_states"][0]["speculative_num_steps"])


def test_the_active_tier_follows_acceptance_as_it_shifts_and_is_read_at_server_info() -> None:
    """Code accepts 3.8 tokens per step, role-play 1.2: the controller climbs to 7 drafts on code, falls to 1 on
    role-play, and climbs again, each shift visible at /server_info."""
    with running_sim("--sim-profile", "tiny-fast", "--speculative-algorithm", "EAGLE3", "--speculative-adaptive",
                     "--sim-accept-rule", "def =3.8", "--sim-accept-rule", ".=1.2") as (url, _):
        assert httpx.get(url + "/server_info").json()["internal_states"][0]["speculative_num_steps"] == 3
        assert [_burst(url, p) for p in ("def f(x): code", "play a pirate", "def g(): code")] == [7, 1, 7]


def test_a_user_config_sets_its_own_tiers(tmp_path: Path) -> None:
    cfg = tmp_path / "adaptive.json"
    cfg.write_text(json.dumps({"candidate_steps": [2, 4], "warmup_batches": 0, "update_interval": 1}))
    with running_sim("--sim-profile", "tiny-fast", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2",
                     "--speculative-adaptive", "--speculative-adaptive-config", str(cfg),
                     "--sim-accept-rule", "def =3.8") as (url, proc):
        assert _burst(url, "def f(x): code") == 4
    assert "a model of SGLang's documented controller" in proc.stdout.read().decode()  # type: ignore[union-attr]


def test_a_bad_accept_rule_is_refused() -> None:
    with running_sim("--sim-accept-rule", "code=9", ready=False) as (_, proc):
        assert proc.wait(10) == 2
        assert "LENGTH must be between 1 and 4" in proc.stdout.read().decode()  # type: ignore[union-attr]
