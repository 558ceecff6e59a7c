"""The local llama.cpp target: generated models, the launcher, both presets, end to end."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest
from prefect import flow

from specsweep.bench.config import RequestSpec, SweepConfig, WorkloadConfig
from specsweep.engines.llamacpp import baseline as baseline_profile
from specsweep.engines.llamacpp import default_models_dir
from specsweep.engines.llamacpp import speculative as speculative_profile
from specsweep.hosts import LocalHost
from specsweep.parameters import LifecycleConfig
from specsweep.profiles import ServerProfile
from specsweep.records import Block, BlockRow
from specsweep.results import ResultsStore
from specsweep.sweep import SweepJob, measure_level
from specsweep.targets.llamacpp.models import ModelSpec, make_models
from tasks.server import kill_server, start_server, wait_for_health
from tests.conftest import pids_with_marker
from tests.helpers.processes import stop_process
from tests.helpers.sshd import free_port

#: Timing bounds and busy servers: these run when no other test does (scripts/test.sh).
pytestmark = pytest.mark.solo


def test_models_are_deterministic_and_cached(tmp_path: Path) -> None:
    spec = ModelSpec(n_embd=64, n_layer=2, n_ff=128, n_head=4, seed=7)
    a = make_models(tmp_path / "a", spec)
    b = make_models(tmp_path / "b", spec)
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert digest(a.target) == digest(b.target) and digest(a.draft) == digest(b.draft)
    assert a.draft_params < a.target_params
    mtime = a.target.stat().st_mtime_ns
    assert make_models(tmp_path / "a", spec).target.stat().st_mtime_ns == mtime  # reused, not rewritten
    c = make_models(tmp_path / "c", ModelSpec(n_embd=64, n_layer=2, n_ff=128, n_head=4, seed=8))
    assert digest(c.target) != digest(a.target)
    # Models an earlier version of the generator wrote (kept in the cache) are written again.
    meta = tmp_path / "a" / "spec.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "generation": -1}))
    assert make_models(tmp_path / "a", spec).target.stat().st_mtime_ns != mtime
    # A spec.json cut short (a run killed while writing it) is no reason to fail every later run: written again.
    meta.write_text('{"spec": {"n_embd": 6')
    assert make_models(tmp_path / "a", spec).target_params == a.target_params and json.loads(meta.read_text())


def test_the_local_targets_models_are_kept_in_the_users_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fresh clone reuses the models an earlier run wrote: they live in the user's cache, one folder per shape.
    monkeypatch.delenv("SPECSWEEP_MODELS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_models_dir() == tmp_path / "cache" / "specsweep" / "models"
    monkeypatch.setenv("SPECSWEEP_MODELS_DIR", str(tmp_path / "mine"))
    assert default_models_dir() == tmp_path / "mine"
    assert ModelSpec().digest() != ModelSpec(n_layer=12).digest() == ModelSpec(n_layer=12).digest()


async def stream_completion(port: int, prompt: str, max_tokens: int) -> tuple[str, int, int, dict]:  # type: ignore[type-arg]
    """One streamed request: text, content chunks, usage tokens, final timings."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    text, chunks, usage, timings = "", 0, -1, {}
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event.get("choices") and event["choices"][0].get("text"):
                    text += event["choices"][0]["text"]
                    chunks += 1
                if event.get("usage"):
                    usage = event["usage"]["completion_tokens"]
                timings = event.get("timings") or timings
    return text, chunks, usage, timings


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("preset", ["baseline", "speculative"])
async def test_preset_serves_exact_token_counts(preset: str, tmp_path: Path) -> None:
    port = free_port()
    profile: ServerProfile = baseline_profile(port=port, parallel=2, ctx=2048) if preset == "baseline" else \
        speculative_profile(port=port, parallel=2, ctx=2048, draft_max=4)
    host = LocalHost()

    @flow(name=f"llamacpp-{preset}")
    async def drive() -> tuple[str, int, int, dict, list[str], BlockRow]:  # type: ignore[type-arg]
        await kill_server(host, profile)
        async with start_server(host, profile, RequestSpec(), LifecycleConfig(), marker="llamacpp-test") as server:
            await wait_for_health(server)
            result = await stream_completion(port, "the water was cold and the river", 48)
            job = SweepJob(run_id="l", config_name=profile.name, store=ResultsStore(tmp_path),
                           workload=WorkloadConfig(output_len=48), sweep=SweepConfig(num_requests=8, warmup_requests=1))
            row = await measure_level(server.target, job, Block(index=0, mode="concurrency", value=2))
        assert server.killed is not None  # the final kill, as start_server's block ended
        return (*result, [k.signal for k in server.killed.killed], row)

    text, chunks, usage, timings, signals, row = await drive()
    assert usage == 48 and chunks == 48  # one SSE event per token, even with speculation
    assert text.strip()
    text.encode("utf-8")
    assert signals == ["SIGTERM"]  # the launcher exits on SIGTERM, no SIGKILL needed
    assert pids_with_marker(port) == []
    # The engine's own /metrics (the presets turn it on) around the level: its tokens are the level's,
    # its running batch was sampled while the level ran.
    assert row.engine_metrics == "/metrics" and row.engine_generation_tokens == row.output_tokens_total == 8 * 48
    assert row.engine_running_max is not None and 1 <= row.engine_running_max <= 2
    if preset == "speculative":
        assert timings["draft_n"] > 0 and 0.3 < timings["draft_n_accepted"] / timings["draft_n"] <= 1.0
        assert row.spec_drafts and row.spec_drafts > 0 and row.spec_acceptance_rate and 0.3 < row.spec_acceptance_rate <= 1
        per_pos = row.spec_acceptance_per_position
        assert per_pos is not None and len(per_pos) == 4 and per_pos == sorted(per_pos, reverse=True)
    else:
        assert timings.get("draft_n", 0) == 0
        assert not row.spec_drafts and row.spec_acceptance_per_position is None


def test_the_generated_models_read_english_in_about_as_many_tokens_as_a_real_tokenizer() -> None:
    """A prompt costs what it would on a real model: llama.cpp's own tokenizer (the server's /tokenize) splits
    this English into 1.5 tokens a word (a real model's tokenizer: about 1.3), not letter by letter (3.3 a word with
    the old vocabulary of whole words, whose prefixes were missing)."""
    import subprocess
    import time

    text = ("Write a short story about a lighthouse keeper who finds a message in a bottle, then explain in "
            "three sentences what the message means to the people of the town and why they kept it secret.")
    words = len(text.split())
    profile = baseline_profile(port=free_port(), parallel=1, ctx=512)
    proc = subprocess.Popen(profile.launch_argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, tokens = time.monotonic() + 60, None
        while tokens is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                r = httpx.post(f"http://127.0.0.1:{profile.port}/tokenize", json={"content": text, "with_pieces": True},
                               timeout=5)
                if r.status_code == 200:
                    tokens = r.json()["tokens"]
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)  # refused or 503 "Loading model": the model is still loading
        assert tokens is not None, f"the server never tokenized (exit code {proc.poll()})"
        pieces = [t["piece"] for t in tokens]
        assert words <= len(pieces) <= 1.6 * words, pieces
        assert "".join(pieces).replace("\u2581", " ").strip() == text  # nothing lost, no byte fallback
    finally:
        stop_process(proc)


def test_the_vocabulary_is_pieces_llama_cpp_can_reach() -> None:
    """Every piece of the kept vocabulary is two earlier ones joined (llama.cpp joins only pieces whose join is
    itself a piece: one that is not would never be used), each printable character is there alone and after a
    word boundary, none twice; a smaller vocabulary keeps the characters and the first-learned pieces."""
    from specsweep.targets.llamacpp.vocab import SPECIAL, pieces

    full = pieces(4096 - len(SPECIAL))
    assert len(full) == len(set(full)) == 4096 - len(SPECIAL)
    chars = ["\u2581", *(chr(c) for c in range(33, 127))]
    assert set(chars) | {"\u2581" + c for c in chars[1:]} <= set(full)
    seen: set[str] = set()
    for piece in full:
        assert len(piece) == 1 or any(piece[:i] in seen and piece[i:] in seen for i in range(1, len(piece))), piece
        seen.add(piece)
    assert {"\u2581the", "\u2581question", "ing"} <= set(full)  # common English, whole
    small = pieces(500)
    assert len(small) == 500 and small[:300] == full[:300] and set(chars) <= set(small)
    with pytest.raises(ValueError, match="vocab_size"):
        pieces(len(full) + 1)


def test_draft_model_alone_does_not_speculate() -> None:
    profile = speculative_profile()
    argv = profile.launch_argv()
    assert argv[argv.index("--spec-type") + 1] == "draft-simple" and "-md" in argv
    import xllamacpp

    from specsweep.targets.llamacpp.launcher import build_params, parse_args

    only_md = build_params(parse_args(["-m", argv[argv.index("-m") + 1], "-md", argv[argv.index("-md") + 1]]))
    assert only_md.speculative.types == [xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_NONE]
    with_type = build_params(parse_args(["-m", "t", "-md", "d", "--spec-type", "draft-simple"]))
    assert with_type.speculative.types == [xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]


def test_launcher_health_is_refused_then_loading_then_ok(tmp_path: Path) -> None:
    """As llama-server: connection refused, then 503 "Loading model", then 200 {"status":"ok"}; SIGTERM exits 0."""
    import signal
    import subprocess
    import time

    profile = baseline_profile(port=free_port(), parallel=1, ctx=512)
    proc = subprocess.Popen(profile.launch_argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: list[object] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                r = httpx.get(f"http://127.0.0.1:{profile.port}/health", timeout=2)
                seen.append(r.status_code)
                if r.status_code == 503:
                    assert "Loading model" in r.text
                if r.status_code == 200:
                    assert r.json() == {"status": "ok"}
                    break
            except httpx.ConnectError:
                seen.append("refused")
            time.sleep(0.002)
        states = [s for i, s in enumerate(seen) if i == 0 or seen[i - 1] != s]
        assert states[0] == "refused" and states[-1] == 200 and set(states) <= {"refused", 503, 200}, states
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
